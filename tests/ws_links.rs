//! WebSocket links: agents reached over WebSocket (silpgate is the client, the agent answers
//! on the socket), upstream WebSocket streams silpgate consumes, and `silpgate agents check`.
//! Real parts throughout: RabbitMQ, silpgate as a process, WebSocket servers on
//! tokio-tungstenite in the test. Every wait has a bound and says what it waited for.

mod support;

use futures_util::{SinkExt, StreamExt};
use lapin::BasicProperties;
use serde_json::{Value, json};
use silpgate::nlip::{self, Encoding, Limits, Message};
use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::agents;
use support::broker::{self, Names};
use support::gateway::{self, LONG, declare, ir_request, order_in, post, start};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message as Frame;

/// This file's silpgate, optionally on the broker, answers awaited up to 30 s.
fn config(names: &Names, store: &Path, amqp: bool, rest: &str) -> String {
    gateway::config(names, store, amqp, 30_000, rest)
}

/// A WebSocket agent `name` at `addr`, reached from `source`, fed SILP code.
fn ws_agent(name: &str, addr: SocketAddr, extra: &str, source: &str, mode: &str) -> String {
    format!(
        r#"[[agents]]
name = "{name}"
frontends = ["code"]
url = "ws://{addr}/agent"
timeout_ms = 2000
{extra}
[[routes]]
name = "{source}-to-{name}"
destination = "{name}"
mode = "{mode}"
[routes.match]
source = "{source}"
"#
    )
}

/// The NLIP message in a data frame.
fn decode_frame(frame: &Frame) -> Option<(Message, bool)> {
    match frame {
        Frame::Binary(b) => {
            Some((nlip::decode(b, Encoding::Cbor, &Limits::default()).expect("CBOR NLIP"), true))
        }
        Frame::Text(t) => {
            Some((nlip::decode(t.as_bytes(), Encoding::Json, &Limits::default()).expect("JSON NLIP"), false))
        }
        _ => None,
    }
}

fn encode_frame(message: &Message, binary: bool) -> Frame {
    if binary {
        Frame::Binary(nlip::encode(message, Encoding::Cbor).into())
    } else {
        Frame::Text(nlip::to_json(message).into())
    }
}

/// The `Authorization` and `traceparent` headers of an upgrade request.
type Upgrade = (Option<String>, Option<String>);

/// A WebSocket agent: answers `//ping` with its frontends and every other request with the
/// echo agent's answer, in the frame type it came in. Within a conversation it answers in
/// order; conversations are answered at different paces, so answers of different
/// conversations overtake each other. Stop it (every connection dropped at once, like a
/// crash) and start it again on the same address.
struct WsAgent {
    addr: SocketAddr,
    /// SILP code texts received, in arrival order (a request written again counts again).
    codes: Arc<Mutex<Vec<String>>>,
    /// Frames received: (binary, text).
    kinds: Arc<Mutex<(usize, usize)>>,
    connections: Arc<AtomicUsize>,
    /// The `Authorization` and `traceparent` headers of each upgrade request.
    upgrades: Arc<Mutex<Vec<Upgrade>>>,
    /// The bearer token an upgrade must carry (else 401).
    token: Option<&'static str>,
    tasks: Arc<Mutex<Vec<tokio::task::JoinHandle<()>>>>,
}

impl WsAgent {
    async fn start() -> WsAgent {
        WsAgent::with_token(None).await
    }

