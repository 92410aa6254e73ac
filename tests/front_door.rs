//! The daemon's front door against real clients: a raw HTTP/1.1 client and tokio-tungstenite,
//! on an ephemeral port, with a real sled store.

use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use silpgate::config::Config;
use silpgate::daemon::{self, Overrides};
use silpgate::nlip::{self, Encoding};
use std::net::SocketAddr;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::Message as Frame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;

const CONFIG: &str = r#"
[sessions]
heartbeat = 9999
[[agents]]
name = "planner"
frontends = ["code"]
[[routes]]
name = "decode-back"
destination = "reply"
mode = "decode"
[routes.match]
label = "decode"
[[routes]]
name = "encode-back"
destination = "reply"
mode = "encode"
frontend = "code"
[routes.match]
label = "encode"
[[routes]]
name = "to-planner"
destination = "planner"
mode = "encode"
[routes.match]
label = "planner"
[http]
plain = true
ws_ping_secs = 1
"#;

async fn start(extra: &str) -> SocketAddr {
    let config = Config::parse(&format!("{CONFIG}{extra}")).expect("test config");
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "front-{}-{}",
        std::process::id(),
        rand_suffix()
    ));
    let overrides =
        Overrides { listen: Some("127.0.0.1:0".into()), store: Some(dir), ..Overrides::default() };
    let daemon = daemon::start(config, overrides).await.expect("daemon starts");
    let addr = daemon.local_addr().unwrap();
    tokio::spawn(daemon.serve(std::future::pending()));
    addr
}

fn rand_suffix() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

struct Response {
    status: u16,
    headers: String,
    body: Vec<u8>,
}

impl Response {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }
}

/// One request on a fresh connection, read until the server closes it.
async fn http(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Response {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).await.unwrap();
    let _ = stream.write_all(body).await;
    let mut raw = Vec::new();
    let read = tokio::time::timeout(std::time::Duration::from_secs(30), stream.read_to_end(&mut raw)).await;
    assert!(read.is_ok(), "no complete answer to {method} {path} within 30 s");
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").expect("a complete response");
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    Response { status, headers: head, body: raw[split + 4..].to_vec() }
}

/// The next data or close frame; the server's pings are answered by the client and skipped.
async fn next_frame<S>(ws: &mut tokio_tungstenite::WebSocketStream<S>) -> Option<Frame>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    loop {
        let next = tokio::time::timeout(std::time::Duration::from_secs(30), ws.next()).await;
        match next.expect("a frame within 30 s")? {
            Ok(Frame::Ping(_) | Frame::Pong(_)) => continue,
            Ok(frame) => return Some(frame),
            Err(_) => return None,
        }
    }
}

async fn post_json(addr: SocketAddr, body: &Value) -> Response {
    http(addr, "POST", "/nlip", &[("Content-Type", "application/json")], body.to_string().as_bytes()).await
}

fn silp_code(code: &str, label: &str) -> Value {
    json!({"format":"structured","subformat":"silp-code","content":code,"label":label,
           "submessages":[{"format":"token","subformat":"conversation","content":"conv-1"},
                          {"format":"token","subformat":"authentication_idp","content":"a-1"}]})
}

#[tokio::test]
async fn http_answers_json_and_cbor_on_both_paths() {
    let addr = start("").await;
    let r = post_json(addr, &silp_code("if disk>90%: switch(backup_mode)", "decode")).await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert!(r.headers.to_ascii_lowercase().contains("content-type: application/json"));
    let reply = r.json();
    assert_eq!(reply["subformat"], "silp-ir");
    assert_eq!(reply["content"]["constraints"][0]["value"], "90%");
    let tokens: Vec<&str> =
        reply["submessages"].as_array().unwrap().iter().map(|s| s["subformat"].as_str().unwrap()).collect();
    assert_eq!(tokens, ["conversation", "authentication_idp"]);

    let message = nlip::decode(
        silp_code("cancel(flight)", "decode").to_string().as_bytes(),
        Encoding::Json,
        &Default::default(),
    )
    .unwrap();
    let cbor = nlip::encode(&message, Encoding::Cbor);
    let r = http(addr, "POST", "/nlip/", &[("Content-Type", "application/cbor")], &cbor).await;
    assert_eq!(r.status, 200);
    assert!(r.headers.to_ascii_lowercase().contains("content-type: application/cbor"));
    let reply = nlip::decode(&r.body, Encoding::Cbor, &Default::default()).unwrap();
    assert_eq!(reply.subformat, "silp-ir");

    let r = post_json(addr, &json!({"format":"structured","subformat":"silp-ir","label":"encode","content":
        {"intent":"!START","entities":[{"id":"act","value":"hike"}],"constraints":[{"type":"!rain","value":"true","time":"t+1"}],"meta":{"req_id":"abcd"}}})).await;
    assert_eq!(r.json()["content"], "if !rain(t+1): start(hike)");

    let ping = json!({"messagetype":"control","format":"text","subformat":"english","content":"//ping",
        "submessages":[{"format":"structured","subformat":"json","content":{"silp":"v1","frontends":["json","code"]}}]});
    let r = post_json(addr, &ping).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["content"]["preferred"], "json");
}

