//! Every door reaches every agent, and every answer comes back through silpgate to whoever
//! asked, in the form the asker reads. Real parts throughout: RabbitMQ, silpgate as a process,
//! an AMQP agent on lapin, an HTTP agent on axum, the Python NLIP server, WebSocket clients.
//! Messages are counted by id; every wait has a bound and says what it waited for.

mod support;

use futures_util::{SinkExt, StreamExt};
use lapin::BasicProperties;
use serde_json::{Value, json};
use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use support::agents::{self, HttpAgent};
use support::broker::{self, Daemon, Names};
use support::gateway::{self, LONG, declare, ir_request, order_in, post, renewal_turns};
use tokio_tungstenite::tungstenite::Message as Frame;

/// The AMQP agent `planner` (reads SILP code) behind its own queue, reached from `source`.
fn planner(names: &Names, source: &str, extra_route: &str) -> String {
    format!(
        r#"[[agents]]
name = "planner"
frontends = ["code"]
routing_key = "{sink}"
queue = "{sink}"
{route}"#,
        sink = names.sink(),
        route = route_to_planner(source, extra_route),
    )
}

/// A route from `source` to the planner.
fn route_to_planner(source: &str, extra_route: &str) -> String {
    format!(
        r#"[[routes]]
name = "{source}-to-planner"
destination = "planner"
mode = "encode"
{extra_route}
[routes.match]
source = "{source}"
"#
    )
}

/// Which request an IR answer belongs to: the `i` of its `order<i>`.
fn order_of(answer: &Value) -> Option<usize> {
    assert_eq!(answer["subformat"], "silp-ir", "the asker reads the IR: {answer}");
    order_in(&answer["content"].to_string())
}

/// This file's silpgate: on the broker, answers awaited up to `reply_timeout_ms`.
fn config(names: &Names, store: &Path, reply_timeout_ms: u64, agents_and_routes: &str) -> String {
    gateway::config(names, store, true, reply_timeout_ms, agents_and_routes)
}

