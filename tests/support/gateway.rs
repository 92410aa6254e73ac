//! A silpgate in front of test agents: its configuration for a test's broker names, starting
//! it, talking to it over HTTP, and the SILP requests the bridge tests send (each names its
//! own `order<i>`, so that an answer tells which request it belongs to).

#![allow(dead_code, reason = "each test binary uses its own part of the support module")]

use super::broker::{self, Daemon, Names};
use lapin::options::QueueDeclareOptions;
use lapin::types::FieldTable;
use serde_json::{Value, json};
use silpgate::silp::{self, Frontend};
use std::path::Path;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Upper bound of every wait for the broker, the daemon or a test agent.
pub const LONG: Duration = Duration::from_secs(90);

/// A silpgate configuration: the listener (no rate limits), the store, the AMQP side for
/// `names` when `amqp`, a reply timeout, and these agents, streams and routes.
pub fn config(names: &Names, store: &Path, amqp: bool, reply_timeout_ms: u64, rest: &str) -> String {
    let amqp = if amqp {
        format!(
            r#"[amqp]
url = "{url}"
inbound = ["{inbound}"]
inbound_exchange = "{inbound_x}"
agents_exchange = "{agents}"
dead_letter_exchange = "{dlx}"
dead_letter_queue = "{dead}"
reply_queue = "{answers}"
retry_initial_ms = 100
retry_max_ms = 2000
max_attempts = 100
reconnect_initial_ms = 100
reconnect_max_ms = 1000
reply_prefixes = ["sgtest."]
"#,
            url = broker::url(),
            inbound = names.inbound(),
            inbound_x = names.inbound_exchange(),
            agents = names.agents_exchange(),
            dlx = names.dlx(),
            dead = names.dead(),
            answers = names.answers(),
        )
    } else {
        String::new()
    };
    format!(
        r#"[gateway]
name = "silpgate-test"
reply_timeout_ms = {reply_timeout_ms}
[sessions]
heartbeat = 9999
[store]
path = "{store}"
[http]
listen = "127.0.0.1:0"
plain = true
client_rate = 0.0
connection_rate = 0.0
{amqp}
{rest}
"#,
        store = store.display(),
    )
}

/// Starts silpgate and, when `ready`, waits until it is connected to the broker.
pub async fn start(config_text: &str, dir: &Path, ready: bool) -> Daemon {
    let daemon = Daemon::start(config_text, dir);
    tokio::task::spawn_blocking(move || {
        if ready {
            daemon.wait_ready(Duration::from_secs(30));
        }
        daemon
    })
    .await
    .unwrap()
}

/// A request carrying SILP as the IR: `cancel(order<i>)` in conversation `conv`.
pub fn ir_request(i: usize, conv: &str) -> Value {
    let ir = silp::decode(&format!("cancel(order{i})"), Frontend::Code, &silp::DecodeOptions::default())
        .expect("valid SILP")
        .ir
        .to_value();
    json!({"format":"structured","subformat":"silp-ir","content": ir,
           "submessages":[{"format":"token","subformat":"conversation","content": conv}]})
}

/// The turns named by the session renewal notices a message carries among its submessages.
pub fn renewal_turns(message: &Value) -> Vec<u64> {
    let subs = message["submessages"].as_array().cloned().unwrap_or_default();
    subs.iter()
        .filter(|s| s["label"] == "silp-renewal")
        .filter_map(|s| s["content"]["turn"].as_u64())
        .collect()
}

/// The `i` of the `order<i>` a text names.
pub fn order_in(text: &str) -> Option<usize> {
    let at = text.find("order")? + "order".len();
    text[at..].split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
}

/// One POST on a fresh connection: status and JSON body (`null` when there is none), bounded.
pub async fn post(addr: &str, path: &str, body: &[u8]) -> (u16, Value) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("silpgate listens");
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(body).await.unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(LONG, stream.read_to_end(&mut raw))
        .await
        .expect("an HTTP answer within the bound")
        .unwrap();
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").expect("a complete response");
    let status = String::from_utf8_lossy(&raw[..split]).split_whitespace().nth(1).unwrap().parse().unwrap();
    let body = serde_json::from_slice(&raw[split + 4..]).unwrap_or(Value::Null);
    (status, body)
}

/// Declares a durable quorum queue of the test's own (a sender's reply queue).
pub async fn declare(channel: &lapin::Channel, queue: &str) {
    let options = QueueDeclareOptions { durable: true, ..QueueDeclareOptions::default() };
    let mut arguments = FieldTable::default();
    arguments.insert("x-queue-type".into(), lapin::types::AMQPValue::LongString("quorum".into()));
    channel.queue_declare(queue.into(), options, arguments).await.unwrap();
}
