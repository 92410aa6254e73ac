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
