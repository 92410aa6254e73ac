//! The intake's lifecycle without a network: the core on an in-memory store, and agents
//! that are connectors scripted by the test.

use super::*;
use crate::config::Config;
use crate::connectors::{Connector, Delivered};
use crate::gateway::store::{MemoryStore, Store};
use crate::nlip::{Content, Format, Submessage};
use futures_util::future::BoxFuture;
use std::sync::Mutex;

const CONFIG: &str = r#"
[gateway]
reply_timeout_ms = 2000
[[agents]]
name = "worker"
frontends = ["code"]
url = "http://127.0.0.1:9/nlip"
[[routes]]
name = "to-worker"
destination = "worker"
mode = "transcode"
[routes.match]
source = "http"
"#;

/// An agent whose connector answers as the test says: in the call or later (or, `silent`,
/// not at all), failing the first `failures` deliveries.
struct Scripted {
    in_call: bool,
    silent: bool,
    failures: Mutex<usize>,
    received: Mutex<Vec<Parcel>>,
}

impl Scripted {
    fn new(in_call: bool, failures: usize) -> Arc<Scripted> {
        Arc::new(Scripted {
            in_call,
            silent: false,
            failures: Mutex::new(failures),
            received: Mutex::default(),
        })
    }

    fn silent() -> Arc<Scripted> {
        Arc::new(Scripted {
            in_call: true,
            silent: true,
            failures: Mutex::new(0),
            received: Mutex::default(),
        })
    }
}

impl Connector for Scripted {
    fn transport(&self) -> crate::transport::Transport {
        crate::transport::Transport::Http
    }

    fn answers_in_call(&self) -> bool {
        self.in_call
    }

    fn deliver(&self, parcels: Vec<Parcel>) -> BoxFuture<'_, Result<Delivered, DeliveryError>> {
        Box::pin(async move {
            {
                let mut failures = self.failures.lock().unwrap();
                if *failures > 0 {
                    *failures -= 1;
                    let detail = "scripted to fail".to_owned();
                    return Err(DeliveryError::Unavailable {
                        agent: "worker".into(),
                        code: "unavailable",
                        detail,
                    });
                }
            }
            let mut delivered = Delivered::default();
            if self.in_call && !self.silent {
                let request = parcels.last().expect("a delivery holds a parcel");
                delivered.answers.push((request.message_id.clone(), echo(&request.envelope)));
            }
            self.received.lock().unwrap().extend(parcels);
            Ok(delivered)
        })
    }
}

/// What a SILP agent answers: the code it was given, in its conversation.
fn echo(request: &Message) -> Message {
    let code = request.content.as_str().unwrap_or_default().to_owned();
    silp_message(&code, request.conversation_token().unwrap_or_default())
}

fn silp_message(code: &str, conversation: &str) -> Message {
    let mut message = Message::new(Format::Structured, "silp-code", Content::Json(code.into()));
    message.push(Submessage::new(Format::Token, "conversation", Content::Json(conversation.into())));
    message
}

fn intake_with(agent: Arc<Scripted>) -> (Intake, Arc<MemoryStore>) {
    let config = Arc::new(Config::parse(CONFIG).expect("the test's configuration"));
    let store = Arc::new(MemoryStore::new());
    let gateway = Gateway::new(config, store.clone());
    let agents = Agents::of([("worker".to_owned(), agent as Arc<dyn Connector>)]);
    (Intake::new(gateway, agents), store)
}

/// A front-door request in conversation `conv-1`, and the receiver of its later answer.
fn request(code: &str) -> (Arrival, tokio::sync::oneshot::Receiver<Message>) {
    let (path, answered) = InPlace::new(None);
    let arrival = Arrival {
        envelope: silp_message(code, "conv-1"),
        origin: Origin::new(Transport::Http, "http"),
        span: tracing::Span::none(),
        answers: Some(path),
        content_id: None,
    };
    (arrival, answered)
}

fn turns(store: &MemoryStore) -> u64 {
    store.session_by_token("conv-1").unwrap().map_or(0, |s| s.turns)
}

#[tokio::test]
async fn an_answer_given_in_the_call_comes_back_with_the_message_and_starts_no_wait() {
    let (intake, store) = intake_with(Scripted::new(true, 0));
    let (arrival, _answered) = request("cancel(order1)");
    let taken = intake.take(arrival).await.expect("delivered");
    let answer = taken.answer.expect("the agent's answer, in hand");
    assert_eq!(answer.content.as_str(), Some("cancel(order1)"), "in the form the sender wrote: {answer:?}");
    assert_eq!(taken.awaiting, None);
    assert_eq!(intake.waiting().len(), 0, "no wait was started for an answer already in hand");
    assert_eq!(turns(&store), 2, "the request's turn and the answer's");
}

#[tokio::test]
async fn an_answer_that_comes_later_goes_to_the_wait_its_request_left() {
    let agent = Scripted::new(false, 0);
    let (intake, store) = intake_with(agent.clone());
    let (arrival, answered) = request("cancel(order2)");
    let taken = intake.take(arrival).await.expect("delivered");
    let correlation = taken.awaiting.expect("a wait for the agent's answer");
    assert!(taken.answer.is_none());
    assert_eq!(intake.waiting().len(), 1);
    let parcel = agent.received.lock().unwrap().pop().expect("the agent got the request");
    assert_eq!(parcel.answer_to.correlation(), Some(correlation.as_str()));
    let from = Origin::new(Transport::Amqp, "worker");
    intake.answer(&correlation, echo(&parcel.envelope), from.clone()).await.expect("passed on");
    let answer = answered.await.expect("the asker's door got the answer");
    assert_eq!(answer.content.as_str(), Some("cancel(order2)"));
    assert_eq!(turns(&store), 2);
    // One request, one answer: the same correlation answered again goes nowhere.
    let again = intake.answer(&correlation, echo(&parcel.envelope), from).await;
    assert!(matches!(again, Err(AnswerError::Orphan)), "{again:?}");
}

#[tokio::test]
async fn a_message_whose_delivery_fails_leaves_no_turn_counted() {
    let (intake, store) = intake_with(Scripted::new(true, 2));
    for attempt in 0..2 {
        let (arrival, _answered) = request("cancel(order3)");
        let refused = intake.take(arrival).await.expect_err("the agent is unavailable");
        assert_eq!(refused.failure.code(), "unavailable", "attempt {attempt}");
        assert_eq!(turns(&store), 0, "attempt {attempt} took its turn back");
    }
    let (arrival, _answered) = request("cancel(order3)");
    let taken = intake.take(arrival).await.expect("delivered at the third attempt");
    assert!(taken.answer.is_some());
    assert_eq!(turns(&store), 2, "counted once, with its answer");
}

#[tokio::test]
async fn an_agent_that_takes_a_request_without_answering_confirms_the_delivery() {
    let agent = Scripted::silent();
    let (intake, _store) = intake_with(agent.clone());
    let (arrival, _answered) = request("cancel(order4)");
    let taken = intake.take(arrival).await.expect("delivered");
    let answer = taken.answer.expect("the delivery's confirmation, not a wait that times out");
    let id = agent.received.lock().unwrap()[0].message_id.clone();
    assert_eq!(reply::accepted_ids(&answer), Some(vec![id]));
    assert_eq!(intake.waiting().len(), 0);
}