#[tokio::test]
async fn every_error_path_gets_its_status_and_an_nlip_error() {
    let addr = start("").await;
    let code_of = |r: &Response| r.json()["submessages"][0]["content"]["code"].as_str().unwrap().to_owned();

    let r = http(addr, "POST", "/nlip", &[("Content-Type", "text/plain")], b"hello").await;
    assert_eq!((r.status, code_of(&r).as_str()), (415, "unsupported_media_type"));
    let r =
        http(addr, "POST", "/nlip", &[("Content-Type", "application/json")], br#"{"format":"text","subf"#)
            .await;
    assert_eq!((r.status, code_of(&r).as_str()), (400, "invalid_encoding"));
    let r = http(
        addr,
        "POST",
        "/nlip",
        &[("Content-Type", "application/json")],
        b"{\"format\":\"text\",\"subformat\":\"en\",\"content\":\"\xff\xfe\"}",
    )
    .await;
    assert_eq!((r.status, code_of(&r).as_str()), (400, "invalid_encoding"));
    let r =
        http(addr, "POST", "/nlip", &[("Content-Type", "application/cbor")], &[0xff, 0x13, 0x00, 0x9c]).await;
    assert_eq!(r.status, 400);
    let cbor_error =
        nlip::decode(&r.body, Encoding::Cbor, &Default::default()).expect("a CBOR error message");
    assert!(cbor_error.is_error());
    // ECMA-432 §11, as the socket says it: every door answers unreadable input the same way.
    assert!(
        format!("{cbor_error:?}").contains("CBOR decoding failed. Fallback to text recommended."),
        "{cbor_error:?}"
    );
    let big = vec![b' '; 10 * 1024 * 1024];
    let r = http(addr, "POST", "/nlip", &[("Content-Type", "application/json")], &big).await;
    assert_eq!((r.status, code_of(&r).as_str()), (413, "too_large"));
    let deep = format!(
        r#"{{"format":"structured","subformat":"json","content":{}1{}}}"#,
        "[".repeat(100),
        "]".repeat(100)
    );
    let r = http(addr, "POST", "/nlip", &[("Content-Type", "application/json")], deep.as_bytes()).await;
    assert_eq!((r.status, code_of(&r).as_str()), (400, "too_complex"));
    let r = post_json(addr, &json!({"format":"text","content":"no subformat"})).await;
    assert_eq!((r.status, code_of(&r).as_str()), (400, "invalid_envelope"));
    assert_eq!(r.json()["submessages"][0]["content"]["path"], "subformat");
    let r = post_json(addr, &silp_code("if rain > : cancel(x)", "decode")).await;
    assert_eq!((r.status, code_of(&r).as_str()), (400, "invalid_syntax"));
    let r =
        post_json(addr, &json!({"format":"text","subformat":"english","content":"nobody routes me"})).await;
    assert_eq!((r.status, code_of(&r).as_str()), (404, "no_route"));
    let r = post_json(addr, &silp_code("book(hotel)", "planner")).await;
    assert_eq!((r.status, code_of(&r).as_str()), (503, "unavailable"));
    let r = http(addr, "GET", "/elsewhere", &[], b"").await;
    assert_eq!(r.status, 404);
    // And it still serves.
    assert_eq!(http(addr, "GET", "/healthz", &[], b"").await.status, 200);
    assert_eq!(http(addr, "GET", "/readyz", &[], b"").await.status, 200);
}

#[tokio::test]
async fn bearer_tokens_are_required_when_configured() {
    let addr = start("tokens = [\"s3cret\"]\n").await;
    let body = silp_code("cancel(x)", "decode").to_string();
    let r = http(addr, "POST", "/nlip", &[("Content-Type", "application/json")], body.as_bytes()).await;
    assert_eq!(r.status, 401);
    assert_eq!(r.json()["submessages"][0]["content"]["code"], "unauthorized");
    let r = http(
        addr,
        "POST",
        "/nlip",
        &[("Content-Type", "application/json"), ("Authorization", "Bearer wrong")],
        body.as_bytes(),
    )
    .await;
    assert_eq!(r.status, 403);
    let r = http(
        addr,
        "POST",
        "/nlip",
        &[("Content-Type", "application/json"), ("Authorization", "Bearer s3cret")],
        body.as_bytes(),
    )
    .await;
    assert_eq!(r.status, 200);
    let refused = tokio_tungstenite::connect_async(format!("ws://{addr}/nlip/ws")).await;
    assert!(refused.is_err(), "the upgrade is refused without a token");
}

#[tokio::test]
async fn websocket_cbor_and_text_answer_in_order() {
    let addr = start("").await;
    let (mut cbor, _) = tokio_tungstenite::connect_async(format!("ws://{addr}/nlip/ws")).await.unwrap();
    let message = nlip::decode(
        silp_code("cancel(flight)", "decode").to_string().as_bytes(),
        Encoding::Json,
        &Default::default(),
    )
    .unwrap();
    cbor.send(Frame::Binary(nlip::encode(&message, Encoding::Cbor).into())).await.unwrap();
    let Some(Frame::Binary(reply)) = next_frame(&mut cbor).await else { panic!("a binary reply") };
    assert_eq!(nlip::decode(&reply, Encoding::Cbor, &Default::default()).unwrap().subformat, "silp-ir");

    // CBOR garbage: the ECMA-432 §11 answer, and the socket stays open.
    cbor.send(Frame::Binary(vec![0xff, 0x00, 0x13].into())).await.unwrap();
    let Some(Frame::Binary(reply)) = next_frame(&mut cbor).await else { panic!("an error reply") };
    let error = nlip::decode(&reply, Encoding::Cbor, &Default::default()).unwrap();
    assert!(
        error.is_error()
            && error
                .content
                .as_str()
                .unwrap()
                .contains("CBOR decoding failed. Fallback to text recommended.")
    );
    cbor.send(Frame::Binary(nlip::encode(&message, Encoding::Cbor).into())).await.unwrap();
    assert!(matches!(next_frame(&mut cbor).await, Some(Frame::Binary(_))));

    // 1,000 pipelined messages on one text socket come back in order.
    let (mut text, _) = tokio_tungstenite::connect_async(format!("ws://{addr}/nlip/ws/text")).await.unwrap();
    for i in 0..1000 {
        let body = silp_code(&format!("cancel(item{i})"), "decode").to_string();
        text.feed(Frame::Text(body.into())).await.unwrap();
    }
    text.flush().await.unwrap();
    for i in 0..1000 {
        let Some(Frame::Text(reply)) = next_frame(&mut text).await else { panic!("reply {i}") };
        let reply: Value = serde_json::from_str(&reply).unwrap();
        assert_eq!(reply["content"]["entities"][0]["value"], format!("item{i}"), "reply {i} out of order");
    }
}

#[tokio::test]
async fn protocol_errors_close_with_the_right_code() {
    let addr = start("[nlip]\nmax_message_bytes = 4096\n").await;
    let (mut cbor, _) = tokio_tungstenite::connect_async(format!("ws://{addr}/nlip/ws")).await.unwrap();
    cbor.send(Frame::Text("{}".into())).await.unwrap();
    let Some(Frame::Close(Some(frame))) = next_frame(&mut cbor).await else { panic!("a close frame") };
    assert_eq!(frame.code, CloseCode::Unsupported);

    let (mut text, _) = tokio_tungstenite::connect_async(format!("ws://{addr}/nlip/ws/text")).await.unwrap();
    text.send(Frame::Binary(vec![1, 2, 3].into())).await.unwrap();
    let Some(Frame::Close(Some(frame))) = next_frame(&mut text).await else { panic!("a close frame") };
    assert_eq!(frame.code, CloseCode::Unsupported);

    let (mut big, _) = tokio_tungstenite::connect_async(format!("ws://{addr}/nlip/ws/text")).await.unwrap();
    big.send(Frame::Text("x".repeat(10_000).into())).await.unwrap();
    let Some(Frame::Close(Some(frame))) = next_frame(&mut big).await else { panic!("a close frame") };
    assert_eq!(frame.code, CloseCode::Size);
}

#[tokio::test]
async fn two_hundred_sockets_at_once_share_sessions_by_conversation() {
    let addr = start("").await;
    let mut tasks = Vec::new();
    for i in 0..200 {
        tasks.push(tokio::spawn(async move {
            let (mut ws, _) = tokio_tungstenite::connect_async(format!("ws://{addr}/nlip/ws/text")).await.unwrap();
            let body = json!({"format":"structured","subformat":"silp-code","content":format!("cancel(s{i})"),"label":"decode",
                "submessages":[{"format":"token","subformat":"conversation","content":format!("shared-{}", i % 2)}]});
            ws.send(Frame::Text(body.to_string().into())).await.unwrap();
            let Some(Frame::Text(reply)) = next_frame(&mut ws).await else { panic!("socket {i}: no reply") };
            let reply: Value = serde_json::from_str(&reply).unwrap();
            (i % 2, reply["content"]["meta"]["session_id"].as_str().unwrap().to_owned())
        }));
    }
    let mut ids = [None, None];
    for t in tasks {
        let (conversation, id) = t.await.unwrap();
        let seen = ids[conversation].get_or_insert_with(|| id.clone());
        assert_eq!(*seen, id, "one conversation, one session id across sockets");
    }
    assert_ne!(ids[0], ids[1]);
}

#[test]
fn silpgate_run_serves_and_stops_cleanly_on_sigterm() {
    run_then_sigterm("served", true);
}

/// The banner promises a daemon that stops cleanly: a SIGTERM sent the moment it is printed
/// finds the handler installed (no death by the signal's default action).
#[test]
fn silpgate_run_stops_cleanly_on_a_sigterm_sent_as_soon_as_it_says_it_listens() {
    run_then_sigterm("at-once", false);
}

/// Runs `silpgate run` on its shipped configuration, waits for its banner, asks `/healthz` when
/// `ask_health`, then sends SIGTERM and asserts a clean exit.
fn run_then_sigterm(name: &str, ask_health: bool) {
    use std::io::{BufRead, BufReader};
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("run-{name}-{}", std::process::id()));
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_silpgate"))
        .args([
            "run",
            "--config",
            concat!(env!("CARGO_MANIFEST_DIR"), "/config/silpgate.toml"),
            "--listen",
            "127.0.0.1:0",
            "--store",
        ])
        .arg(&dir)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("silpgate run starts");
    // Killed if the test fails before it stops the daemon itself: a failure never leaves it
    // running (nor holding the test runner's output open).
    struct Reaped(std::process::Child);
    impl Drop for Reaped {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let stderr = child.stderr.take().unwrap();
    let mut child = Reaped(child);
    // Read off the runtime: the banner comes after any start-up warnings, within a bound.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(addr) = line.split("listening on http://").nth(1) {
                let _ = tx.send(addr.split_whitespace().next().unwrap_or_default().to_owned());
            }
        }
    });
    let banner = rx.recv_timeout(std::time::Duration::from_secs(30)).expect("silpgate reports its address");
    let addr: SocketAddr = banner.parse().unwrap_or_else(|_| panic!("no address in {banner:?}"));
    if ask_health {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let health = runtime.block_on(http(addr, "GET", "/healthz", &[], b""));
        assert_eq!(health.status, 200);
    }
    let status =
        std::process::Command::new("kill").args(["-TERM", &child.0.id().to_string()]).status().unwrap();
    assert!(status.success());
    let exit = child.0.wait().unwrap();
    assert!(exit.success(), "exit status after SIGTERM: {exit:?}");
}

