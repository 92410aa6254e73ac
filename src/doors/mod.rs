//! The network front door: NLIP over HTTP (ECMA-431) and WebSocket (ECMA-432). Each request or
//! socket message is decoded and handed to the [intake](crate::intake), which takes it through
//! the core to its agent; the reply route's envelope or the agent's answer is written back in
//! the encoding the request came in. [`stream`] is the same door turned around: silpgate
//! connects to an upstream WebSocket server and takes the messages it sends.

pub mod amqp;
pub mod auth;
pub mod http;
pub mod limit;
pub mod listener;
pub mod stream;
pub mod tls;
pub mod ws;

use crate::gateway::{Gateway, Origin, Transport};
use crate::intake::{Arrival, InPlace, Intake, Refused};
use crate::nlip::reply::{self, Location};
use crate::nlip::{Limits, Message};
use std::sync::Arc;
use std::time::Duration;
use tracing::Instrument;

/// Everything a listener needs, shared by all connections.
pub struct Front {
    pub intake: Arc<Intake>,
    pub limits: Limits,
    pub auth: auth::Tokens,
    pub ws_ping: Duration,
    pub ws_dead: Duration,
    /// Per-client rate limit.
    pub clients: limit::PerClient,
    /// Rate and burst of a new WebSocket's own bucket.
    pub connection_rate: (f64, f64),
    /// Whether the broker is connected, when an AMQP side is configured.
    pub broker: Option<Arc<std::sync::atomic::AtomicBool>>,
    /// The cluster side, in cluster mode (`GET /cluster`).
    pub cluster: Option<Arc<crate::cluster::Cluster>>,
}

/// The error message for a message over a rate limit.
pub fn rate_limited(what: &str, retry_after: u64) -> Message {
    let message = format!("{what} is over its rate limit; retry in {retry_after} s");
    reply::error_message("rate_limited", &message, &Location::None)
}

/// Who a request comes from, for the per-client limit: the accepted token's identity when
/// tokens are configured, else its address.
pub fn client_key(identity: auth::Identity, peer: std::net::SocketAddr) -> String {
    match identity {
        auth::Identity::Token(position) => format!("token:{position}"),
        auth::Identity::Anonymous => format!("addr:{}", peer.ip()),
    }
}

/// What a door sends back for one request.
#[derive(Debug)]
pub enum Answer {
    /// The envelope for the sender: a reply route's, or the agent's answer.
    Reply(Message),
    /// Delivered to agents that nobody waits for (`await = "none"`): their envelopes' ids.
    Accepted(Vec<String>),
    /// Not delivered: the error message, its code and whether trying again may help.
    Refused { message: Message, code: String, transient: bool },
}

impl Front {
    pub fn gateway(&self) -> &Gateway {
        self.intake.gateway()
    }

    /// Takes one decoded envelope from an HTTP request or a socket through the intake, and
    /// waits for the agent's answer when there is one to wait for. `parent` is the trace
    /// context the request came with (empty: a new trace).
    pub async fn request(
        &self,
        envelope: Message,
        transport: Transport,
        source: &str,
        parent: opentelemetry::Context,
    ) -> Answer {
        let span = crate::telemetry::message_span!(
            "nlip request",
            otel.name = %format!("process {source}"),
            otel.kind = "server",
            network.transport = "tcp",
            network.protocol.name = if transport == Transport::WebSocket { "websocket" } else { "http" },
            silpgate.transport = transport.as_str(),
            silpgate.source = source
        );
        crate::telemetry::adopt(&span, parent);
        let metrics = crate::metrics::get();
        let label = transport.as_str();
        let started = std::time::Instant::now();
        metrics.messages_in.with_label_values(&[label, source]).inc();
        metrics.in_flight.inc();
        let (path, answered) = InPlace::new();
        let arrival = Arrival {
            envelope,
            origin: Origin::new(transport, source),
            span: span.clone(),
            answers: Some(path),
        };
        let answer = match self.intake.take(arrival).await {
            Err(Refused { failure, replies }) => {
                tracing::warn!(transport = label, source, code = failure.code(), error = %failure, "Message not delivered.");
                let message = replies.into_iter().last().unwrap_or_else(|| {
                    reply::error_message(failure.code(), &failure.to_string(), &Location::None)
                });
                let transient = failure.disposition() == crate::gateway::Disposition::Transient;
                Answer::Refused { message, code: failure.code().to_owned(), transient }
            }
            Ok(taken) if taken.awaiting.is_some() => {
                let wait = tracing::info_span!(parent: &span, "await answer");
                // The intake answers every wait, at the latest with a timeout error; the
                // margin only guards against a wait that was never registered.
                let limit = self.intake.waiting().timeout() + Duration::from_secs(5);
                match tokio::time::timeout(limit, answered).instrument(wait).await {
                    Ok(Ok(message)) => answer_of(message),
                    _ => {
                        let message = reply::error_message(
                            "timeout",
                            "the agent did not answer in time",
                            &Location::None,
                        );
                        Answer::Refused { message, code: "timeout".into(), transient: true }
                    }
                }
            }
            Ok(taken) if taken.replies.is_empty() && !taken.delivered.is_empty() => {
                Answer::Accepted(taken.delivered)
            }
            Ok(taken) => match taken.replies.into_iter().last() {
                Some(message) => Answer::Reply(message),
                None => {
                    let message =
                        reply::error_message("internal", "the message produced no reply", &Location::None);
                    Answer::Refused { message, code: "internal".into(), transient: false }
                }
            },
        };
        metrics.messages_out.with_label_values(&[label, "reply"]).inc();
        metrics.message_seconds.with_label_values(&[label]).observe(started.elapsed().as_secs_f64());
        metrics.in_flight.dec();
        answer
    }
}

/// An agent's answer as the door returns it: an NLIP error answer keeps its code.
fn answer_of(message: Message) -> Answer {
    match reply::error_code(&message) {
        Some(code) => {
            let transient = matches!(code.as_str(), "timeout" | "unavailable");
            Answer::Refused { message, code, transient }
        }
        None => Answer::Reply(message),
    }
}

/// The control message that confirms a delivery nobody waits an answer for.
pub fn accepted_message(ids: &[String]) -> Message {
    let content = serde_json::json!({ "delivered": ids });
    Message::new(crate::nlip::Format::Structured, "json", crate::nlip::Content::Json(content))
        .with_messagetype("control")
}
