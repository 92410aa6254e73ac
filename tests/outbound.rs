//! silpgate believes nothing that comes back: agents are fakes inside each test, on loopback,
//! speaking raw HTTP so that they can misbehave as a hostile agent would (answer 512 MiB,
//! drip an answer a byte at a time, redirect, serve a card naming another origin). silpgate
//! runs as a process with its HTTP door only. Every wait has a bound.

mod support;

use serde_json::Value;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use support::broker::{self, Daemon, Names};
use support::gateway::{self, ir_request, post};

/// What a fake agent does with one connection, after reading the request's head and body.
type Answer = Arc<dyn Fn(&str, &mut TcpStream) + Send + Sync>;

/// A fake HTTP agent on 127.0.0.1 (or `host`): serves every connection with `answer` on its
/// own thread, until the test ends.
struct FakeAgent {
    port: u16,
    /// Connections accepted.
    connections: Arc<AtomicUsize>,
}

impl FakeAgent {
    fn start(host: &str, answer: Answer) -> FakeAgent {
        let listener = TcpListener::bind((host, 0)).expect("a loopback port");
        let port = listener.local_addr().unwrap().port();
        let connections = Arc::new(AtomicUsize::new(0));
        let counted = connections.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { return };
                counted.fetch_add(1, Ordering::SeqCst);
                let answer = answer.clone();
                std::thread::spawn(move || {
                    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
                    if let Some(head) = read_request(&mut stream) {
                        answer(&head, &mut stream);
                    }
                });
            }
        });
        FakeAgent { port, connections }
    }
}

/// Reads one request: its head (returned) and as much body as its `Content-Length` says.
fn read_request(stream: &mut TcpStream) -> Option<String> {
    let mut raw = Vec::new();
    let mut byte = [0u8; 1];
    while !raw.ends_with(b"\r\n\r\n") {
        if stream.read(&mut byte).ok()? == 0 {
            return None;
        }
        raw.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&raw).into_owned();
    let length = head
        .lines()
        .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().to_owned()))
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(0);
    let mut body = vec![0u8; length];
    stream.read_exact(&mut body).ok()?;
    Some(head)
}

/// silpgate without a broker, its HTTP door routing everything to the agent `agent` describes.
async fn gateway_to(test: &str, agent: &str, reply_timeout_ms: u64) -> Daemon {
    let names = Names::new(test);
    let dir = broker::temp_dir(test);
    let rest = format!(
        "{agent}\n[[routes]]\nname = \"to-agent\"\ndestination = \"agent\"\nmode = \"encode\"\n[routes.match]\nsource = \"http\"\n"
    );
    gateway::start(&gateway::config(&names, &dir.join("store"), false, reply_timeout_ms, &rest), &dir, false)
        .await
}

fn nlip_agent(port: u16) -> String {
    format!(
        "[[agents]]\nname = \"agent\"\nfrontends = [\"code\"]\nurl = \"http://127.0.0.1:{port}/nlip\"\ntimeout_ms = 60000\n"
    )
}

fn error_code(message: &Value) -> &str {
    message["submessages"][0]["content"]["code"].as_str().unwrap_or_default()
}

/// An agent that answers 512 MiB, chunked (no length to refuse it by): silpgate stops reading
/// at `nlip.max_message_bytes`, the asker hears `answer_too_large` at once, and the agent could
/// write no more than what fits in the sockets' buffers before silpgate hung up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_answering_512_mib_is_cut_at_the_message_limit() {
    let written = Arc::new(AtomicUsize::new(0));
    let counted = written.clone();
    let agent = FakeAgent::start(
        "127.0.0.1",
        Arc::new(move |_, stream| {
            let head =
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n";
            if stream.write_all(head.as_bytes()).is_err() {
                return;
            }
            let chunk = format!("{:x}\r\n{}\r\n", 1 << 20, " ".repeat(1 << 20));
            for _ in 0..512 {
                if stream.write_all(chunk.as_bytes()).is_err() {
                    return;
                }
                counted.fetch_add(1 << 20, Ordering::SeqCst);
            }
        }),
    );
    let daemon = gateway_to("outbound-huge", &nlip_agent(agent.port), 30_000).await;
    let started = Instant::now();
    let (status, answer) = post(&daemon.http, "/nlip", ir_request(1, "huge-1").to_string().as_bytes()).await;
    assert_eq!(status, 502, "{answer}");
    assert_eq!(error_code(&answer), "answer_too_large", "{answer}");
    assert!(started.elapsed() < Duration::from_secs(10), "at once, not after reading it all");
    std::thread::sleep(Duration::from_millis(500));
    let written = written.load(Ordering::SeqCst);
    assert!(written < 64 << 20, "silpgate stopped reading: the agent got {} MiB out", written >> 20);
}

