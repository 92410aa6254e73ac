//! The network front door: NLIP over HTTP (ECMA-431) and WebSocket (ECMA-432), thin adapters
//! around the gateway core. Each request or socket message is decoded, handed to
//! [`Gateway::handle`](crate::gateway::Gateway::handle), its state flushed, and the reply
//! written back in the encoding it came in.

pub mod amqp;
pub mod auth;
pub mod http;
pub mod limit;
pub mod listener;
pub mod tls;
pub mod ws;

use crate::gateway::{Destination, Gateway, GatewayError, Inbound, Origin, Outcome, Status, Transport};
use crate::nlip::reply::{self, Location};
use crate::nlip::{Limits, Message};
use std::sync::Arc;
use std::time::Duration;
use tracing::{Instrument, info_span};

/// Everything a listener needs, shared by all connections.
pub struct Front {
    pub gateway: Gateway,
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
    pub cluster: Option<Arc<amqp::cluster::Cluster>>,
}

/// The error message for a message over a rate limit.
pub fn rate_limited(what: &str, retry_after: u64) -> Message {
    let message = format!("{what} is over its rate limit; retry in {retry_after} s");
    reply::error_message("rate_limited", &message, &Location::None)
}

/// The `transport` label of a transport's metrics.
pub fn transport_label(transport: Transport) -> &'static str {
    match transport {
        Transport::Amqp => "amqp",
        Transport::Http => "http",
        Transport::WebSocket => "websocket",
        Transport::Cli => "cli",
    }
}

/// Who a request comes from, for the per-client limit: the accepted token's identity when
/// tokens are configured, else its address.
pub fn client_key(identity: auth::Identity, peer: std::net::SocketAddr) -> String {
    match identity {
        auth::Identity::Token(position) => format!("token:{position}"),
        auth::Identity::Anonymous => format!("addr:{}", peer.ip()),
    }
}

/// What a transport sends back for one inbound message.
pub struct Answer {
    /// The envelopes for the sender, in order.
    pub replies: Vec<Message>,
    /// The error code when the message was not delivered.
    pub error: Option<&'static str>,
}

impl Front {
    /// Runs the core on one decoded envelope and makes its state durable before answering.
    /// `parent` is the trace context the request came with (empty: a new trace).
    pub async fn answer(
        self: &Arc<Self>,
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
            silpgate.transport = ?transport,
            silpgate.source = source
        );
        crate::telemetry::adopt(&span, parent);
        crate::telemetry::record_format(&span, &envelope);
        let metrics = crate::metrics::get();
        let label = transport_label(transport);
        let started = std::time::Instant::now();
        metrics.messages_in.with_label_values(&[label, source]).inc();
        metrics.in_flight.inc();
        let inbound = Inbound {
            envelope,
            origin: Origin::new(transport, source),
            received_at: crate::store::time::now_millis(),
        };
        let outcome = info_span!(parent: &span, "gateway handle").in_scope(|| self.gateway.handle(inbound));
        crate::telemetry::record_notes(&span, &outcome.notes);
        metrics.observe_notes(&outcome.notes);
        let flushed =
            self.gateway.store().flush_async().instrument(info_span!(parent: &span, "store flush")).await;
        let answer = match flushed {
            Err(e) => {
                let error = GatewayError::Store(e);
                let message = reply::error_message(error.code(), &error.detail(), &Location::None);
                Answer { replies: vec![message], error: Some(error.code()) }
            }
            Ok(()) => self.settle(outcome),
        };
        if let Some(code) = answer.error {
            span.record("error.type", code);
            tracing::warn!(transport = label, source, code, "Message not delivered.");
            let disposition = if code == "unavailable" { "transient" } else { "poison" };
            metrics.failures.with_label_values(&[label, disposition, code]).inc();
        }
        metrics.messages_out.with_label_values(&[label, "reply"]).inc_by(answer.replies.len() as u64);
        metrics.message_seconds.with_label_values(&[label]).observe(started.elapsed().as_secs_f64());
        metrics.in_flight.dec();
        answer
    }

    /// The replies of an outcome. Messages for agents need an agent transport (AMQP), which a
    /// front door alone does not have: they are refused as `unavailable`, not dropped.
    fn settle(&self, outcome: Outcome) -> Answer {
        let mut replies = Vec::new();
        let mut unreachable = Vec::new();
        for o in outcome.outbound {
            match o.destination {
                Destination::Reply => replies.push(o.envelope),
                Destination::Agent(agent) => unreachable.push(agent),
            }
        }
        match outcome.status {
            Status::Failed(e) => {
                if replies.is_empty() {
                    replies.push(reply::error_message(e.code(), &e.detail(), &Location::None));
                }
                Answer { replies, error: Some(e.code()) }
            }
            _ if !unreachable.is_empty() => {
                let message = format!(
                    "agent {} is reached over AMQP only: publish the message to an inbound queue",
                    unreachable.join(", ")
                );
                Answer {
                    replies: vec![reply::error_message("unavailable", &message, &Location::None)],
                    error: Some("unavailable"),
                }
            }
            _ => Answer { replies, error: None },
        }
    }
}
