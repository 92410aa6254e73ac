//! One request, one answer, through every door to every kind of agent: a 12-request
//! conversation from each door (HTTP, WebSocket, AMQP, the A2A door) to each kind of agent
//! (AMQP, HTTP, WebSocket, A2A, MCP) gets exactly 12 answers, each its own request's, in
//! order, none a control notice, with the session renewing every 10 turns on the way (the
//! notices reach the agent inside the requests that carry them); every turn is counted once
//! (24 a conversation) and no answer is orphaned. Real parts: RabbitMQ,
//! silpgate as a process, the A2A and MCP SDK servers, agents on lapin, axum and
//! tokio-tungstenite in the test.

mod support;

use futures_util::{SinkExt, StreamExt};
use lapin::BasicProperties;
use serde_json::{Value, json};
use silpgate::nlip::{self, Encoding, Limits};
use std::sync::Arc;
use support::agents::{self, HttpAgent, PythonServer};
use support::broker::{self, Names};
use support::gateway::{self, LONG, declare, order_in, post};
use tokio_tungstenite::tungstenite::Message as Frame;

/// Enough for each conversation (two turns a request: the request and its answer) to renew
/// twice, at turns 11 and 21.
const TURNS: usize = 12;
const DOORS: [&str; 4] = ["http", "ws", "amqp", "a2a"];
const AGENTS: [&str; 5] = ["amqp", "http", "ws", "a2a", "mcp"];

/// The renewal notices an agent finds in its requests, by the turn each names.
type Renewals = Arc<std::sync::Mutex<Vec<u64>>>;

/// The echo agent's behaviour, writing down the renewal notices each request carries.
fn echo_noting_renewals(renewals: &Renewals) -> agents::Behaviour {
    let (echo, renewals) = (agents::echo_code(), renewals.clone());
    Arc::new(move |request| {
        let request_json: Value = serde_json::from_str(&nlip::to_json(request)).unwrap();
        renewals.lock().unwrap().extend(gateway::renewal_turns(&request_json));
        echo(request)
    })
}

/// A WebSocket agent on JSON frames answering every request with `behaviour`'s answer.
async fn ws_agent(behaviour: agents::Behaviour) -> (std::net::SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let echo = behaviour.clone();
            tokio::spawn(async move {
                let Ok(mut socket) = tokio_tungstenite::accept_async(tcp).await else { return };
                while let Some(Ok(frame)) = socket.next().await {
                    // Pings are answered by tungstenite as it reads; only text frames are requests.
                    let Frame::Text(text) = frame else { continue };
                    let request = nlip::decode(text.as_bytes(), Encoding::Json, &Limits::default()).unwrap();
                    if let Some(answer) = echo(&request) {
                        let _ = socket.send(Frame::Text(nlip::to_json(&answer).into())).await;
                    }
                }
            });
        }
    });
    (addr, task)
}

/// The configuration: one agent of each kind, each reached by the label `to-<kind>`.
fn agents_and_routes(names: &Names, http: u16, ws: std::net::SocketAddr, a2a: u16, mcp: u16) -> String {
    let sink = names.sink();
    let mut text = format!(
        r#"[[agents]]
name = "amqp"
frontends = ["code"]
routing_key = "{sink}"
queue = "{sink}"
[[agents]]
name = "http"
frontends = ["code"]
url = "http://127.0.0.1:{http}/nlip"
[[agents]]
name = "ws"
frontends = ["code"]
url = "ws://{ws}/agent"
encoding = "json"
[[agents]]
name = "a2a"
protocol = "a2a"
frontends = ["code"]
url = "http://127.0.0.1:{a2a}"
[[agents]]
name = "mcp"
protocol = "mcp"
frontends = ["code"]
url = "http://127.0.0.1:{mcp}/mcp"
tool = "plan"
"#
    );
    for agent in AGENTS {
        text.push_str(&format!(
            "[[routes]]\nname = \"to-{agent}\"\ndestination = \"{agent}\"\nmode = \"encode\"\n[routes.match]\nlabel = \"to-{agent}\"\n"
        ));
    }
    text
}

fn conversation(door: &str, agent: &str) -> String {
    format!("every-{door}-{agent}")
}

/// Request `i` of the conversation from `door` to `agent`, as NLIP.
fn request(i: usize, door: &str, agent: &str) -> Value {
    json!({"format":"structured","subformat":"silp-code","content":format!("cancel(order{i})"),
           "label":format!("to-{agent}"),
           "submessages":[{"format":"token","subformat":"conversation","content":conversation(door, agent)}]})
}

