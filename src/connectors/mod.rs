//! Agent connectors: how an envelope reaches a downstream agent, behind one trait. Each
//! transport says what "delivered" means, and the intake waits for exactly that before a door
//! settles its message:
//! - AMQP ([`amqp`]): the broker confirmed the publish (persistent and mandatory, so an
//!   unroutable message is a failure); the agent answers later, to silpgate's reply queue.
//! - HTTP ([`http`]): the agent answered 2xx; the response body is its answer (ECMA-431).
//! - A2A ([`a2a`]): the agent accepted the message (a Message or a Task came back); its
//!   answer is the Message, or the Task's result once it ended.
//! - MCP ([`mcp`]): the tool call returned; its result is the answer.
//! - WebSocket ([`ws`]): the frame was written to the agent's open socket (ECMA-432); the
//!   agent answers later on the same socket, and the connector hands each answer to the
//!   intake's answer path through an [`AnswerSink`].
//!
//! Failures carry one disposition: an agent that is down, slow or overloaded is transient
//! (retried, nothing acknowledged); an agent that refuses the message (4xx) is poison.

pub(crate) mod a2a;
pub(crate) mod amqp;
mod events;
pub(crate) mod http;
pub(crate) mod mcp;
pub(crate) mod ws;

use crate::code::Code;
use crate::config::{Config, Reach};
use crate::gateway::{Disposition, GatewayError, Origin};
use crate::nlip::{Encoding, Message};
use futures_util::future::BoxFuture;
use std::collections::HashMap;
use std::sync::Arc;

/// One envelope for one agent.
#[derive(Debug, Clone)]
pub(crate) struct Parcel {
    pub envelope: Message,
    /// Stable across redeliveries of the inbound message: receivers drop duplicates by it.
    /// Answers do not correlate by it (see [`AnswerTo::Gateway`]).
    pub message_id: String,
    /// Where the agent's answer goes.
    pub answer_to: AnswerTo,
    /// The inbound message's user, carried in a header (never as the AMQP `user_id`).
    pub user_id: Option<String>,
    /// Where an agent that reports progress on its way to the answer sends it (the asker's
    /// return path, which takes it if it can).
    pub progress: Option<ProgressTo>,
}

/// Whoever takes an agent's interim events: the asker's door, when it can pass them on. An
/// interim event is an NLIP message whose `messagetype` is [`PROGRESS`]: what the agent said
/// of its work on the way to the answer (an A2A agent's status messages), or, empty (an empty
/// English text), that the work has begun.
pub(crate) trait Progress: Send + Sync {
    /// Takes one interim event. Never blocks, never fails the delivery.
    fn progress(&self, _event: Message) {}

    /// True once the asker has given the work up (a task canceled at the A2A door): a
    /// delivery dropped then cancels what the agent still works on for it.
    fn abandoned(&self) -> bool {
        false
    }
}

/// The `messagetype` of an interim event.
pub(crate) const PROGRESS: &str = "progress";

/// A parcel's [`Progress`] taker.
#[derive(Clone)]
pub(crate) struct ProgressTo(pub std::sync::Arc<dyn Progress>);

impl std::fmt::Debug for ProgressTo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ProgressTo")
    }
}

/// Who an agent answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AnswerTo {
    /// silpgate, which passes the answer on to the asker. The answer correlates by
    /// `correlation_id`, 128 random bits drawn for this wait: a message id can be seen or
    /// guessed, this cannot, so nobody else can answer in the agent's place.
    Gateway { correlation_id: String },
    /// The sender itself (a route with `replies = "direct"`): its reply addresses and
    /// correlation travel with the parcel.
    Direct { reply_to: Option<String>, replies: Vec<(Encoding, String)>, correlation_id: Option<String> },
    /// silpgate, in the call itself: the agent's transport answers each request in its
    /// response (HTTP, A2A, MCP), so nothing correlates and nobody else can answer.
    Caller,
    /// Nobody: the parcel is a notice, not a request.
    Nobody,
}

