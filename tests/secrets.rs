//! Secrets stay out of logs and error text, checked black-box: the daemon is started with a
//! broker URI whose password is a marker, and everything it prints is searched for the marker.

mod support;

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use support::broker::Daemon;

const PASSWORD: &str = "s3cr3t-broker-pw";

fn temp_dir(name: &str) -> std::path::PathBuf {
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("secrets-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs `silpgate run` with `url` as the broker URI until it has logged two failed connection
/// rounds or exited (or 20 s passed), and returns everything it printed.
fn output_of_a_daemon_with_broker(name: &str, url: &str) -> String {
    let dir = temp_dir(name);
    let config = dir.join("silpgate.toml");
    let text = format!(
        "[http]\nplain = true\n[amqp]\nurl = \"{url}\"\nreconnect_initial_ms = 50\nreconnect_max_ms = 100\n"
    );
    std::fs::write(&config, text).unwrap();
    let log = dir.join("log");
    let mut child = Command::new(env!("CARGO_BIN_EXE_silpgate"))
        .args(["run", "--listen", "127.0.0.1:0", "--config"])
        .arg(&config)
        .arg("--store")
        .arg(dir.join("store"))
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&log).unwrap())
        .stderr(std::fs::File::options().append(true).open(&log).unwrap())
        .spawn()
        .expect("silpgate runs");
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut text = String::new();
    let mut exited = false;
    while Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
        text.clear();
        std::fs::File::open(&log).unwrap().read_to_string(&mut text).unwrap();
        exited = child.try_wait().unwrap().is_some();
        if text.matches("No broker connection").count() >= 2 || exited {
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    // A URI that does not parse stops the daemon at start; one that parses but is refused is
    // retried and logged each round.
    assert!(
        exited || text.matches("No broker connection").count() >= 2,
        "neither a refusal at start nor two failed connection rounds logged within 20 s: {text}"
    );
    text
}

#[test]
fn a_broker_uri_is_never_logged_with_its_password() {
    // Without `//` the URI parser refuses it and quotes it whole in its error.
    let text = output_of_a_daemon_with_broker("no-slashes", &format!("amqp:guest:{PASSWORD}@127.0.0.1:5672"));
    assert!(!text.contains(PASSWORD), "the password was logged: {text}");
    assert!(text.contains("is not an AMQP URI"), "{text}");
    // A well-formed URI to a port nobody listens on: logged as host:port.
    let text = output_of_a_daemon_with_broker("refused", &format!("amqp://guest:{PASSWORD}@127.0.0.1:1/%2f"));
    assert!(!text.contains(PASSWORD), "the password was logged: {text}");
    assert!(text.contains("127.0.0.1:1"), "{text}");
}

/// The bearer token of a `tokens_env` variable.
const TOKEN: &str = "t0ken-marker-5ecret";

/// POSTs a small envelope to `/nlip` with `authorization`, if any: the status.
fn post_with(addr: &str, authorization: Option<&str>) -> u16 {
    let body = br#"{"format":"text","subformat":"english","content":"hello"}"#;
    let headers: Vec<String> = authorization.map(|a| format!("Authorization: {a}")).into_iter().collect();
    support::raw_http::post_nlip(addr, &headers, body)
}

/// A daemon without tokens says at start that its clients are not authenticated; one with a
/// `tokens_env` says nothing of the kind, and no line it logs, for requests with the token, a
/// wrong one or none, holds the token.
#[test]
fn open_doors_are_warned_about_and_tokens_are_never_logged() {
    let warning = "clients are not authenticated";
    let config = |dir: &std::path::Path, tokens: &str| {
        let path = dir.join("silpgate.toml");
        let text = format!(
            "[http]\nplain = true\nlisten = \"127.0.0.1:0\"\n{tokens}[store]\npath = \"{}\"\n",
            dir.join("store").display()
        );
        std::fs::write(&path, text).unwrap();
        path
    };
    let open_dir = temp_dir("tokens-off");
    let mut command = Command::new(env!("CARGO_BIN_EXE_silpgate"));
    command.args(["run", "--config"]).arg(config(&open_dir, ""));
    let open = Daemon::spawn(command);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !open.log_text().contains(warning) {
        assert!(Instant::now() < deadline, "no warning about open doors: {}", open.log_text());
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(open);

    let dir = temp_dir("tokens-on");
    let mut command = Command::new(env!("CARGO_BIN_EXE_silpgate"));
    command
        .args(["run", "--config"])
        .arg(config(&dir, "tokens_env = \"SILPGATE_TEST_SECRET_TOKENS\"\n"))
        .env("SILPGATE_TEST_SECRET_TOKENS", format!("other-token,{TOKEN}"));
    let daemon = Daemon::spawn(command);
    assert_ne!(post_with(&daemon.http, Some(&format!("Bearer {TOKEN}"))), 401, "the token is accepted");
    assert_eq!(post_with(&daemon.http, Some(&format!("Bearer {TOKEN}x"))), 403, "a wrong token is refused");
    assert_eq!(post_with(&daemon.http, None), 401, "no token is refused");
    let log = daemon.log.clone();
    let (status, _) = daemon.terminate(Duration::from_secs(30));
    assert!(status.success());
    let log = log.lock().unwrap().join("\n");
    assert!(!log.contains(warning), "doors with tokens are not open: {log}");
    assert!(!log.contains(TOKEN), "a token was logged: {log}");
    assert!(log.contains("listening on"), "the log was read: {log}");
}

/// At the most verbose log filter (`trace`, every crate's events), no line holds a static
/// token, a JWT or a JWT's signature, whatever the door and whether the token is good,
/// expired or forged.
#[test]
fn no_token_or_jwt_is_logged_even_at_trace() {
    use base64::Engine;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
    let dir = temp_dir("trace");
    let pair = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap();
    let jwk = serde_json::json!({"kty": "OKP", "crv": "Ed25519", "kid": "k1", "x": B64.encode(pair.public_key_raw())});
    std::fs::write(dir.join("keys.json"), serde_json::json!({"keys": [jwk]}).to_string()).unwrap();
    let config = dir.join("silpgate.toml");
    std::fs::write(
        &config,
        format!(
            "[telemetry]\nlog_filter = \"trace\"\n[http]\nplain = true\nlisten = \"127.0.0.1:0\"\n\
             [store]\npath = \"{}\"\n[auth]\njwks_file = \"{}\"\naudience = \"silpgate-test\"\n\
             [[auth.tokens]]\nsubject = \"robot\"\ntoken_env = \"SILPGATE_TEST_SECRET_TOKEN\"\n",
            dir.join("store").display(),
            dir.join("keys.json").display()
        ),
    )
    .unwrap();
    let key = jsonwebtoken::EncodingKey::from_ed_der(&pair.serialize_der());
    let jwt = |expires_in: i64| {
        let now = i64::try_from(jsonwebtoken::get_current_timestamp()).unwrap();
        let header = jsonwebtoken::Header {
            kid: Some("k1".into()),
            ..jsonwebtoken::Header::new(jsonwebtoken::Algorithm::EdDSA)
        };
        let claims = serde_json::json!({"sub": "alice", "aud": "silpgate-test", "exp": now + expires_in});
        jsonwebtoken::encode(&header, &claims, &key).unwrap()
    };
    let (good, expired) = (jwt(300), jwt(-600));
    let forged = format!("{}AAAA", &good[..good.len() - 4]);
    let mut command = Command::new(env!("CARGO_BIN_EXE_silpgate"));
    command.args(["run", "--config"]).arg(&config).env("SILPGATE_TEST_SECRET_TOKEN", TOKEN);
    let daemon = Daemon::spawn_as_configured(command);
    let nlip = br#"{"format":"text","subformat":"english","content":"hello"}"#;
    let a2a = br#"{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"message":{"messageId":"m","role":"ROLE_USER","parts":[{"text":"hi"}]}}}"#;
    let mcp = br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#;
    for (token, accepted) in
        [(TOKEN, true), (good.as_str(), true), (expired.as_str(), false), (forged.as_str(), false)]
    {
        let header = vec![format!("Authorization: Bearer {token}")];
        for (path, body) in [("/nlip", &nlip[..]), ("/a2a", &a2a[..]), ("/mcp", &mcp[..])] {
            let status = support::raw_http::post(&daemon.http, path, &header, body);
            assert_eq!(status != 401, accepted, "{path} with {token}: {status}");
        }
        use tokio_tungstenite::tungstenite::client::IntoClientRequest;
        let mut request = format!("ws://{}/nlip/ws/text", daemon.http).into_client_request().unwrap();
        request.headers_mut().insert("Authorization", format!("Bearer {token}").parse().unwrap());
        let upgraded = tokio_tungstenite::tungstenite::connect(request);
        assert_eq!(upgraded.is_ok(), accepted, "a WebSocket with {token}: {:?}", upgraded.err());
    }
    let log = daemon.log.clone();
    let (status, _) = daemon.terminate(Duration::from_secs(30));
    assert!(status.success());
    let log = log.lock().unwrap().join("\n");
    assert!(
        log.matches("A request's credentials were refused").count() >= 8,
        "each refusal is logged at debug: {}",
        &log[..log.len().min(2000)]
    );
    for (what, secret) in [
        ("the static token", TOKEN),
        ("a JWT", good.as_str()),
        ("a JWT's signature", good.rsplit('.').next().unwrap()),
        ("an expired JWT's signature", expired.rsplit('.').next().unwrap()),
        ("a forged JWT", forged.as_str()),
    ] {
        assert!(!log.contains(secret), "{what} was logged");
    }
}