/// A declared length past the limit is refused before a byte of the body is read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_announcing_more_than_the_limit_is_refused_unread() {
    let agent = FakeAgent::start(
        "127.0.0.1",
        Arc::new(|_, stream| {
            let head =
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 536870912\r\n\r\n";
            let _ = stream.write_all(head.as_bytes());
            std::thread::sleep(Duration::from_secs(5));
        }),
    );
    let daemon = gateway_to("outbound-length", &nlip_agent(agent.port), 30_000).await;
    let started = Instant::now();
    let (status, answer) =
        post(&daemon.http, "/nlip", ir_request(2, "length-1").to_string().as_bytes()).await;
    assert_eq!((status, error_code(&answer)), (502, "answer_too_large"), "{answer}");
    assert!(started.elapsed() < Duration::from_secs(3), "refused by its length: {:?}", started.elapsed());
}

/// An answer dripped a byte a second is cut at `gateway.reply_timeout_ms`, not at the agent's
/// much longer `timeout_ms`: the whole exchange is bounded by the reply timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dripping_answer_is_cut_at_the_reply_timeout() {
    let stop = Arc::new(AtomicBool::new(false));
    let stopped = stop.clone();
    let agent = FakeAgent::start(
        "127.0.0.1",
        Arc::new(move |_, stream| {
            let head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n";
            let _ = stream.write_all(head.as_bytes());
            while !stopped.load(Ordering::SeqCst) && stream.write_all(b" ").is_ok() {
                std::thread::sleep(Duration::from_secs(1));
            }
        }),
    );
    let daemon = gateway_to("outbound-drip", &nlip_agent(agent.port), 2_000).await;
    let started = Instant::now();
    let (status, answer) = post(&daemon.http, "/nlip", ir_request(3, "drip-1").to_string().as_bytes()).await;
    let took = started.elapsed();
    stop.store(true, Ordering::SeqCst);
    assert_eq!((status, error_code(&answer)), (504, "timeout"), "{answer}");
    assert!(took < Duration::from_secs(20), "cut at the 2 s reply timeout, not the agent's 60 s: {took:?}");
}

/// An agent that redirects is an agent error naming the location; nothing is sent there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redirect_is_not_followed_and_the_asker_hears_where_it_pointed() {
    let elsewhere = FakeAgent::start("127.0.0.1", Arc::new(|_, _| {}));
    let target = format!("http://127.0.0.1:{}/steal", elsewhere.port);
    let location = target.clone();
    let agent = FakeAgent::start(
        "127.0.0.1",
        Arc::new(move |_, stream| {
            let head = format!(
                "HTTP/1.1 307 Temporary Redirect\r\nLocation: {location}\r\nContent-Length: 0\r\n\r\n"
            );
            let _ = stream.write_all(head.as_bytes());
        }),
    );
    let daemon = gateway_to("outbound-redirect", &nlip_agent(agent.port), 30_000).await;
    let (status, answer) =
        post(&daemon.http, "/nlip", ir_request(4, "redirect-1").to_string().as_bytes()).await;
    assert_eq!((status, error_code(&answer)), (502, "agent_redirected"), "{answer}");
    assert!(answer.to_string().contains(&target), "names the location: {answer}");
    assert_eq!(elsewhere.connections.load(Ordering::SeqCst), 0, "nothing went to the redirect's target");
}