impl AnswerTo {
    /// What the agent's answer correlates by, when silpgate waits for one.
    pub(crate) fn correlation(&self) -> Option<&str> {
        match self {
            AnswerTo::Gateway { correlation_id } => Some(correlation_id),
            _ => None,
        }
    }
}

/// What an agent's transport confirmed.
#[derive(Debug, Default)]
pub(crate) struct Delivered {
    /// Answers given with the delivery itself (HTTP, A2A, MCP), by parcel id.
    pub answers: Vec<(String, Message)>,
}

/// Why a delivery failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DeliveryError {
    #[error("agent {agent} is unavailable: {detail}")]
    Unavailable { agent: String, code: &'static str, detail: String },
    #[error("agent {agent} refused the message ({code}): {detail}")]
    Refused { agent: String, code: String, detail: String, answer: Option<Box<Message>> },
}

impl DeliveryError {
    /// The one place a delivery failure maps to a disposition.
    pub(crate) fn disposition(&self) -> Disposition {
        match self {
            DeliveryError::Unavailable { .. } => Disposition::Transient,
            DeliveryError::Refused { .. } => Disposition::Poison,
        }
    }

    pub(crate) fn code(&self) -> &str {
        match self {
            DeliveryError::Unavailable { code, .. } => code,
            DeliveryError::Refused { code, .. } => code,
        }
    }
}

/// Delivery to one agent over its transport.
pub(crate) trait Connector: Send + Sync {
    /// The transport the agent is reached by, for metric labels and spans.
    fn transport(&self) -> crate::transport::Transport;

    /// Whether the agent answers a request in the call that delivers it (HTTP, A2A, MCP),
    /// rather than later, on its own time (AMQP, WebSocket).
    fn answers_in_call(&self) -> bool;

    /// Delivers `parcels` in order and resolves once the transport confirmed every one.
    fn deliver(&self, parcels: Vec<Parcel>) -> BoxFuture<'_, Result<Delivered, DeliveryError>>;
}

/// Why the agents cannot be set up. Never carries a secret.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error("agent '{agent}': the environment variable {variable} named by token_env is not set")]
    TokenUnset { agent: String, variable: String },
    #[error("agent '{agent}': {detail}")]
    Client { agent: String, detail: String },
}

/// Why an agent's answer did not reach its asker.
#[derive(Debug, thiserror::Error)]
pub(crate) enum AnswerError {
    /// Nobody waits for it: the wait timed out, or was never started here.
    #[error("no request waits for this answer (its wait timed out, or it was never asked here)")]
    Orphan,
    /// The asker left before the answer came.
    #[error("the requester is gone")]
    Gone,
    /// The answer did not come from the agent that was asked (its broker user is not the
    /// agent's `user`); the asker still waits for the real one.
    #[error("the answer's broker user {got:?} is not agent {agent}'s user")]
    Forged { agent: String, got: Option<String> },
    /// The answer is not valid; the asker was told why.
    #[error("the answer was refused: {0}")]
    Invalid(GatewayError),
    /// The asker's door or the store could not take it now.
    #[error("{0}")]
    Retry(String),
}

impl AnswerError {
    /// The code an answer that goes nowhere is dead-lettered with.
    pub(crate) fn code(&self) -> &str {
        match self {
            AnswerError::Orphan => Code::Timeout.as_str(),
            AnswerError::Gone => Code::RequesterGone.as_str(),
            AnswerError::Forged { .. } => Code::ForgedAnswer.as_str(),
            AnswerError::Invalid(e) => e.code(),
            AnswerError::Retry(_) => Code::Unavailable.as_str(),
        }
    }

    pub(crate) fn disposition(&self) -> Disposition {
        match self {
            AnswerError::Retry(_) => Disposition::Transient,
            _ => Disposition::Poison,
        }
    }
}