#[tokio::test]
async fn a_text_message_that_is_not_utf8_closes_with_1007() {
    let addr = start("").await;
    let mut stream = raw_websocket(addr).await;
    // A masked text frame (FIN, opcode 1) whose payload is not UTF-8.
    let payload = [0xffu8, 0xfe, 0xfd];
    let mask = [1u8, 2, 3, 4];
    let mut frame = vec![0x81, 0x80 | payload.len() as u8];
    frame.extend_from_slice(&mask);
    frame.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    stream.write_all(&frame).await.unwrap();
    let mut answer = [0u8; 4];
    stream.read_exact(&mut answer).await.unwrap();
    assert_eq!(answer[0], 0x88, "a close frame");
    assert_eq!(u16::from_be_bytes([answer[2], answer[3]]), 1007);
}

#[tokio::test]
async fn clients_and_sockets_over_their_rate_get_rate_limited_answers() {
    // Refills are an hour apart: the burst is all a client gets while the test runs.
    let addr = start("client_rate = 0.0003\nclient_burst = 3.0\n").await;
    let body = silp_code("cancel(x)", "decode").to_string();
    let mut statuses = Vec::new();
    for _ in 0..5 {
        statuses.push(
            http(addr, "POST", "/nlip", &[("Content-Type", "application/json")], body.as_bytes())
                .await
                .status,
        );
    }
    assert_eq!(statuses, [200, 200, 200, 429, 429]);
    let r = http(addr, "POST", "/nlip", &[("Content-Type", "application/json")], body.as_bytes()).await;
    assert!(r.headers.to_ascii_lowercase().contains("retry-after: "), "{}", r.headers);
    assert_eq!(r.json()["submessages"][0]["content"]["code"], "rate_limited");

    let addr = start("connection_rate = 0.0003\nconnection_burst = 2.0\n").await;
    let (mut ws, _) = tokio_tungstenite::connect_async(format!("ws://{addr}/nlip/ws/text")).await.unwrap();
    for _ in 0..3 {
        ws.send(Frame::Text(body.clone().into())).await.unwrap();
    }
    let mut codes = Vec::new();
    for _ in 0..3 {
        let Some(Frame::Text(reply)) = next_frame(&mut ws).await else { panic!("a reply") };
        let reply: Value = serde_json::from_str(&reply).unwrap();
        codes.push(if reply["messagetype"] == "error" {
            reply["submessages"][0]["content"]["code"].as_str().unwrap().to_owned()
        } else {
            "ok".into()
        });
    }
    // Replies on a socket come as they are ready: the refusal may overtake the answers.
    codes.sort();
    assert_eq!(codes, ["ok", "ok", "rate_limited"]);
}