    async fn with_token(token: Option<&'static str>) -> WsAgent {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let agent = WsAgent {
            addr: listener.local_addr().unwrap(),
            codes: Arc::default(),
            kinds: Arc::default(),
            connections: Arc::default(),
            upgrades: Arc::default(),
            token,
            tasks: Arc::default(),
        };
        agent.serve(listener);
        agent
    }

    fn stop(&self) {
        for task in self.tasks.lock().unwrap().drain(..) {
            task.abort();
        }
    }

    async fn restart(&self) {
        let listener =
            tokio::net::TcpListener::bind(self.addr).await.expect("the agent's port is free again");
        self.serve(listener);
    }

    fn serve(&self, listener: tokio::net::TcpListener) {
        let (codes, kinds, connections, tasks) =
            (self.codes.clone(), self.kinds.clone(), self.connections.clone(), self.tasks.clone());
        let (upgrades, token) = (self.upgrades.clone(), self.token);
        let accept = tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                connections.fetch_add(1, Ordering::SeqCst);
                let (codes, kinds, upgrades) = (codes.clone(), kinds.clone(), upgrades.clone());
                let connection = tokio::spawn(async move {
                    use tokio_tungstenite::tungstenite::handshake::server::{
                        ErrorResponse, Request, Response,
                    };
                    // tungstenite's callback type: its error is a whole response.
                    #[allow(clippy::result_large_err)]
                    let check =
                        move |request: &Request, response: Response| -> Result<Response, ErrorResponse> {
                            let header = |name: &str| {
                                request.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_owned)
                            };
                            let authorization = header("authorization");
                            upgrades.lock().unwrap().push((authorization.clone(), header("traceparent")));
                            match token {
                                Some(token) if authorization != Some(format!("Bearer {token}")) => {
                                    let mut refusal = ErrorResponse::new(Some("no valid token".into()));
                                    *refusal.status_mut() = axum::http::StatusCode::UNAUTHORIZED;
                                    Err(refusal)
                                }
                                _ => Ok(response),
                            }
                        };
                    let Ok(socket) = tokio_tungstenite::accept_hdr_async(tcp, check).await else { return };
                    let (mut sink, mut stream) = socket.split();
                    let (out, mut outgoing) = mpsc::unbounded_channel::<Frame>();
                    let _writer = Owned(tokio::spawn(async move {
                        while let Some(frame) = outgoing.recv().await {
                            if sink.send(frame).await.is_err() {
                                break;
                            }
                        }
                    }));
                    let mut conversations: HashMap<String, mpsc::UnboundedSender<(Message, bool)>> =
                        HashMap::new();
                    let mut per_conversation = Vec::new();
                    while let Some(Ok(frame)) = stream.next().await {
                        let Some((request, binary)) = decode_frame(&frame) else { continue };
                        {
                            let mut kinds = kinds.lock().unwrap();
                            if binary { kinds.0 += 1 } else { kinds.1 += 1 }
                        }
                        if request.is_control() && request.content.as_str() == Some("//ping") {
                            let content = json!({"silp":"v1","frontends":["code","json"],"preferred":"code"});
                            let answer =
                                Message::new(nlip::Format::Structured, "json", nlip::Content::Json(content))
                                    .with_messagetype("control");
                            let _ = out.send(encode_frame(&answer, binary));
                            continue;
                        }
                        if let Some(code) = agents::silp_code_of(&request) {
                            codes.lock().unwrap().push(code);
                        }
                        let token = request.conversation_token().unwrap_or_default().to_owned();
                        let queue = conversations.entry(token.clone()).or_insert_with(|| {
                            let (tx, mut rx) = mpsc::unbounded_channel::<(Message, bool)>();
                            let out = out.clone();
                            // Each conversation at its own pace, in order within it.
                            let pace = Duration::from_millis(
                                (token.len() as u64 * 7 + token.bytes().map(u64::from).sum::<u64>()) % 5,
                            );
                            per_conversation.push(Owned(tokio::spawn(async move {
                                let echo = agents::echo_code();
                                while let Some((request, binary)) = rx.recv().await {
                                    tokio::time::sleep(pace).await;
                                    if let Some(answer) = echo(&request) {
                                        let _ = out.send(encode_frame(&answer, binary));
                                    }
                                }
                            })));
                            tx
                        });
                        let _ = queue.send((request, binary));
                    }
                    // The writer and the conversations' tasks end with the connection (dropped
                    // here, or when the connection task is aborted: a crash closes the socket).
                    drop(per_conversation);
                });
                tasks.lock().unwrap().push(connection);
            }
        });
        self.tasks.lock().unwrap().push(accept);
    }
}

/// A task that ends when its handle is dropped.
struct Owned(tokio::task::JoinHandle<()>);

