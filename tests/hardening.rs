//! The doors fail closed and stay bounded, attacked black-box: the daemon is started (as a
//! process where its start must fail, in process otherwise) and each test asserts the refusal
//! or the bound. Every wait has a limit and says what it was waiting for.

use serde_json::Value;
use silpgate::config::Config;
use silpgate::daemon::{self, Overrides};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const ROUTE: &str = r#"
[[routes]]
name = "back"
destination = "reply"
mode = "decode"
[http]
plain = true
"#;

fn temp_dir(name: &str) -> std::path::PathBuf {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("hardening-{name}-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

async fn start(http_extra: &str) -> SocketAddr {
    let config = Config::parse(&format!("{ROUTE}{http_extra}")).expect("test config");
    let overrides = Overrides {
        listen: Some("127.0.0.1:0".into()),
        store: Some(temp_dir("store")),
        ..Overrides::default()
    };
    let daemon = daemon::start(config, overrides).await.expect("daemon starts");
    let addr = daemon.local_addr().unwrap();
    tokio::spawn(daemon.serve(std::future::pending()));
    addr
}

/// Runs `silpgate run` with `http_extra` in its [http] section and `env` set, expecting it to
/// refuse to start: returns its stderr. A daemon that starts anyway fails the test.
fn refused_start(http_extra: &str, env: &[(&str, &str)], unset: &[&str]) -> String {
    let dir = temp_dir("refused");
    let config = dir.join("silpgate.toml");
    std::fs::write(&config, format!("{ROUTE}{http_extra}")).unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_silpgate"));
    command
        .args(["run", "--listen", "127.0.0.1:0", "--config"])
        .arg(&config)
        .arg("--store")
        .arg(dir.join("store"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    for (k, v) in env {
        command.env(k, v);
    }
    for k in unset {
        command.env_remove(k);
    }
    let mut child = command.spawn().expect("silpgate runs");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut stderr = String::new();
            std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
            assert!(!status.success(), "silpgate started and exited 0: {stderr}");
            assert!(!stderr.contains("listening on"), "silpgate listened before refusing: {stderr}");
            return stderr;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("silpgate did not refuse to start within 20 s (it serves without authentication)");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_token_variable_that_is_unset_empty_or_blank_stops_the_start() {
    let var = "SILPGATE_TEST_HARDENING_TOKENS";
    let named = format!("tokens_env = \"{var}\"\n");
    let unset = refused_start(&named, &[], &[var]);
    assert!(unset.contains(var) && unset.contains("not set"), "{unset}");
    let empty = refused_start(&named, &[(var, "")], &[]);
    assert!(empty.contains(var) && empty.contains("holds no token"), "{empty}");
    let blank_entry = refused_start(&named, &[(var, "good-token, ,other")], &[]);
    assert!(blank_entry.contains("token 2") && blank_entry.contains("blank"), "{blank_entry}");
    assert!(!blank_entry.contains("good-token"), "a token was echoed: {blank_entry}");
    let blank_configured = refused_start("tokens = [\" \"]\n", &[], &[]);
    assert!(blank_configured.contains("blank"), "{blank_configured}");
}

/// Reads until the server closes the connection; `None` when it is still open at `within`.
async fn closed_within(stream: &mut TcpStream, within: Duration) -> Option<Vec<u8>> {
    let mut got = Vec::new();
    let read = tokio::time::timeout(within, async {
        let mut buf = [0u8; 4096];
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    read.ok().map(|()| got)
}

#[tokio::test]
async fn headers_sent_byte_by_byte_are_cut_off_at_the_header_timeout() {
    let addr = start("header_timeout_secs = 1\n").await;
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let started = Instant::now();
    let trickle = async {
        for byte in
            b"POST /nlip HTTP/1.1\r\nHost: x\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa".iter()
        {
            if stream.write_all(&[*byte]).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(8), trickle).await;
    let closed = closed_within(&mut stream, Duration::from_secs(5)).await;
    assert!(closed.is_some(), "a client trickling headers is still connected after {:?}", started.elapsed());
    assert!(started.elapsed() < Duration::from_secs(8), "cut off only after {:?}", started.elapsed());
}

#[tokio::test]
async fn an_idle_connection_is_closed() {
    let addr = start("header_timeout_secs = 1\n").await;
    let mut silent = TcpStream::connect(addr).await.unwrap();
    assert!(
        closed_within(&mut silent, Duration::from_secs(5)).await.is_some(),
        "a connection that sent nothing is still open after 5 s"
    );
    // A kept-alive connection idling after one request is closed as well.
    let mut kept = TcpStream::connect(addr).await.unwrap();
    kept.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
    let answered = closed_within(&mut kept, Duration::from_secs(5)).await.expect("closed after idling");
    assert!(String::from_utf8_lossy(&answered).starts_with("HTTP/1.1 200"), "the request was answered first");
}

/// A door serving TLS with a fresh self-signed certificate for `localhost`, and a client that
/// trusts it.
async fn start_tls(http_extra: &str) -> (SocketAddr, tokio_rustls::TlsConnector) {
    let (addr, certificate) = start_tls_server(http_extra).await;
    (addr, tls_client(&certificate, rustls::DEFAULT_VERSIONS))
}

/// A daemon serving TLS with a fresh self-signed certificate for localhost, and that
/// certificate.
async fn start_tls_server(http_extra: &str) -> (SocketAddr, rustls::pki_types::CertificateDer<'static>) {
    let identity = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let dir = temp_dir("tls");
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    std::fs::write(&cert, identity.cert.pem()).unwrap();
    std::fs::write(&key, identity.signing_key.serialize_pem()).unwrap();
    let addr = start(&format!(
        "tls_cert = {:?}\ntls_key = {:?}\n{http_extra}",
        cert.display().to_string(),
        key.display().to_string()
    ))
    .await;
    (addr, identity.cert.der().clone())
}

/// A TLS client that trusts `certificate` and speaks `versions`.
fn tls_client(
    certificate: &rustls::pki_types::CertificateDer<'static>,
    versions: &[&'static rustls::SupportedProtocolVersion],
) -> tokio_rustls::TlsConnector {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(certificate.clone()).unwrap();
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let client = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(versions)
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    tokio_rustls::TlsConnector::from(std::sync::Arc::new(client))
}

/// `min_tls = "1.3"`: a client that speaks TLS 1.2 at most gets no handshake; one that speaks
/// 1.3 is served. By default 1.2 is served too.
#[tokio::test]
async fn min_tls_1_3_refuses_a_tls_1_2_client() {
    let (strict, certificate) = start_tls_server("min_tls = \"1.3\"\n").await;
    let tls12 = tls_client(&certificate, &[&rustls::version::TLS12]);
    let refused = get_tls(strict, &tls12, "/healthz").await;
    assert!(refused.is_err(), "a TLS 1.2 handshake succeeded: {refused:?}");
    let tls13 = tls_client(&certificate, &[&rustls::version::TLS13]);
    assert!(get_tls(strict, &tls13, "/healthz").await.unwrap().starts_with("HTTP/1.1 200"));
    let (default, certificate) = start_tls_server("").await;
    let tls12 = tls_client(&certificate, &[&rustls::version::TLS12]);
    assert!(
        get_tls(default, &tls12, "/healthz").await.unwrap().starts_with("HTTP/1.1 200"),
        "1.2 by default"
    );
}

/// `GET path` over TLS on a connection of its own: the whole answer, or why there is none.
async fn get_tls(addr: SocketAddr, tls: &tokio_rustls::TlsConnector, path: &str) -> Result<String, String> {
    let tcp = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let handshake = tokio::time::timeout(Duration::from_secs(5), tls.connect(name, tcp));
    let mut stream =
        handshake.await.map_err(|_| "no handshake within 5 s".to_owned())?.map_err(|e| e.to_string())?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.map_err(|e| e.to_string())?;
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut answer));
    read.await.map_err(|_| "no answer within 5 s".to_owned())?.map_err(|e| e.to_string())?;
    Ok(String::from_utf8_lossy(&answer).into_owned())
}

/// The cap under TLS: over it, the probes are still answered and other requests get the 503,
/// both over TLS; with the probe slots taken too, a connection is closed before its handshake
/// (nothing can be written to a TLS client before one), at once rather than left hanging.
#[tokio::test]
async fn the_connection_cap_holds_under_tls_too() {
    let (addr, tls) = start_tls("max_connections = 2\nhandshake_timeout_secs = 30\n").await;
    assert!(get_tls(addr, &tls, "/healthz").await.unwrap().starts_with("HTTP/1.1 200"), "under the cap");
    // Connections that never shake hands hold their slots for the 30 s handshake timeout.
    let mut idle = Vec::new();
    for _ in 0..2 {
        idle.push(TcpStream::connect(addr).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let alive = get_tls(addr, &tls, "/healthz").await.expect("the probe is answered over the cap");
    assert!(alive.starts_with("HTTP/1.1 200"), "{alive}");
    let refused = get_tls(addr, &tls, "/metrics").await.expect("the refusal arrives over TLS");
    assert!(refused.starts_with("HTTP/1.1 503"), "{refused}");
    assert!(refused.contains("\"unavailable\""), "{refused}");
    let mut probes = Vec::new();
    for _ in 0..8 {
        probes.push(TcpStream::connect(addr).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let closed = get_tls(addr, &tls, "/healthz").await;
    let Err(why) = closed else { panic!("past every slot a TLS connection is served: {closed:?}") };
    assert!(!why.contains("within 5 s"), "closed at once, not left hanging: {why}");
    drop((idle, probes));
}

#[tokio::test]
async fn a_tls_handshake_that_never_comes_is_cut_off() {
    let (addr, _) = start_tls("handshake_timeout_secs = 1\n").await;
    let mut silent = TcpStream::connect(addr).await.unwrap();
    assert!(
        closed_within(&mut silent, Duration::from_secs(5)).await.is_some(),
        "a TLS connection without a handshake is still open after 5 s"
    );
}

async fn healthz(addr: SocketAddr) -> Option<String> {
    let mut stream = TcpStream::connect(addr).await.ok()?;
    stream.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await.ok()?;
    closed_within(&mut stream, Duration::from_secs(5)).await.map(|b| String::from_utf8_lossy(&b).into_owned())
}

async fn get_path(addr: SocketAddr, path: &str) -> Option<String> {
    let mut stream = TcpStream::connect(addr).await.ok()?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    closed_within(&mut stream, Duration::from_secs(5)).await.map(|b| String::from_utf8_lossy(&b).into_owned())
}

/// Over the cap, the probes still answer (a few slots are kept for them) and everything else
/// is refused with a clear 503; once those slots are taken too, the refusal comes at once.
#[tokio::test]
async fn connections_over_the_cap_are_refused_with_a_clear_503_and_probes_still_answer() {
    let addr = start("max_connections = 4\nheader_timeout_secs = 30\n").await;
    let mut idle = Vec::new();
    for _ in 0..4 {
        idle.push(TcpStream::connect(addr).await.unwrap());
    }
    // The accept loop takes them in order: give it a moment to hold all four.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let alive = healthz(addr).await.expect("the probe is answered over the cap");
    assert!(alive.starts_with("HTTP/1.1 200"), "{alive}");
    let refused = get_path(addr, "/metrics").await.expect("the refusal arrives and the connection closes");
    assert!(refused.starts_with("HTTP/1.1 503"), "{refused}");
    let body: Value = serde_json::from_str(refused.split("\r\n\r\n").nth(1).unwrap()).unwrap();
    assert_eq!(body["submessages"][0]["content"]["code"], "unavailable", "{body}");
    // The probe slots taken too (8, silent): the next connection is refused before a request.
    let mut probes = Vec::new();
    for _ in 0..8 {
        probes.push(TcpStream::connect(addr).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let refused = healthz(addr).await.expect("the refusal arrives and the connection closes");
    assert!(refused.starts_with("HTTP/1.1 503"), "{refused}");
    drop(probes);
    // A slot frees when a connection closes; the door serves again.
    drop(idle.pop());
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let answer = healthz(addr).await.unwrap_or_default();
        if answer.starts_with("HTTP/1.1 200") {
            break;
        }
        assert!(Instant::now() < deadline, "no slot came back after a connection closed: {answer}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn post(addr: SocketAddr, authorization: &str) -> u16 {
    let body = r#"{"format":"text","subformat":"english","content":"hello"}"#;
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let request = format!(
        "POST /nlip HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nAuthorization: {authorization}\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let raw = closed_within(&mut stream, Duration::from_secs(5)).await.expect("an answer");
    let head = String::from_utf8_lossy(&raw);
    head.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("no status: {head}"))
}

// One token per hour refills: the burst is all a client gets during the test.
const LIMITED: &str = "tokens = [\"s3cret\"]\nclient_rate = 0.0003\nclient_burst = 3\n";

#[tokio::test]
async fn spelling_a_token_differently_buys_no_fresh_rate_limit() {
    let addr = start(LIMITED).await;
    let spellings = ["Bearer s3cret", "bearer s3cret", "BEARER  s3cret", "Bearer s3cret ", "bEaReR s3cret"];
    let mut statuses = Vec::new();
    for spelling in spellings {
        statuses.push(post(addr, spelling).await);
    }
    assert_eq!(statuses, [200, 200, 200, 429, 429], "one identity, one bucket of 3");
}

#[tokio::test]
async fn guessing_tokens_is_rate_limited() {
    let addr = start(LIMITED).await;
    let mut statuses = Vec::new();
    for guess in 0..5 {
        statuses.push(post(addr, &format!("Bearer guess-{guess}")).await);
    }
    assert_eq!(statuses, [403, 403, 403, 429, 429]);
}

async fn post_in(addr: SocketAddr, conversation: &str) -> (u16, Value) {
    let body = format!(
        r#"{{"format":"text","subformat":"english","content":"hello","submessages":[{{"format":"token","subformat":"conversation","content":"{conversation}"}}]}}"#
    );
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let request = format!(
        "POST /nlip HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let raw = closed_within(&mut stream, Duration::from_secs(5)).await.expect("an answer");
    let text = String::from_utf8_lossy(&raw).into_owned();
    let status = text.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or_default();
    let body =
        text.split("\r\n\r\n").nth(1).and_then(|b| serde_json::from_str(b).ok()).unwrap_or(Value::Null);
    (status, body)
}

#[tokio::test]
async fn one_client_cannot_open_more_than_its_share_of_conversations() {
    let addr = start("max_conversations_per_client = 3\nclient_rate = 0.0\n").await;
    for c in 0..3 {
        let (status, body) = post_in(addr, &format!("mine-{c}")).await;
        assert_eq!(status, 200, "conversation {c}: {body}");
    }
    let (status, body) = post_in(addr, "one-too-many").await;
    assert_eq!(status, 429, "{body}");
    assert_eq!(body["submessages"][0]["content"]["code"], "too_many_conversations", "{body}");
    let (status, _) = post_in(addr, "mine-1").await;
    assert_eq!(status, 200, "the client's own conversations go on");
}

/// The status of a GET: read up to the end of the response head (an upgraded connection stays
/// open), within a bound.
async fn get(addr: SocketAddr, path: &str, headers: &str) -> u16 {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\n{headers}\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut head = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), async {
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") && stream.read(&mut byte).await.is_ok_and(|n| n == 1) {
            head.push(byte[0]);
        }
    })
    .await;
    assert!(read.is_ok(), "no answer to GET {path} within 5 s");
    String::from_utf8_lossy(&head).split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or_default()
}

#[tokio::test]
async fn metrics_ask_for_a_token_when_told_to() {
    let open = start("tokens = [\"s3cret\"]\n").await;
    assert_eq!(get(open, "/metrics", "").await, 200, "scrapers need no token by default");
    let closed = start("tokens = [\"s3cret\"]\nobservability_tokens = true\n").await;
    assert_eq!(get(closed, "/metrics", "").await, 401);
    assert_eq!(get(closed, "/cluster", "").await, 401);
    assert_eq!(get(closed, "/metrics", "Authorization: Bearer s3cret\r\n").await, 200);
}

#[tokio::test]
async fn a_web_page_of_another_origin_cannot_open_a_socket() {
    let addr = start("allowed_origins = [\"https://app.example.com\"]\n").await;
    let upgrade = "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n";
    assert_eq!(get(addr, "/nlip/ws/text", upgrade).await, 101, "a program sends no Origin");
    let page = format!("{upgrade}Origin: https://evil.example\r\n");
    assert_eq!(get(addr, "/nlip/ws/text", &page).await, 403, "a page of another origin is refused");
    let app = format!("{upgrade}Origin: https://app.example.com\r\n");
    assert_eq!(get(addr, "/nlip/ws/text", &app).await, 101, "an allowed origin is served");
}

/// A page that rebinds its own name to this machine posts to `/nlip` with its own `Origin`:
/// refused 403 `forbidden` before anything is read, as the WebSocket is; programs (no
/// `Origin`), pages of this machine and listed origins are served.
#[tokio::test]
async fn a_web_page_of_another_origin_cannot_post_nlip() {
    let addr = start("allowed_origins = [\"https://app.example.com\"]\n").await;
    let post = |origin: Option<&'static str>| async move {
        let body = r#"{"format":"text","subformat":"english","content":"hello"}"#;
        let origin = origin.map(|o| format!("Origin: {o}\r\n")).unwrap_or_default();
        let mut stream = TcpStream::connect(addr).await.unwrap();
        let request = format!(
            "POST /nlip HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{origin}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        stream.write_all(request.as_bytes()).await.unwrap();
        let raw = closed_within(&mut stream, Duration::from_secs(5)).await.expect("an answer");
        let text = String::from_utf8_lossy(&raw).into_owned();
        let status: u16 = text.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or_default();
        (status, text)
    };
    let (status, text) = post(Some("http://rebound.example:8787")).await;
    assert_eq!(status, 403, "{text}");
    assert!(text.contains(r#""code":"forbidden""#) && text.contains("http.allowed_origins"), "{text}");
    for origin in [None, Some("http://localhost:5173"), Some("https://app.example.com")] {
        let (status, text) = post(origin).await;
        assert_eq!(status, 200, "{origin:?}: {text}");
    }
}

#[test]
fn the_store_directory_is_the_owners_alone() {
    use std::os::unix::fs::PermissionsExt;
    let dir = temp_dir("private").join("store");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let store = silpgate::store::SledStore::open(&dir, None).expect("the store opens");
    let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700, "the store directory is {mode:o}");
    drop(store);
}

async fn post_from(addr: SocketAddr, forwarded_for: &str) -> u16 {
    let body = r#"{"format":"text","subformat":"english","content":"hello"}"#;
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let request = format!(
        "POST /nlip HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nX-Forwarded-For: {forwarded_for}\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let raw = closed_within(&mut stream, Duration::from_secs(5)).await.expect("an answer");
    String::from_utf8_lossy(&raw).split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or_default()
}

#[tokio::test]
async fn behind_a_trusted_proxy_each_client_has_its_own_limit_and_elsewhere_the_header_is_ignored() {
    let limited = "client_rate = 0.0003\nclient_burst = 2\n";
    let proxied = start(&format!("{limited}trusted_proxies = [\"127.0.0.1\"]\n")).await;
    let a: Vec<u16> = futures_util::future::join_all((0..3).map(|_| post_from(proxied, "203.0.113.7"))).await;
    assert_eq!(a.iter().filter(|&&s| s == 429).count(), 1, "client A: a burst of 2 ({a:?})");
    assert_eq!(post_from(proxied, "198.51.100.9, 127.0.0.1").await, 200, "client B has its own bucket");
    // Without trusted proxies the header is the client's own claim, and changes nothing.
    let direct = start(limited).await;
    let spoofed: Vec<u16> = futures_util::future::join_all(
        ["192.0.2.1", "192.0.2.2", "192.0.2.3"].map(|ip| post_from(direct, ip)),
    )
    .await;
    assert_eq!(spoofed.iter().filter(|&&s| s == 429).count(), 1, "one address, one bucket: {spoofed:?}");
}

/// Eight clients announcing a 1 MB body and sending a byte a second hold every connection of
/// a house of eight: `/healthz` still answers (a probe slot), each dribbler is answered 408
/// `timeout` once `http.body_timeout_secs` has passed and its connection closed, and the door
/// then serves again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_that_dribble_are_cut_and_the_probes_answer_meanwhile() {
    let addr = start("max_connections = 8\nbody_timeout_secs = 2\n").await;
    let mut dribblers = Vec::new();
    for _ in 0..8 {
        dribblers.push(tokio::spawn(async move {
            let mut stream = TcpStream::connect(addr).await.unwrap();
            let head = "POST /nlip HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000000\r\n\r\n";
            stream.write_all(head.as_bytes()).await.unwrap();
            let started = Instant::now();
            let mut got = Vec::new();
            let mut buf = [0u8; 4096];
            loop {
                // One byte a second, while reading whatever the server says.
                let _ = stream.write_all(b" ").await;
                match tokio::time::timeout(Duration::from_secs(1), stream.read(&mut buf)).await {
                    Ok(Ok(0)) | Ok(Err(_)) => break,
                    Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
                    Err(_) => {}
                }
                if started.elapsed() > Duration::from_secs(20) {
                    break;
                }
            }
            (started.elapsed(), String::from_utf8_lossy(&got).into_owned())
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let alive = healthz(addr).await.expect("the probe is answered while the house is full");
    assert!(alive.starts_with("HTTP/1.1 200"), "{alive}");
    for dribbler in dribblers {
        let (took, said) = dribbler.await.unwrap();
        assert!(said.starts_with("HTTP/1.1 408"), "cut with 408: {said}");
        assert!(said.contains("\"timeout\""), "{said}");
        assert!(took < Duration::from_secs(8), "cut near the 2 s body timeout: {took:?}");
    }
    assert_eq!(post(addr, "Bearer none").await, 200, "the door serves again");
}