fn error_code(message: &Value) -> &str {
    message["submessages"][0]["content"]["code"].as_str().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_clients_reach_an_amqp_agent_and_each_socket_gets_its_own_answers() {
    const SOCKETS: usize = 20;
    const EACH: usize = 50;
    let names = Names::new("ws-amqp");
    let dir = broker::temp_dir("bridges-ws");
    let daemon =
        gateway::start(&config(&names, &dir.join("store"), 30_000, &planner(&names, "ws", "")), &dir, true)
            .await;
    let (_connection, channel) = broker::channel().await;
    let agent = agents::amqp_agent(channel.clone(), &names.sink(), agents::echo_code()).await;

    // The clients are Python's `websockets`, as an NLIP client in Python would write them.
    let requests = dir.join("requests.jsonl");
    let lines: Vec<String> = (0..SOCKETS * EACH)
        .map(|i| {
            json!({"socket": i / EACH, "i": i, "envelope": ir_request(i, &format!("ws-conv-{}", i / EACH))})
                .to_string()
        })
        .collect();
    std::fs::write(&requests, lines.join("\n")).unwrap();
    let python = std::env::var("SILPGATE_PYTHON").unwrap_or_else(|_| "target/pyenv/bin/python".into());
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/interop/ws_many.py");
    let url = format!("ws://{}/nlip/ws/text", daemon.http);
    let mut command = std::process::Command::new(&python);
    command.args([script, url.as_str()]).arg(&requests);
    let output =
        tokio::task::spawn_blocking(move || support::process::run_bounded(command, LONG)).await.unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}{}", String::from_utf8_lossy(&output.stderr));
    assert!(
        stdout.contains(&format!("ok: {} answers", SOCKETS * EACH)),
        "every socket got its own answers: {stdout}"
    );
    assert_eq!(
        agent.received.load(std::sync::atomic::Ordering::SeqCst),
        SOCKETS * EACH,
        "delivered once each"
    );
    drop(daemon);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_amqp_sender_speaking_ir_gets_the_agents_code_answer_as_ir_at_its_reply_to() {
    const N: usize = 20;
    let names = Names::new("amqp-amqp");
    let dir = broker::temp_dir("bridges-amqp");
    let store = dir.join("store");
    let daemon =
        gateway::start(&config(&names, &store, 30_000, &planner(&names, &names.inbound(), "")), &dir, true)
            .await;
    let (_connection, channel) = broker::channel().await;
    declare(&channel, &names.replies()).await;
    let agent = agents::amqp_agent(channel.clone(), &names.sink(), agents::echo_code()).await;

    let messages = (0..N)
        .map(|i| {
            let properties = BasicProperties::default()
                .with_content_type("application/json".into())
                .with_message_id(format!("m-{i}").into())
                .with_correlation_id(format!("c-{i}").into())
                .with_reply_to(names.replies().into());
            (names.inbound(), ir_request(i, "amqp-conv").to_string().into_bytes(), properties)
        })
        .collect();
    broker::publish_all(&channel, &names.inbound_exchange(), messages).await;
    let answers = broker::collect(&channel, &names.replies(), LONG, |got| got.len() == N).await;
    assert_eq!(answers.len(), N, "every request is answered at its reply_to");
    let mut seen = BTreeSet::new();
    for r in &answers {
        let answer: Value = serde_json::from_slice(&r.body).unwrap();
        let i = order_of(&answer).expect("an answer to one of the requests");
        assert_eq!(
            r.correlation_id.as_deref(),
            Some(format!("c-{i}").as_str()),
            "the sender's correlation id"
        );
        seen.insert(i);
    }
    assert_eq!(seen.len(), N);
    assert_eq!(agent.received.load(std::sync::atomic::Ordering::SeqCst), N);
    let (status, _) = tokio::task::spawn_blocking(move || daemon.terminate(LONG)).await.unwrap();
    assert!(status.success());
    let turns = broker::session_turns(&store);
    assert_eq!(turns.get("amqp-conv"), Some(&(2 * N as u64)), "requests and answers are turns: {turns:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_reaches_the_python_nlip_server_and_the_sdk_reads_the_answer() {
    let python = std::env::var("SILPGATE_PYTHON").unwrap_or_else(|_| "target/pyenv/bin/python".into());
    let listening = format!("{}/tests/interop/listening.py", env!("CARGO_MANIFEST_DIR"));
    let mut command = std::process::Command::new(&python);
    command.args([listening.as_str(), "nlip_server.echo:app", "0"]);
    let (server, port) = agents::spawn_listening(command, "the Python NLIP server")
        .unwrap_or_else(|e| panic!("{e} (tests/run.sh installs nlip-server)"));
    struct Reaped(std::process::Child);
    impl Drop for Reaped {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let _server = Reaped(server);
    let names = Names::new("http-python");
    let dir = broker::temp_dir("bridges-python");
    let agents_and_routes = format!(
        r#"[[agents]]
name = "echo"
frontends = []
url = "http://127.0.0.1:{port}/nlip/"
[[routes]]
name = "to-echo"
destination = "echo"
mode = "transcode"
[routes.match]
source = "http"
"#
    );
    let daemon =
        gateway::start(&config(&names, &dir.join("store"), 30_000, &agents_and_routes), &dir, true).await;
    let request = json!({"format":"text","subformat":"english","content":"hello over the gateway",
        "submessages":[{"format":"token","subformat":"conversation","content":"py-1"}]});
    let (status, answer) = post(&daemon.http, "/nlip", request.to_string().as_bytes()).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["content"], "hello over the gateway", "the agent's answer: {answer}");
    let mut sdk = std::process::Command::new(&python);
    sdk.args([
        "-c",
        "import sys; from nlip_sdk.nlip import NLIP_Message; m = NLIP_Message.model_validate_json(sys.argv[1]); print(m.content)",
    ])
    .arg(answer.to_string());
    let parsed = tokio::task::spawn_blocking(move || support::process::run_bounded(sdk, LONG)).await.unwrap();
    assert!(
        parsed.status.success(),
        "the SDK refused the answer: {}",
        String::from_utf8_lossy(&parsed.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&parsed.stdout).trim(), "hello over the gateway");
    drop(daemon);
}

fn http_agent_route(names: &Names, agent: &HttpAgent) -> String {
    http_agent_route_from(&names.inbound(), agent)
}

/// The HTTP agent `worker`, reached by what comes from `source`.
fn http_agent_route_from(source: &str, agent: &HttpAgent) -> String {
    format!(
        r#"[[agents]]
name = "worker"
frontends = ["code"]
url = "http://{addr}/nlip"
timeout_ms = 2000
[[routes]]
name = "to-worker"
destination = "worker"
mode = "transcode"
[routes.match]
source = "{source}"
"#,
        addr = agent.addr,
    )
}

/// silpgate in front of `agent`, and one SILP request sent to it over AMQP with a reply
/// address: the test's names, the daemon, and the test's broker channel.
async fn one_request_to(agent: &HttpAgent, test: &str) -> (Names, Daemon, lapin::Connection, lapin::Channel) {
    let names = Names::new(test);
    let dir = broker::temp_dir(&format!("bridges-{test}"));
    let config = config(&names, &dir.join("store"), 30_000, &http_agent_route(&names, agent));
    let daemon = gateway::start(&config, &dir, true).await;
    let (connection, channel) = broker::channel().await;
    declare(&channel, &names.replies()).await;
    let properties = code_request(0).with_reply_to(names.replies().into());
    let request = vec![(names.inbound(), broker::envelope(0, 0, None), properties)];
    broker::publish_all(&channel, &names.inbound_exchange(), request).await;
    (names, daemon, connection, channel)
}

fn code_request(i: usize) -> BasicProperties {
    BasicProperties::default()
        .with_content_type("application/json".into())
        .with_message_id(format!("m-{i}").into())
        .with_correlation_id(format!("c-{i}").into())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_agent_that_fails_three_times_gets_the_message_once_accepted_and_the_ack_waits() {
    let echo = agents::echo_code();
    let agent =
        HttpAgent::start(Arc::new(move |n, request| if n < 3 { (503, None) } else { (200, echo(request)) }))
            .await;
    let (names, daemon, _connection, channel) = one_request_to(&agent, "amqp-http-503").await;
    let answers = broker::collect(&channel, &names.replies(), LONG, |got| !got.is_empty()).await;
    assert_eq!(answers.len(), 1, "the answer reaches the sender once the agent accepted");
    let answer: Value = serde_json::from_slice(&answers[0].body).unwrap();
    assert_eq!(answer["content"], "cancel(order0)", "in the form the sender used: {answer}");
    assert_eq!(answers[0].correlation_id.as_deref(), Some("c-0"));
    assert_eq!(agent.received.load(std::sync::atomic::Ordering::SeqCst), 4, "three 503s, then accepted once");
    broker::wait_counts(&names.inbound(), (0, 0), "the inbound message is acknowledged after the 200").await;
    drop(daemon);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_agent_down_for_20_seconds_mid_stream_loses_nothing_and_counts_each_once() {
    const N: usize = 500;
    const CONVERSATIONS: usize = 25;
    let mut agent = HttpAgent::start({
        let echo = agents::echo_code();
        Arc::new(move |_, request| (200, echo(request)))
    })
    .await;
    let names = Names::new("amqp-http-down");
    let dir = broker::temp_dir("bridges-down");
    let store = dir.join("store");
    let daemon =
        gateway::start(&config(&names, &store, 30_000, &http_agent_route(&names, &agent)), &dir, true).await;
    let (_connection, channel) = broker::channel().await;
    declare(&channel, &names.replies()).await;
    let messages = (0..N)
        .map(|i| {
            let properties = code_request(i).with_reply_to(names.replies().into());
            (names.inbound(), broker::envelope(i, i % CONVERSATIONS, None), properties)
        })
        .collect();
    let publisher = {
        let channel = channel.clone();
        let inbound_x = names.inbound_exchange();
        tokio::spawn(async move { broker::publish_all(&channel, &inbound_x, messages).await })
    };
    let deadline = tokio::time::Instant::now() + LONG;
    while agent.received.load(std::sync::atomic::Ordering::SeqCst) < N / 5 {
        assert!(tokio::time::Instant::now() < deadline, "the agent got too little before the outage");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    agent.stop();
    let at_outage = agent.received.load(std::sync::atomic::Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(20)).await;
    agent.restart().await;
    publisher.await.unwrap();

    let answers = broker::collect(&channel, &names.replies(), LONG, |got| {
        got.iter().map(|r| r.correlation_id.clone()).collect::<BTreeSet<_>>().len() == N
    })
    .await;
    let answered: BTreeSet<_> = answers.iter().filter_map(|r| r.correlation_id.clone()).collect();
    assert_eq!(answered.len(), N, "every message is answered after the outage");
    let codes: BTreeSet<String> = agent.codes.lock().unwrap().iter().cloned().collect();
    assert_eq!(codes.len(), N, "every message reached the agent");
    let after = agent.received.load(std::sync::atomic::Ordering::SeqCst);
    assert!(
        after > at_outage,
        "requests were still to go at the outage ({at_outage} had arrived) and came after it"
    );
    let (status, _) = tokio::task::spawn_blocking(move || daemon.terminate(LONG)).await.unwrap();
    assert!(status.success());
    let turns = broker::session_turns(&store);
    let mut per_conversation: HashMap<String, u64> = HashMap::new();
    for c in 0..CONVERSATIONS {
        per_conversation.insert(format!("conv-{c}"), 2 * (N / CONVERSATIONS) as u64);
    }
    for (conversation, expected) in &per_conversation {
        assert_eq!(
            turns.get(conversation),
            Some(expected),
            "{conversation}: each request and answer counted once"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_never_answers_times_out_and_its_late_answer_is_dead_lettered() {
    let names = Names::new("timeout");
    let dir = broker::temp_dir("bridges-timeout");
    let routes = format!("{}{}", planner(&names, "http", ""), route_to_planner("ws", ""));
    let daemon = gateway::start(&config(&names, &dir.join("store"), 1_000, &routes), &dir, true).await;
    let (_connection, channel) = broker::channel().await;

    let (status, answer) =
        post(&daemon.http, "/nlip", ir_request(7, "late-conv").to_string().as_bytes()).await;
    assert_eq!(status, 504, "{answer}");
    assert_eq!(error_code(&answer), "timeout", "{answer}");

    let (mut ws, _) =
        tokio_tungstenite::connect_async(format!("ws://{}/nlip/ws/text", daemon.http)).await.unwrap();
    ws.send(Frame::Text(ir_request(8, "late-conv-ws").to_string().into())).await.unwrap();
    let frame = tokio::time::timeout(LONG, ws.next()).await.expect("an answer on the socket");
    let Some(Ok(Frame::Text(text))) = frame else { panic!("a text frame") };
    let answer: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(error_code(&answer), "timeout", "{answer}");

    // The agent answers after all: nobody waits, and the answer is kept with its reason.
    let requests = broker::collect(&channel, &names.sink(), LONG, |got| got.len() == 2).await;
    assert_eq!(requests.len(), 2, "both requests reached the agent's queue");
    let late = BasicProperties::default()
        .with_content_type("application/json".into())
        .with_correlation_id(requests[0].correlation_id.clone().expect("a correlation id").into());
    let body = json!({"format":"structured","subformat":"silp-code","content":"cancel(order7)"}).to_string();
    broker::publish_all(&channel, "", vec![(names.answers(), body.into_bytes(), late)]).await;
    let dead = broker::collect(&channel, &names.dead(), LONG, |got| !got.is_empty()).await;
    assert_eq!(dead.len(), 1, "the late answer is dead-lettered, not dropped");
    assert_eq!(dead[0].headers.get("x-silpgate-error-code").map(String::as_str), Some("timeout"));
    drop(daemon);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_that_awaits_nothing_answers_202_once_the_broker_confirmed() {
    let names = Names::new("await-none");
    let dir = broker::temp_dir("bridges-await");
    let config = config(&names, &dir.join("store"), 30_000, &planner(&names, "http", "await = \"none\""));
    let daemon = gateway::start(&config, &dir, true).await;
    let (_connection, channel) = broker::channel().await;
    let (status, answer) =
        post(&daemon.http, "/nlip", ir_request(3, "fire-conv").to_string().as_bytes()).await;
    assert_eq!(status, 202, "{answer}");
    assert_eq!(answer["messagetype"], "control", "{answer}");
    let id = answer["content"]["delivered"][0].as_str().expect("the delivered message's id").to_owned();
    let delivered = broker::collect(&channel, &names.sink(), LONG, |got| !got.is_empty()).await;
    assert_eq!(delivered.len(), 1);
    assert_eq!(delivered[0].message_id, id, "the id names the message the agent got");
    assert_eq!(delivered[0].reply_to, None, "nobody waits for an answer");
    drop(daemon);
}

/// The README's quick start: `silpgate run --config config/silpgate.toml`, the example agent on
/// the default assistant queue, and the README's plain text message, answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_quick_start_answers_a_text_message_through_the_example_agent() {
    let bin = std::path::PathBuf::from(env!("CARGO_BIN_EXE_silpgate"));
    let example = bin.parent().unwrap().join("examples/echo_agent");
    assert!(example.exists(), "{} is built by `cargo build --examples` (tests/run.sh)", example.display());
    let dir = broker::temp_dir("bridges-readme");
    let config = concat!(env!("CARGO_MANIFEST_DIR"), "/config/silpgate.toml");
    // The defaults, on a free port and a scratch store, as environment overrides.
    let mut command = std::process::Command::new(&bin);
    command
        .args(["run", "--config", config])
        .env("SILPGATE_HTTP_LISTEN", "127.0.0.1:0")
        .env("SILPGATE_STORE_PATH", dir.join("store"));
    let daemon = Daemon::spawn(command);
    let daemon = tokio::task::spawn_blocking(move || {
        daemon.wait_ready(Duration::from_secs(30));
        daemon
    })
    .await
    .unwrap();
    let mut agent = std::process::Command::new(&example)
        .args(["--queue", "agent.assistant"])
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("the example agent runs");
    let request = br#"{"format":"text","subformat":"english","content":"hello"}"#;
    let (status, answer) = post(&daemon.http, "/nlip", request).await;
    let _ = agent.kill();
    let _ = agent.wait();
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["content"], "hello (answered by echo_agent)", "{answer}");
}

/// An HTTP agent that refuses a message with a 4xx and an NLIP error: the message is poison,
/// dead-lettered with the agent's own error code, and the sender hears the agent's error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_agent_that_refuses_a_message_has_it_dead_lettered_with_its_code() {
    let agent = HttpAgent::start(Arc::new(|_, _| {
        let refusal = silpgate::nlip::reply::error_message(
            "unsupported_frontend",
            "this agent reads natural language only",
            &silpgate::nlip::reply::Location::None,
        );
        (422, Some(refusal))
    }))
    .await;
    let (names, daemon, _connection, channel) = one_request_to(&agent, "amqp-http-422").await;
    let dead = broker::collect(&channel, &names.dead(), LONG, |got| !got.is_empty()).await;
    assert_eq!(dead.len(), 1, "the refused message is dead-lettered");
    assert_eq!(
        dead[0].headers.get("x-silpgate-error-code").map(String::as_str),
        Some("unsupported_frontend")
    );
    let told = broker::collect(&channel, &names.replies(), LONG, |got| !got.is_empty()).await;
    let late = broker::collect(&channel, &names.replies(), Duration::from_millis(300), |_| false).await;
    assert_eq!(told.len() + late.len(), 1, "one answer: the agent's own error");
    let answer: Value = serde_json::from_slice(&told[0].body).unwrap();
    assert_eq!(answer["submessages"][0]["content"]["code"], "unsupported_frontend", "{answer}");
    assert_eq!(
        answer["submessages"][0]["content"]["message"], "this agent reads natural language only",
        "{answer}"
    );
    assert_eq!(agent.received.load(std::sync::atomic::Ordering::SeqCst), 1, "a refusal is not retried");
    broker::wait_counts(&names.inbound(), (0, 0), "acknowledged once dead-lettered").await;
    drop(daemon);
}

/// Twelve SILP messages of one conversation published back to back, its session renewing every
/// 10 turns: every sender gets its own answer (never a notice in its place), the turns are
/// counted once each (24), and the two notices (turns 11 and 21) each reach exactly one side,
/// inside a message: the agent's request, or the sender's answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_ride_inside_messages_and_never_take_an_amqp_answers_place() {
    const N: usize = 12;
    let names = Names::new("amqp-renew");
    let dir = broker::temp_dir("bridges-renew");
    let store = dir.join("store");
    let config = config(&names, &store, 30_000, &planner(&names, &names.inbound(), ""))
        .replace("heartbeat = 9999", "heartbeat = 10");
    let daemon = gateway::start(&config, &dir, true).await;
    let (_connection, channel) = broker::channel().await;
    declare(&channel, &names.replies()).await;
    let seen_by_agent = Arc::new(std::sync::Mutex::new(Vec::new()));
    let echo = agents::echo_code();
    let seen = seen_by_agent.clone();
    let behaviour: agents::Behaviour = Arc::new(move |request: &silpgate::nlip::Message| {
        let json: Value = serde_json::from_str(&silpgate::nlip::to_json(request)).unwrap();
        seen.lock().unwrap().extend(renewal_turns(&json));
        echo(request)
    });
    let _agent = agents::amqp_agent(channel.clone(), &names.sink(), behaviour).await;
    let messages = (0..N)
        .map(|i| {
            let properties = code_request(i).with_reply_to(names.replies().into());
            (names.inbound(), broker::envelope(i, 0, None), properties)
        })
        .collect();
    broker::publish_all(&channel, &names.inbound_exchange(), messages).await;
    let answers = broker::collect(&channel, &names.replies(), LONG, |got| got.len() == N).await;
    // A last look for anything more (a second reply to one request).
    let more = broker::collect(&channel, &names.replies(), Duration::from_secs(1), |_| false).await;
    assert!(more.is_empty(), "one reply a request: {} more", more.len());
    let mut orders = BTreeSet::new();
    let mut seen_by_sender = Vec::new();
    for r in &answers {
        let answer: Value = serde_json::from_slice(&r.body).unwrap();
        assert_ne!(answer["messagetype"], "control", "a notice took an answer's place: {answer}");
        let i = order_in(&answer["content"].to_string()).expect("an answer to one of the requests");
        assert_eq!(r.correlation_id.as_deref(), Some(format!("c-{i}").as_str()), "its own request's answer");
        orders.insert(i);
        seen_by_sender.extend(renewal_turns(&answer));
    }
    assert_eq!(orders.len(), N, "every request answered once");
    let mut notices = seen_by_agent.lock().unwrap().clone();
    notices.extend(seen_by_sender);
    notices.sort_unstable();
    assert_eq!(notices, [11, 21], "each renewal notice reached one side once");
    let (status, _) = tokio::task::spawn_blocking(move || daemon.terminate(LONG)).await.unwrap();
    assert!(status.success());
    let conversation = "conv-0";
    let turns = broker::session_turns(&store);
    assert_eq!(turns.get(conversation), Some(&(2 * N as u64)), "requests and answers, once each: {turns:?}");
}

/// An AMQP agent configured with its broker `user` is the only one who can answer for it: an
/// answer with the right correlation id but without that user (anyone who may publish to the
/// reply queue) is dead-lettered as `forged_answer`, and the asker still gets the agent's own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_not_from_the_agents_broker_user_is_dead_lettered_and_the_real_one_goes_through() {
    let names = Names::new("forged");
    let dir = broker::temp_dir("bridges-forged");
    let agent = planner(&names, "http", "")
        .replace("frontends = [\"code\"]", "frontends = [\"code\"]\nuser = \"guest\"");
    let daemon = gateway::start(&config(&names, &dir.join("store"), 30_000, &agent), &dir, true).await;
    let (_connection, channel) = broker::channel().await;
    let http = daemon.http.clone();
    let asker = tokio::spawn(async move {
        post(&http, "/nlip", ir_request(4, "forged-conv").to_string().as_bytes()).await
    });
    let requests = broker::collect(&channel, &names.sink(), LONG, |got| !got.is_empty()).await;
    let correlation = requests[0].correlation_id.clone().expect("a correlation id to answer with");
    let reply_to = requests[0].reply_to.clone().expect("a reply queue");
    let answer = |code: &str| {
        json!({"format":"structured","subformat":"silp-code","content":code,
               "submessages":[{"format":"token","subformat":"conversation","content":"forged-conv"}]})
        .to_string()
        .into_bytes()
    };
    let properties = BasicProperties::default()
        .with_content_type("application/json".into())
        .with_correlation_id(correlation.into());
    // The forger knows the correlation id (the worst case) but is not the agent's user.
    let forged = properties.clone();
    broker::publish_all(&channel, "", vec![(reply_to.clone(), answer("book(attacker_choice)"), forged)])
        .await;
    let dead = broker::collect(&channel, &names.dead(), LONG, |got| !got.is_empty()).await;
    assert_eq!(dead[0].headers.get("x-silpgate-error-code").map(String::as_str), Some("forged_answer"));
    assert!(!asker.is_finished(), "the asker does not take the forged answer");
    let genuine = properties.with_user_id("guest".into());
    broker::publish_all(&channel, "", vec![(reply_to, answer("book(order4)"), genuine)]).await;
    let (status, got) = tokio::time::timeout(LONG, asker).await.expect("the asker is answered").unwrap();
    assert_eq!(status, 200, "{got}");
    assert_eq!(order_of(&got), Some(4), "the agent's own answer: {got}");
    assert!(!got.to_string().contains("attacker_choice"), "{got}");
    drop(daemon);
}

/// One request, one outcome: an HTTP agent slower than the reply timeout, then unavailable
/// (503), then answering at once. The AMQP sender hears `timeout` once; the retry that reaches
/// the agent waits for no answer, and its answer is not a second reply.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_after_a_timeout_never_gives_the_sender_a_second_reply() {
    let echo = agents::echo_code();
    let agent = HttpAgent::start(Arc::new(move |n, request| {
        if n == 0 {
            std::thread::sleep(Duration::from_millis(2500));
            return (503, None);
        }
        (200, echo(request))
    }))
    .await;
    let names = Names::new("timeout-once");
    let dir = broker::temp_dir("bridges-timeout-once");
    let config = config(&names, &dir.join("store"), 1_000, &http_agent_route(&names, &agent));
    let daemon = gateway::start(&config, &dir, true).await;
    let (_connection, channel) = broker::channel().await;
    declare(&channel, &names.replies()).await;
    let properties = code_request(0).with_reply_to(names.replies().into());
    let request = vec![(names.inbound(), broker::envelope(0, 0, None), properties)];
    broker::publish_all(&channel, &names.inbound_exchange(), request).await;
    let deadline = std::time::Instant::now() + LONG;
    while agent.received.load(std::sync::atomic::Ordering::SeqCst) < 2 {
        assert!(std::time::Instant::now() < deadline, "the retry reaches the agent");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let replies = broker::collect(&channel, &names.replies(), Duration::from_secs(3), |_| false).await;
    assert_eq!(replies.len(), 1, "one outcome at the sender: {replies:?}");
    let reply: Value = serde_json::from_slice(&replies[0].body).unwrap();
    assert_eq!(error_code(&reply), "timeout", "{reply}");
    assert_eq!(replies[0].correlation_id.as_deref(), Some("c-0"));
    assert_eq!(
        agent.received.load(std::sync::atomic::Ordering::SeqCst),
        2,
        "a slow failure, then accepted once"
    );
    broker::wait_counts(&names.inbound(), (0, 0), "the request is acknowledged once the agent took it").await;
    drop(daemon);
}

/// A front-door message whose delivery fails leaves no turn counted: its sender hears 503
/// and sends it again, and the conversation counts it once. An HTTP agent refuses the third
/// and fourth requests it gets (503), then answers again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_senders_message_that_fails_is_counted_once_when_sent_again() {
    let echo = agents::echo_code();
    let agent = HttpAgent::start(Arc::new(
        move |n, request| if n == 2 || n == 3 { (503, None) } else { (200, echo(request)) },
    ))
    .await;
    let names = Names::new("front-take-back");
    let dir = broker::temp_dir("bridges-front-take-back");
    let routes = http_agent_route_from("http", &agent);
    let config = gateway::config(&names, &dir.join("store"), false, 30_000, &routes);
    let daemon = gateway::start(&config, &dir, false).await;
    let mut codes = Vec::new();
    for i in [0, 1, 2, 2, 2, 3] {
        let (code, answer) = post(&daemon.http, "/nlip", &broker::envelope(i, 0, None)).await;
        if code == 200 {
            assert_eq!(answer["content"], format!("cancel(order{i})"), "the agent's answer: {answer}");
        }
        codes.push(code);
    }
    assert_eq!(codes, [200, 200, 503, 503, 200, 200], "the agent refused the 3rd and 4th requests");
    assert_eq!(agent.received.load(std::sync::atomic::Ordering::SeqCst), 6);
    daemon.terminate(LONG);
    let turns = broker::session_turns(&dir.join("store"));
    // Four requests and their four answers; the two refused attempts left nothing.
    assert_eq!(turns.get("conv-0"), Some(&8), "each request and answer counted once: {turns:?}");
}