/// An answer that came in another protocol (A2A, MCP), held to the limits every inbound NLIP
/// message meets (bytes, depth, values, submessages): the answer, or an NLIP error that says
/// which limit it broke.
pub(crate) fn held_to_limits(answer: Message, limits: &crate::nlip::Limits, agent: &str) -> Message {
    let encoding = crate::nlip::Encoding::Json;
    match crate::nlip::decode(&crate::nlip::encode(&answer, encoding), encoding, limits) {
        Ok(_) => answer,
        Err(e) => crate::nlip::reply::error_message(
            if e.kind.code() == "too_large" { "answer_too_large" } else { "invalid_answer" },
            &format!("the answer of agent {agent} is beyond silpgate's limits: {e}"),
            &crate::nlip::reply::Location::None,
        ),
    }
}

/// Where answers go that agents send on their own time (WebSocket): the intake's
/// [`Intake::answer`](crate::intake::Intake::answer).
pub(crate) trait AnswerPath: Send + Sync {
    /// Passes the agent's answer to the request envelope `id` on to its asker.
    fn answer(&self, id: String, answer: Message, from: Origin) -> BoxFuture<'_, Result<(), AnswerError>>;
}

/// The answer path as connectors hold it: bound once the intake exists (the intake owns the
/// connectors, so connectors hold it weakly). Unbound or gone: answers have nobody to go to.
#[derive(Clone, Default)]
pub(crate) struct AnswerSink(Arc<std::sync::OnceLock<std::sync::Weak<dyn AnswerPath>>>);

impl AnswerSink {
    pub(crate) fn new() -> Self {
        AnswerSink::default()
    }

    /// Binds the sink to the answer path; a second bind is ignored.
    pub(crate) fn bind(&self, path: std::sync::Weak<dyn AnswerPath>) {
        let _ = self.0.set(path);
    }

    /// Hands an answer on.
    pub(crate) async fn pass(&self, id: String, answer: Message, from: Origin) -> Result<(), AnswerError> {
        match self.0.get().and_then(std::sync::Weak::upgrade) {
            Some(path) => path.answer(id, answer, from).await,
            None => Err(AnswerError::Gone),
        }
    }
}

/// Every configured agent's connector, by name.
#[derive(Clone, Default)]
pub(crate) struct Agents {
    by_name: HashMap<String, Arc<dyn Connector>>,
}

impl Agents {
    /// The connector of each configured agent, as its [`Reach`] says (AMQP ones through
    /// `broker`, the AMQP side's link, when there is one). WebSocket agents hand their answers
    /// to `answers`; they start connecting at once, so this must run inside the runtime.
    pub(crate) fn new(
        config: &Config,
        broker: Option<crate::broker::link::BrokerLink>,
        answers: AnswerSink,
    ) -> Result<Agents, SetupError> {
        let mut by_name: HashMap<String, Arc<dyn Connector>> = HashMap::new();
        let reply_timeout = std::time::Duration::from_millis(config.gateway.reply_timeout_ms.max(1));
        for agent in &config.agents {
            let (name, limits) = (agent.name.as_str(), config.nlip.limits());
            let connector: Arc<dyn Connector> = match &agent.reach {
                Reach::Amqp(reach) => Arc::new(amqp::AmqpAgent::new(name, reach, broker.clone())),
                Reach::Http(reach) => Arc::new(http::HttpAgent::new(name, reach, limits)?),
                Reach::WebSocket(reach) => {
                    Arc::new(ws::WsAgent::new(name, reach, limits, reply_timeout, answers.clone())?)
                }
                Reach::A2a(reach) => Arc::new(a2a::A2aAgent::new(name, reach, reply_timeout, limits)?),
                Reach::Mcp(reach) => Arc::new(mcp::McpAgent::new(name, reach, limits)?),
            };
            by_name.insert(agent.name.clone(), connector);
        }
        Ok(Agents { by_name })
    }

    /// Agents reached through connectors of one's own, by name: the intake tested without a
    /// network.
    #[cfg(test)]
    pub(crate) fn of(connectors: impl IntoIterator<Item = (String, Arc<dyn Connector>)>) -> Agents {
        Agents { by_name: connectors.into_iter().collect() }
    }

    pub(crate) fn get(&self, agent: &str) -> Option<&Arc<dyn Connector>> {
        self.by_name.get(agent)
    }
}