#[test]
fn without_tls_or_an_explicit_plain_the_daemon_refuses_to_start() {
    let dir =
        std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("refuse-{}", std::process::id()));
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_silpgate"))
        .args(["run", "--listen", "127.0.0.1:0", "--store"])
        .arg(&dir)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            child.kill().unwrap();
            panic!("the daemon started plain without being asked to");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("http.plain = true"), "{stderr}");
}

#[tokio::test]
async fn https_and_wss_with_a_configured_certificate() {
    use rustls::pki_types::{CertificateDer, ServerName};
    let identity = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let dir =
        std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    std::fs::write(&cert, identity.cert.pem()).unwrap();
    std::fs::write(&key, identity.signing_key.serialize_pem()).unwrap();
    let addr = start(&format!(
        "tls_cert = {:?}\ntls_key = {:?}\n",
        cert.display().to_string(),
        key.display().to_string()
    ))
    .await;

    let mut roots = rustls::RootCertStore::empty();
    roots.add(CertificateDer::from(identity.cert.der().to_vec())).unwrap();
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
    let name = ServerName::try_from("localhost").unwrap();

    // https: one request, read until the server closes.
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut tls = connector.connect(name.clone(), tcp).await.expect("TLS handshake");
    let body = silp_code("cancel(flight)", "decode").to_string();
    let request = format!(
        "POST /nlip HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    tls.write_all(request.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    let _ = tls.read_to_end(&mut raw).await;
    let text = String::from_utf8_lossy(&raw);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(text.contains("\"subformat\":\"silp-ir\""), "{text}");

    // wss over the same certificate.
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let tls = connector.connect(name, tcp).await.expect("TLS handshake");
    let (mut ws, _) =
        tokio_tungstenite::client_async("wss://localhost/nlip/ws/text", tls).await.expect("wss upgrade");
    ws.send(Frame::Text(body.into())).await.unwrap();
    let Some(Frame::Text(reply)) = next_frame(&mut ws).await else { panic!("a reply over wss") };
    assert!(reply.contains("silp-ir"), "{reply}");

    // A plain-text client gets no HTTP answer from a TLS listener.
    let plain = http_or_nothing(addr).await;
    assert!(!plain.starts_with("HTTP/1.1 200"), "{plain}");
}

async fn http_or_nothing(addr: SocketAddr) -> String {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let _ = stream.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await;
    let mut raw = Vec::new();
    let _ = tokio::time::timeout(std::time::Duration::from_secs(2), stream.read_to_end(&mut raw)).await;
    String::from_utf8_lossy(&raw).into_owned()
}

#[tokio::test]
async fn a_socket_that_stops_answering_pings_is_closed_with_1008() {
    let addr = start("ws_dead_secs = 2\n").await;
    let mut stream = raw_websocket(addr).await;
    // A raw client that never answers: pings arrive every second, then the close.
    let mut pings = 0;
    let code = tokio::time::timeout(std::time::Duration::from_secs(10), async {
        loop {
            let mut frame_head = [0u8; 2];
            stream.read_exact(&mut frame_head).await.unwrap();
            let mut payload = vec![0u8; usize::from(frame_head[1] & 0x7f)];
            stream.read_exact(&mut payload).await.unwrap();
            match frame_head[0] & 0x0f {
                0x9 => pings += 1,
                0x8 => return u16::from_be_bytes([payload[0], payload[1]]),
                other => panic!("unexpected frame opcode {other}"),
            }
        }
    })
    .await
    .expect("the server closes a dead socket");
    assert_eq!(code, 1008);
    assert!(pings >= 1, "pings before the close: {pings}");
}

/// A WebSocket to /nlip/ws/text opened by hand, for sending frames no client library would.
async fn raw_websocket(addr: SocketAddr) -> tokio::net::TcpStream {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let handshake = format!(
        "GET /nlip/ws/text HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    );
    stream.write_all(handshake.as_bytes()).await.unwrap();
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8; 1];
        stream.read_exact(&mut byte).await.unwrap();
        head.push(byte[0]);
    }
    assert!(head.starts_with(b"HTTP/1.1 101"), "{}", String::from_utf8_lossy(&head));
    stream
}