/// The NLIP answer's SILP code text; fails on anything else (an error, a notice).
fn code_of(answer: &Value, what: &str) -> String {
    assert_ne!(answer["messagetype"], "control", "{what}: a notice in an answer's place: {answer}");
    assert_ne!(answer["messagetype"], "error", "{what}: {answer}");
    assert_eq!(answer["subformat"], "silp-code", "{what}: {answer}");
    answer["content"].as_str().unwrap_or_default().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twelve_requests_through_every_door_to_every_kind_of_agent_get_twelve_answers_in_order() {
    let names = Names::new("every-door");
    let dir = broker::temp_dir("every-door");
    let store = dir.join("store");
    let a2a = PythonServer::start("a2a_agent.py");
    let mcp = PythonServer::start("mcp_tool.py");
    // The agents that are sent NLIP itself write down the renewal notices they find.
    let renewals: [(&str, Renewals); 3] = ["amqp", "http", "ws"].map(|agent| (agent, Renewals::default()));
    let http_echo = echo_noting_renewals(&renewals[1].1);
    let http = HttpAgent::start(Arc::new(move |_, request| (200, http_echo(request)))).await;
    let (ws, _ws_task) = ws_agent(echo_noting_renewals(&renewals[2].1)).await;
    let rest = agents_and_routes(&names, http.addr.port(), ws, a2a.port, mcp.port);
    // Sessions renew every 10 turns, so that notices fall among the answers.
    let config =
        gateway::config(&names, &store, true, 30_000, &rest).replace("heartbeat = 9999", "heartbeat = 10");
    let daemon = gateway::start(&config, &dir, true).await;
    let (_connection, channel) = broker::channel().await;
    declare(&channel, &names.replies()).await;
    let _amqp_agent =
        agents::amqp_agent(channel.clone(), &names.sink(), echo_noting_renewals(&renewals[0].1)).await;
    let (mut socket, _) =
        tokio_tungstenite::connect_async(format!("ws://{}/nlip/ws/text", daemon.http)).await.unwrap();

    for agent in AGENTS {
        for door in DOORS {
            for i in 0..TURNS {
                let what = format!("{door} to {agent}, request {i}");
                let asked = request(i, door, agent);
                let code = match door {
                    "http" => {
                        let (status, answer) =
                            post(&daemon.http, "/nlip", asked.to_string().as_bytes()).await;
                        assert_eq!(status, 200, "{what}: {answer}");
                        code_of(&answer, &what)
                    }
                    "ws" => {
                        socket.send(Frame::Text(asked.to_string().into())).await.unwrap();
                        let frame =
                            tokio::time::timeout(LONG, socket.next()).await.expect("an answer on the socket");
                        let Some(Ok(Frame::Text(text))) = frame else {
                            panic!("{what}: a text frame: {frame:?}")
                        };
                        code_of(&serde_json::from_str(&text).unwrap(), &what)
                    }
                    "amqp" => {
                        let properties = BasicProperties::default()
                            .with_content_type("application/json".into())
                            .with_message_id(format!("{door}-{agent}-{i}").into())
                            .with_correlation_id(format!("c-{i}").into())
                            .with_reply_to(names.replies().into());
                        let one = vec![(names.inbound(), asked.to_string().into_bytes(), properties)];
                        broker::publish_all(&channel, &names.inbound_exchange(), one).await;
                        let got =
                            broker::collect(&channel, &names.replies(), LONG, |got| !got.is_empty()).await;
                        assert_eq!(
                            got[0].correlation_id.as_deref(),
                            Some(format!("c-{i}").as_str()),
                            "{what}"
                        );
                        code_of(&serde_json::from_slice(&got[0].body).unwrap(), &what)
                    }
                    _ => {
                        let part = json!({"text": format!("cancel(order{i})"),
                            "metadata": {"nlip": {"format": "structured", "subformat": "silp-code", "label": format!("to-{agent}")}}});
                        let send = json!({"jsonrpc":"2.0","id":i,"method":"SendMessage",
                            "params":{"message":{"messageId":format!("m-{i}"),"role":"ROLE_USER","parts":[part],
                                                 "contextId":conversation(door, agent)}}});
                        let (status, answer) = post(&daemon.http, "/a2a", send.to_string().as_bytes()).await;
                        assert_eq!(status, 200, "{what}: {answer}");
                        let message = &answer["result"]["message"];
                        assert_eq!(message["role"], "ROLE_AGENT", "{what}: an answer, not a task: {answer}");
                        assert_eq!(
                            message["parts"][0]["metadata"]["nlip"]["subformat"], "silp-code",
                            "{what}: {answer}"
                        );
                        message["parts"][0]["text"].as_str().unwrap_or_default().to_owned()
                    }
                };
                assert_eq!(order_in(&code), Some(i), "{what}: its own answer, in order: {code}");
            }
        }
    }
    let (_, metrics) = daemon.get("/metrics");
    let orphaned: f64 = metrics
        .lines()
        .filter(|l| l.starts_with("silpgate_replies_orphaned_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(orphaned, 0.0, "no answer went unclaimed");
    // Each door's conversation with each of these agents renewed after turns 10 and 20; turns
    // 11 and 21 are requests, so the agent got both notices, once each, inside them.
    for (agent, renewals) in &renewals {
        let mut renewed = renewals.lock().unwrap().clone();
        renewed.sort_unstable();
        assert_eq!(renewed, [11, 11, 11, 11, 21, 21, 21, 21], "the renewal notices the {agent} agent got");
    }
    let (status, _) = tokio::task::spawn_blocking(move || daemon.terminate(LONG)).await.unwrap();
    assert!(status.success());
    let turns = broker::session_turns(&store);
    for agent in AGENTS {
        for door in DOORS {
            let token = conversation(door, agent);
            assert_eq!(
                turns.get(&token),
                Some(&(2 * TURNS as u64)),
                "{token}: requests and answers, once each"
            );
        }
    }
}