/// An A2A card naming an endpoint on another origin does not send silpgate (and its token)
/// there; the same card is taken once that origin is allowed in `card_origins`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_card_naming_another_origin_is_refused_unless_allowed() {
    let elsewhere = FakeAgent::start(
        "127.0.0.2",
        Arc::new(|_, stream| {
            let body = r#"{"jsonrpc":"2.0","id":1,"result":{"message":{"messageId":"a","role":"ROLE_AGENT","parts":[{"text":"from elsewhere"}]}}}"#;
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
                body.len()
            );
            let _ = stream.write_all(head.as_bytes());
            let _ = stream.write_all(body.as_bytes());
        }),
    );
    let endpoint = format!("http://127.0.0.2:{}/rpc", elsewhere.port);
    let card_endpoint = endpoint.clone();
    let card = FakeAgent::start(
        "127.0.0.1",
        Arc::new(move |_, stream| {
            let body = format!(
                r#"{{"name":"c","supportedInterfaces":[{{"url":"{card_endpoint}","protocolBinding":"JSONRPC","protocolVersion":"1.0"}}]}}"#
            );
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
                body.len()
            );
            let _ = stream.write_all(head.as_bytes());
            let _ = stream.write_all(body.as_bytes());
        }),
    );
    let a2a = |extra: &str| {
        format!(
            "[[agents]]\nname = \"agent\"\nprotocol = \"a2a\"\nfrontends = [\"code\"]\nurl = \"http://127.0.0.1:{}\"\ntimeout_ms = 5000\n{extra}",
            card.port
        )
    };
    let daemon = gateway_to("outbound-card", &a2a(""), 30_000).await;
    let (status, answer) = post(&daemon.http, "/nlip", ir_request(5, "card-1").to_string().as_bytes()).await;
    assert_eq!((status, error_code(&answer)), (502, "a2a_card_invalid"), "{answer}");
    assert_eq!(elsewhere.connections.load(Ordering::SeqCst), 0, "nothing went to the card's endpoint");
    drop(daemon);
    let allowed = a2a(&format!("card_origins = [\"http://127.0.0.2:{}\"]\n", elsewhere.port));
    let daemon = gateway_to("outbound-card-allowed", &allowed, 30_000).await;
    let (status, answer) = post(&daemon.http, "/nlip", ir_request(6, "card-2").to_string().as_bytes()).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["content"], "from elsewhere", "{answer}");
    assert_eq!(elsewhere.connections.load(Ordering::SeqCst), 1);
}

/// An A2A agent answering 3 MiB (past twice `nlip.max_message_bytes`, the A2A allowance for
/// JSON-RPC framing) is cut there, and a 700 KiB answer that fits the body allowance is still
/// held to the NLIP limits once mapped (here: more submessages than the limit).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_a2a_agents_answers_are_held_to_the_byte_bound_and_the_nlip_limits() {
    let huge = Arc::new(AtomicBool::new(true));
    let which = huge.clone();
    let agent = FakeAgent::start(
        "127.0.0.1",
        Arc::new(move |head, stream| {
            let body = if head.starts_with("GET") {
                let port = stream.local_addr().unwrap().port();
                format!(
                    r#"{{"name":"big","supportedInterfaces":[{{"url":"http://127.0.0.1:{port}/","protocolBinding":"JSONRPC","protocolVersion":"1.0"}}]}}"#
                )
            } else if which.load(Ordering::SeqCst) {
                let text = "x".repeat(3 << 20);
                format!(
                    r#"{{"jsonrpc":"2.0","id":1,"result":{{"message":{{"messageId":"a","role":"ROLE_AGENT","parts":[{{"text":"{text}"}}]}}}}}}"#
                )
            } else {
                let parts: Vec<String> = (0..1000).map(|_| r#"{"text":"p"}"#.to_owned()).collect();
                format!(
                    r#"{{"jsonrpc":"2.0","id":1,"result":{{"message":{{"messageId":"a","role":"ROLE_AGENT","parts":[{}]}}}}}}"#,
                    parts.join(",")
                )
            };
            // One request a connection: the card and the call must not share a pooled
            // connection that this agent has already closed.
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: {}\r\n\r\n",
                body.len()
            );
            let _ = stream.write_all(head.as_bytes());
            let _ = stream.write_all(body.as_bytes());
        }),
    );
    let a2a = format!(
        "[[agents]]\nname = \"agent\"\nprotocol = \"a2a\"\nfrontends = [\"code\"]\nurl = \"http://127.0.0.1:{}\"\n",
        agent.port
    );
    let daemon = gateway_to("outbound-a2a-big", &a2a, 30_000).await;
    let (status, answer) =
        post(&daemon.http, "/nlip", ir_request(7, "a2a-big-1").to_string().as_bytes()).await;
    assert_eq!((status, error_code(&answer)), (502, "answer_too_large"), "{answer}");
    huge.store(false, Ordering::SeqCst);
    let (status, answer) =
        post(&daemon.http, "/nlip", ir_request(8, "a2a-big-2").to_string().as_bytes()).await;
    assert_eq!((status, error_code(&answer)), (502, "invalid_answer"), "{answer}");
    assert!(answer.to_string().contains("submessages"), "says which limit: {answer}");
}