#[tokio::test]
async fn metrics_are_served_as_prometheus_text_and_count_what_happened() {
    let addr = start("").await;
    let before = silpgate::metrics::get().messages_in.with_label_values(&["http", "http"]).get();
    assert_eq!(post_json(addr, &silp_code("cancel(x)", "decode")).await.status, 200);
    assert_eq!(
        post_json(
            addr,
            &json!({"format":"structured","subformat":"silp-code","content":"cancel((","label":"decode"})
        )
        .await
        .status,
        400
    );
    let scrape = http(addr, "GET", "/metrics", &[], b"").await;
    assert_eq!(scrape.status, 200);
    assert!(scrape.headers.to_ascii_lowercase().contains("content-type: text/plain; version=0.0.4"));
    let text = String::from_utf8(scrape.body).unwrap();
    let value = |prefix: &str| -> f64 {
        text.lines()
            .find(|l| l.starts_with(prefix))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no sample {prefix} in:\n{text}"))
    };
    // Tests in this binary share the process's registry: count from before this test.
    assert!(value("silpgate_messages_in_total{source=\"http\",transport=\"http\"}") >= before as f64 + 2.0);
    assert!(
        value(
            "silpgate_message_failures_total{code=\"invalid_syntax\",disposition=\"poison\",transport=\"http\"}"
        ) >= 1.0
    );
    assert!(value("silpgate_message_seconds_count{transport=\"http\"}") >= 2.0);
    assert!(text.contains("# TYPE silpgate_in_flight gauge"));
}

/// Far more live conversations than there are two-character session ids (1,296): a session id
/// is scoped by its conversation, so none is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_thousand_live_conversations_are_all_served() {
    const CONVERSATIONS: usize = 5_000;
    let addr = start("max_conversations_per_client = 0\nclient_rate = 0.0\n").await;
    let sent = futures_util::stream::iter(0..CONVERSATIONS)
        .map(|i| async move {
            let body = json!({"format":"structured","subformat":"silp-code","content":format!("cancel(o{i})"),"label":"decode",
                "submessages":[{"format":"token","subformat":"conversation","content":format!("live-{i}")}]});
            let r = post_json(addr, &body).await;
            (r.status, r.json()["content"]["meta"]["session_id"].as_str().map(str::len))
        })
        .buffer_unordered(32)
        .collect::<Vec<_>>()
        .await;
    let refused: Vec<_> = sent.iter().filter(|(status, _)| *status != 200).collect();
    assert!(refused.is_empty(), "{} of {CONVERSATIONS} refused, e.g. {:?}", refused.len(), refused.first());
    assert!(sent.iter().all(|(_, id)| *id == Some(2)), "every answer names a two-character session id");
}