impl Drop for Owned {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Drop for WsAgent {
    fn drop(&mut self) {
        self.stop();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_and_websocket_clients_reach_websocket_agents_with_many_requests_in_flight() {
    const REQUESTS: usize = 200;
    const CONVERSATIONS: usize = 10;
    let binary_agent = WsAgent::start().await;
    let text_agent = WsAgent::start().await;
    let names = Names::new("ws-agent");
    let dir = broker::temp_dir("ws-agent");
    let rest = format!(
        "{}{}",
        ws_agent("coder", binary_agent.addr, "", "http", "encode"),
        ws_agent("texter", text_agent.addr, "encoding = \"json\"", "ws", "encode")
    );
    // Spans are recorded (exported nowhere that listens), so that the upgrade carries a trace.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let rest = format!("{rest}[telemetry]\notlp_endpoint = \"http://{closed}/v1/traces\"\n");
    let daemon = start(&config(&names, &dir.join("store"), false, &rest), &dir, false).await;

    // HTTP: many requests at once, over interleaved conversations; each gets its own answer.
    let posts = (0..REQUESTS).map(|i| {
        let addr = daemon.http.clone();
        tokio::spawn(async move {
            let request = ir_request(i, &format!("http-conv-{}", i % CONVERSATIONS));
            let (status, answer) = post(&addr, "/nlip", request.to_string().as_bytes()).await;
            assert_eq!(status, 200, "request {i}: {answer}");
            assert_eq!(answer["subformat"], "silp-ir", "the asker reads the IR: {answer}");
            let got = order_in(&answer["content"].to_string());
            assert_eq!(got, Some(i), "request {i} got the answer to another request: {answer}");
            i
        })
    });
    let answered: BTreeSet<usize> =
        futures_util::future::join_all(posts).await.into_iter().map(|r| r.expect("an answer each")).collect();
    assert_eq!(answered.len(), REQUESTS);
    assert_eq!(binary_agent.codes.lock().unwrap().len(), REQUESTS, "each request reached the agent once");
    assert_eq!(*binary_agent.kinds.lock().unwrap(), (REQUESTS, 0), "CBOR in binary frames by default");
    assert_eq!(binary_agent.connections.load(Ordering::SeqCst), 1, "one persistent connection");
    let upgrades = binary_agent.upgrades.lock().unwrap().clone();
    let traceparent = upgrades[0].1.clone().expect("the upgrade request carries a traceparent");
    assert!(traceparent.starts_with("00-") && traceparent.len() == 55, "{traceparent}");
    assert_eq!(upgrades[0].0, None, "no token configured, none sent");

    // The WebSocket door to a JSON agent: text frames, the answers on the asker's socket.
    let (mut ws, _) = tokio_tungstenite::connect_async(format!("ws://{}/nlip/ws/text", daemon.http))
        .await
        .expect("the socket opens");
    for i in 0..20 {
        ws.send(Frame::Text(ir_request(i, &format!("ws-conv-{}", i % 3)).to_string().into())).await.unwrap();
    }
    let mut got = BTreeSet::new();
    while got.len() < 20 {
        let frame = tokio::time::timeout(LONG, ws.next()).await;
        let Ok(Some(Ok(Frame::Text(text)))) = frame else {
            panic!("{} of 20 answers, then nothing", got.len())
        };
        let answer: Value = serde_json::from_str(&text).unwrap();
        let i = order_in(&answer["content"].to_string()).unwrap_or_else(|| panic!("not an answer: {answer}"));
        assert!(got.insert(i), "the answer to {i} came twice");
    }
    assert_eq!(*text_agent.kinds.lock().unwrap(), (0, 20), "encoding = \"json\": text frames");
    ws.close(None).await.unwrap();
    let (status, took) = tokio::task::spawn_blocking(move || daemon.terminate(LONG)).await.unwrap();
    assert!(status.success(), "exit 0 after SIGTERM with WebSocket agents connected (took {took:?})");
    eprintln!("websocket agents: SIGTERM to exit took {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_agent_restarted_mid_stream_loses_nothing_and_counts_each_once() {
    const N: usize = 200;
    const CONVERSATIONS: usize = 10;
    let agent = WsAgent::start().await;
    let names = Names::new("ws-restart");
    let dir = broker::temp_dir("ws-restart");
    let store = dir.join("store");
    let rest = ws_agent("worker", agent.addr, "", &names.inbound(), "transcode");
    let daemon = start(&config(&names, &store, true, &rest), &dir, true).await;
    let (_connection, channel) = broker::channel().await;
    declare(&channel, &names.replies()).await;
    let messages = (0..N)
        .map(|i| {
            let properties = BasicProperties::default()
                .with_content_type("application/json".into())
                .with_message_id(format!("m-{i}").into())
                .with_correlation_id(format!("c-{i}").into())
                .with_reply_to(names.replies().into());
            (names.inbound(), broker::envelope(i, i % CONVERSATIONS, None), properties)
        })
        .collect();
    let publisher = {
        let (channel, exchange) = (channel.clone(), names.inbound_exchange());
        tokio::spawn(async move { broker::publish_all(&channel, &exchange, messages).await })
    };
    let deadline = tokio::time::Instant::now() + LONG;
    while agent.codes.lock().unwrap().len() < N / 4 {
        assert!(tokio::time::Instant::now() < deadline, "the agent got too little before the restart");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    agent.stop();
    let at_outage = agent.codes.lock().unwrap().len();
    tokio::time::sleep(Duration::from_secs(2)).await;
    agent.restart().await;
    publisher.await.unwrap();

    let answers = broker::collect(&channel, &names.replies(), LONG, |got| {
        got.iter().filter_map(|r| r.correlation_id.clone()).collect::<BTreeSet<_>>().len() == N
    })
    .await;
    let mut by_correlation: HashMap<String, usize> = HashMap::new();
    for r in &answers {
        let answer: Value = serde_json::from_slice(&r.body).unwrap();
        let id = r.correlation_id.clone().expect("the sender's correlation id");
        let i = order_in(&answer["content"].to_string())
            .unwrap_or_else(|| panic!("{id}: not an answer: {answer}"));
        assert_eq!(id, format!("c-{i}"), "the answer to request {i} went to another request");
        *by_correlation.entry(id).or_default() += 1;
    }
    assert_eq!(by_correlation.len(), N, "every message is answered after the restart");
    assert!(by_correlation.values().all(|n| *n == 1), "each answered once: {by_correlation:?}");
    let received = agent.codes.lock().unwrap().clone();
    let codes: BTreeSet<String> = received.iter().cloned().collect();
    assert_eq!(codes.len(), N, "every message reached the agent");
    eprintln!("agent restart: {} frames for {N} messages (written again after the restart)", received.len());
    assert!(agent.connections.load(Ordering::SeqCst) >= 2, "silpgate reconnected");
    assert!(
        received.len() > at_outage,
        "requests were still to go at the outage ({at_outage} of {N} had arrived) and came after it"
    );
    let (status, _) = tokio::task::spawn_blocking(move || daemon.terminate(LONG)).await.unwrap();
    assert!(status.success());
    let turns = broker::session_turns(&store);
    for c in 0..CONVERSATIONS {
        assert_eq!(
            turns.get(&format!("conv-{c}")),
            Some(&(2 * (N / CONVERSATIONS) as u64)),
            "conv-{c}: each request and each answer counted once: {turns:?}"
        );
    }
}

/// A stream server's view of one connection: what it sent and the replies it got.
#[derive(Debug, Default)]
struct Pushed {
    sent: usize,
    /// The ids each reply names as delivered, in reply order.
    delivered: Vec<String>,
}

/// Accepts one connection on `listener`, pushes `range` as CBOR frames, and reads replies
/// until `enough` of them came (then drops the connection at once, like a crash) or all did
/// (then closes it properly).
async fn push(listener: &tokio::net::TcpListener, range: std::ops::Range<usize>, enough: usize) -> Pushed {
    let (tcp, _) = tokio::time::timeout(LONG, listener.accept()).await.expect("silpgate connects").unwrap();
    let socket = tokio_tungstenite::accept_async(tcp).await.expect("the upgrade");
    let (mut sink, mut stream) = socket.split();
    let count = range.len();
    let sender = tokio::spawn(async move {
        let mut sent = 0;
        for i in range {
            let request: Message = nlip::decode(
                ir_request(i, &format!("feed-conv-{}", i % 7)).to_string().as_bytes(),
                Encoding::Json,
                &Limits::default(),
            )
            .unwrap();
            if sink.send(encode_frame(&request, true)).await.is_err() {
                break;
            }
            sent += 1;
        }
        (sink, sent)
    });
    let mut pushed = Pushed::default();
    while pushed.delivered.len() < enough.min(count) {
        let frame = tokio::time::timeout(LONG, stream.next()).await;
        let Ok(Some(Ok(frame))) = frame else {
            panic!("{} of {} replies, then nothing", pushed.delivered.len(), enough.min(count))
        };
        let Some((reply, _)) = decode_frame(&frame) else { continue };
        let nlip::Content::Json(content) = &reply.content else { panic!("a JSON reply") };
        let ids =
            content["delivered"].as_array().unwrap_or_else(|| panic!("a delivery confirmation: {content}"));
        pushed.delivered.extend(ids.iter().map(|id| id.as_str().unwrap().to_owned()));
    }
    let (mut sink, sent) = sender.await.unwrap();
    pushed.sent = sent;
    if enough >= count {
        let _ = sink.close().await;
    }
    // Else: dropped here, without a close: the connection breaks.
    pushed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_restarted_halfway_delivers_what_was_read_once_and_every_confirmed_message() {
    const N: usize = 1000;
    let names = Names::new("ws-stream");
    let dir = broker::temp_dir("ws-stream");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let rest = format!(
        r#"[[streams]]
name = "feed"
url = "ws://{addr}/feed"
reconnect_initial_ms = 100
reconnect_max_ms = 500
[[agents]]
name = "planner"
frontends = ["code"]
routing_key = "{sink}"
queue = "{sink}"
[[routes]]
name = "feed-to-planner"
destination = "planner"
mode = "encode"
await = "none"
[routes.match]
source = "feed"
"#,
        sink = names.sink()
    );
    let daemon = start(&config(&names, &dir.join("store"), true, &rest), &dir, true).await;
    let (_connection, channel) = broker::channel().await;

    // First half; the server goes away once a fifth of it is confirmed.
    let first = push(&listener, 0..N / 2, N / 10).await;
    drop(listener);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let listener = tokio::net::TcpListener::bind(addr).await.expect("the stream's port is free again");
    // Second half, on the new connection, to the end.
    let second = push(&listener, N / 2..N, N).await;
    assert_eq!(second.delivered.len(), N / 2, "every message of the second connection is confirmed");

    // Quiet for 3 s: everything silpgate read is through.
    let mut delivered = Vec::new();
    loop {
        let more = broker::collect(&channel, &names.sink(), Duration::from_secs(3), |_| false).await;
        if more.is_empty() {
            break;
        }
        delivered.extend(more);
        assert!(delivered.len() <= N, "more deliveries than messages: {}", delivered.len());
    }
    let mut orders: HashMap<usize, usize> = HashMap::new();
    for d in &delivered {
        let message = nlip::decode(&d.body, Encoding::Json, &Limits::default()).unwrap();
        let code = agents::silp_code_of(&message).expect("SILP code for the planner");
        *orders.entry(order_in(&code).expect("an order")).or_default() += 1;
    }
    let twice: Vec<_> = orders.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "a message read once is delivered once: {twice:?}");
    assert!(orders.keys().all(|i| *i < N), "only messages the server sent");
    assert!((N / 2..N).all(|i| orders.contains_key(&i)), "the whole second half is delivered");
    let ids: BTreeSet<&str> = delivered.iter().map(|d| d.message_id.as_str()).collect();
    for id in first.delivered.iter().chain(&second.delivered) {
        assert!(ids.contains(id.as_str()), "confirmed on the socket but not delivered: {id}");
    }
    let first_half = orders.keys().filter(|i| **i < N / 2).count();
    assert!(first_half >= first.delivered.len(), "at least what was confirmed before the break");
    eprintln!(
        "stream: first connection sent {}, {} confirmed, {} delivered ({} lost with the connection)",
        first.sent,
        first.delivered.len(),
        first_half,
        first.sent - first_half
    );
    // On SIGTERM the stream stops reading and the daemon exits cleanly.
    let (status, took) = tokio::task::spawn_blocking(move || daemon.terminate(LONG)).await.unwrap();
    assert!(status.success(), "exit 0 after SIGTERM with a stream connected (took {took:?})");
    eprintln!("stream: SIGTERM to exit took {took:?}");
}

/// The line of `out` that names `agent`.
fn line(out: &str, agent: &str) -> String {
    out.lines().find(|l| l.split_whitespace().nth(1) == Some(agent)).map(str::to_owned).unwrap_or_default()
}

/// `silpgate agents check --config FILE`: status, standard output.
async fn agents_check(config_text: &str, dir: &Path) -> (std::process::ExitStatus, String) {
    let path = dir.join("check.toml");
    std::fs::write(&path, config_text).unwrap();
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_silpgate"));
    command.args(["agents", "check", "--config"]).arg(&path).env("SILPGATE_WS_TEST_TOKEN", "s3cret");
    // Bounded: a check that hangs is killed and fails the test instead of hanging the run.
    let out =
        tokio::task::spawn_blocking(move || support::process::run_bounded(command, LONG)).await.unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    eprintln!("{stdout}{}", String::from_utf8_lossy(&out.stderr));
    (out.status, stdout)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_check_says_which_agents_are_reachable_and_exits_1_naming_the_unreachable_one() {
    let ws = WsAgent::with_token(Some("s3cret")).await;
    let names = Names::new("ws-check");
    let dir = broker::temp_dir("ws-check");
    let (_connection, channel) = broker::channel().await;
    declare(&channel, &names.sink()).await;
    let reachable = format!(
        r#"[[agents]]
name = "planner"
frontends = ["code"]
queue = "{sink}"
[[agents]]
name = "socket-agent"
frontends = ["code"]
url = "ws://{ws}/agent"
timeout_ms = 5000
token_env = "SILPGATE_WS_TEST_TOKEN"
"#,
        sink = names.sink(),
        ws = ws.addr
    );
    let (status, out) = agents_check(&config(&names, &dir.join("store"), true, &reachable), &dir).await;
    assert!(status.success(), "every agent is reachable: {out}");
    assert!(line(&out, "planner").starts_with("ok"), "{out}");
    assert!(line(&out, "planner").contains(&names.sink()), "the queue was checked: {out}");
    assert!(line(&out, "socket-agent").starts_with("ok"), "{out}");
    assert!(
        line(&out, "socket-agent").contains("frontends code,json; preferred code"),
        "the ping's answer: {out}"
    );

    let closed = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        probe.local_addr().unwrap()
    };
    let unreachable = format!(
        r#"{reachable}[[agents]]
name = "ghost"
frontends = ["code"]
url = "http://{closed}/nlip"
timeout_ms = 2000
[[agents]]
name = "tokenless"
frontends = ["code"]
url = "ws://{ws}/agent"
"#,
        ws = ws.addr
    );
    let (status, out) = agents_check(&config(&names, &dir.join("store"), true, &unreachable), &dir).await;
    assert_eq!(status.code(), Some(1), "an unreachable agent: exit 1: {out}");
    assert!(line(&out, "planner").starts_with("ok") && line(&out, "socket-agent").starts_with("ok"), "{out}");
    assert!(line(&out, "ghost").starts_with("unreachable"), "the unreachable agent is named: {out}");
    assert!(line(&out, "tokenless").starts_with("unreachable"), "refused without its token: {out}");
    assert!(line(&out, "tokenless").contains("401"), "{out}");
    assert_eq!(out.lines().filter(|l| l.starts_with("unreachable")).count(), 2, "{out}");
}

#[test]
fn websocket_agent_and_stream_urls_are_checked_and_frames_default_to_cbor() {
    use silpgate::config::{Config, FrameEncoding, Reach};
    let frames = |config: &Config| match &config.agents[0].reach {
        Reach::WebSocket(reach) => reach.encoding,
        other => panic!("a ws:// agent is reached over WebSocket, not {}", other.transport().as_str()),
    };
    let agent = |url: &str, extra: &str| {
        Config::parse(&format!("[[agents]]\nname = \"a\"\nfrontends = []\nurl = \"{url}\"\n{extra}"))
    };
    let ok = agent("ws://127.0.0.1:9/agent", "").expect("ws:// to loopback");
    assert_eq!(frames(&ok), FrameEncoding::Cbor, "binary CBOR frames by default");
    let text = agent("wss://agent.example/nlip", "encoding = \"json\"").expect("wss:// anywhere");
    assert_eq!(frames(&text), FrameEncoding::Json);
    agent("ws://agent.example/nlip", "plain = true").expect("plain ws:// when asked for");
    let e = agent("ws://agent.example/nlip", "").unwrap_err().to_string();
    assert!(e.contains("plain ws://") && e.contains("wss://"), "{e}");
    let e = agent("ftp://agent.example/", "").unwrap_err().to_string();
    assert!(e.contains("ws://"), "{e}");
    let e = agent("http://127.0.0.1:9/nlip", "encoding = \"json\"").unwrap_err().to_string();
    assert!(e.contains("encoding is for ws://"), "{e}");

    let stream = |url: &str, extra: &str| {
        Config::parse(&format!("[[streams]]\nname = \"feed\"\nurl = \"{url}\"\n{extra}"))
    };
    let ok = stream("wss://feed.example/nlip", "").expect("wss:// stream");
    assert_eq!(ok.streams[0].max_in_flight, 256);
    let e = stream("ws://feed.example/nlip", "").unwrap_err().to_string();
    assert!(e.contains("stream 'feed'") && e.contains("plain"), "{e}");
    let e = stream("https://feed.example/nlip", "").unwrap_err().to_string();
    assert!(e.contains("ws:// or wss://"), "{e}");
    let twice = "[[streams]]\nname = \"f\"\nurl = \"ws://127.0.0.1:1/\"\n[[streams]]\nname = \"f\"\nurl = \"ws://127.0.0.1:2/\"\n";
    assert!(Config::parse(twice).unwrap_err().to_string().contains("twice"));
}

/// A `wss://` agent on 127.0.0.1 with a self-signed certificate for `localhost`, answering
/// `//ping`; its address and the certificate's PEM.
async fn tls_ping_agent() -> (SocketAddr, String) {
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
    let identity = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let chain = vec![CertificateDer::from(identity.cert.der().to_vec())];
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(identity.signing_key.serialize_der()));
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else { return };
                let Ok(mut socket) = tokio_tungstenite::accept_async(tls).await else { return };
                while let Some(Ok(frame)) = socket.next().await {
                    let Some((_, binary)) = decode_frame(&frame) else { continue };
                    let content = json!({"silp":"v1","frontends":["json"],"preferred":"json"});
                    let answer = Message::new(nlip::Format::Structured, "json", nlip::Content::Json(content))
                        .with_messagetype("control");
                    if socket.send(encode_frame(&answer, binary)).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    (addr, identity.cert.pem())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wss_agent_is_verified_against_the_system_roots_and_its_ca_file() {
    let (addr, pem) = tls_ping_agent().await;
    let names = Names::new("ws-tls");
    let dir = broker::temp_dir("ws-tls");
    let ca_file = dir.join("agent-ca.pem");
    std::fs::write(&ca_file, pem).unwrap();
    let agents = format!(
        r#"[[agents]]
name = "trusted"
frontends = ["code"]
url = "wss://localhost:{port}/agent"
ca_file = "{ca}"
[[agents]]
name = "untrusted"
frontends = ["code"]
url = "wss://localhost:{port}/agent"
"#,
        port = addr.port(),
        ca = ca_file.display()
    );
    let (status, out) = agents_check(&config(&names, &dir.join("store"), false, &agents), &dir).await;
    assert_eq!(status.code(), Some(1), "{out}");
    let trusted = line(&out, "trusted");
    assert!(trusted.starts_with("ok") && trusted.contains("preferred json"), "verified with ca_file: {out}");
    let untrusted = line(&out, "untrusted");
    assert!(untrusted.starts_with("unreachable") && untrusted.contains("TLS"), "not verified without: {out}");
}
