//! The network front door: NLIP over HTTP (ECMA-431) and WebSocket (ECMA-432). Each request or
//! socket message is decoded and handed to the [intake](crate::intake), which takes it through
//! the core to its agent; the reply route's envelope or the agent's answer is written back in
//! the encoding the request came in. [`stream`] is the same door turned around: silpgate
//! connects to an upstream WebSocket server and takes the messages it sends. [`a2a`] lets A2A
//! clients in the same way; [`mcp`] serves the SILP codec to MCP clients.

pub(crate) mod a2a;
pub(crate) mod admin;
pub(crate) mod admission;
pub(crate) mod amqp;
pub(crate) mod auth;
pub(crate) mod http;
pub(crate) mod jsonrpc;
pub(crate) mod jwt;
pub(crate) mod limit;
pub(crate) mod listener;
pub(crate) mod mcp;
pub mod repoll;
pub(crate) mod stream;
pub(crate) mod tls;
pub(crate) mod ws;

use crate::code::Code;
use crate::gateway::{Origin, Transport};
use crate::intake::{Arrival, InPlace, Intake, NotTaken, Taken};
use crate::nlip::reply::{self, Location};
use crate::nlip::{Limits, Message};
use std::sync::Arc;
use std::time::Duration;
use tracing::Instrument;

/// Everything a listener needs, shared by all connections.
pub(crate) struct Front {
    pub intake: Arc<Intake>,
    pub limits: Limits,
    /// The time a request's body may take to arrive (`http.body_timeout_secs`).
    pub body_timeout: Duration,
    /// The base URL the A2A card names (`http.public_url`, else the listening address).
    pub public_url: String,
    /// Who may call: replaced as a whole by a reload ([`Front::auth`]).
    pub auth: std::sync::RwLock<Arc<auth::Tokens>>,
    pub ws_ping: Duration,
    pub ws_dead: Duration,
    /// Per-client rate limit.
    pub clients: limit::PerClient,
    /// Per-client limit of live conversations.
    pub conversations: limit::Conversations,
    /// `/metrics` and `/cluster` ask for a token too.
    pub observability_tokens: bool,
    /// Browser origins allowed to open a WebSocket.
    pub allowed_origins: Vec<String>,
    /// Proxies whose `X-Forwarded-For` names the client.
    pub trusted_proxies: Vec<std::net::IpAddr>,
    /// Rate and burst of a new WebSocket's own bucket.
    pub connection_rate: (f64, f64),
    /// Whether the broker is connected, when an AMQP side is configured.
    pub broker: Option<Arc<crate::broker::health::BrokerHealth>>,
    /// The cluster side, in cluster mode (`GET /cluster`).
    pub cluster: Option<Arc<crate::cluster::Cluster>>,
    /// The tasks the A2A door keeps.
    pub a2a_tasks: Arc<a2a::tasks::TaskBook>,
    /// Signs the door's agent card (`a2a.card_signing_key_file`), when set.
    pub card_signer: Option<crate::a2a::signature::CardSigner>,
    /// Reads the configuration file again (SIGHUP, `POST /admin/reload`).
    pub reloader: Arc<dyn admin::Reload>,
}

/// The error message for a message over a rate limit.
pub(crate) fn rate_limited(what: &str, retry_after: u64) -> Message {
    let message = format!("{what} is over its rate limit; retry in {retry_after} s");
    reply::error_message(Code::RateLimited.as_str(), &message, &Location::None)
}

/// Who a request comes from, for the per-client limits, quotas and kept tasks: the
/// principal its token names when clients authenticate, else its address.
pub(crate) fn client_key(identity: &auth::Identity, address: std::net::IpAddr) -> String {
    match identity {
        auth::Identity::Principal(principal) => format!("sub:{}", principal.subject),
        auth::Identity::Anonymous => format!("addr:{address}"),
    }
}

impl Front {
    /// The address a request comes from: the peer's, or, when the peer is a trusted proxy (a
    /// TLS terminator or load balancer in `http.trusted_proxies`), the last address in its
    /// `X-Forwarded-For` that is not itself a trusted proxy. Without that, every client behind
    /// the proxy would share one address and one rate limit.
    pub(crate) fn client_address(
        &self,
        headers: &axum::http::HeaderMap,
        peer: std::net::SocketAddr,
    ) -> std::net::IpAddr {
        let peer = peer.ip();
        if !self.trusted_proxies.contains(&peer) {
            return peer;
        }
        let forwarded = headers.get_all("x-forwarded-for").iter().filter_map(|v| v.to_str().ok());
        let hops: Vec<std::net::IpAddr> =
            forwarded.flat_map(|v| v.split(',')).filter_map(|hop| hop.trim().parse().ok()).collect();
        hops.into_iter().rev().find(|hop| !self.trusted_proxies.contains(hop)).unwrap_or(peer)
    }
}

/// What a door sends back for one request.
#[derive(Debug)]
pub(crate) enum ToSender {
    /// The envelope for the sender: a reply route's, or the agent's answer; before it, any
    /// notices for the sender (a session renewal). HTTP answers with the last, a socket sends
    /// them all.
    Reply { notices: Vec<Message>, reply: Message },
    /// Delivered to agents that nobody waits for (`await = "none"`): their envelopes' ids.
    Accepted(Vec<String>),
    /// Not delivered: the error message, its code and whether trying again may help.
    Refused { message: Message, code: String, transient: bool },
}

/// Who hands a message to the front: the door it came through, the source routes match on,
/// and, when clients authenticate, the principal its door verified.
pub(crate) struct Asker<'a> {
    pub transport: Transport,
    pub source: &'a str,
    pub principal: Option<crate::principal::Principal>,
}

impl<'a> Asker<'a> {
    pub(crate) fn new(
        transport: Transport,
        source: &'a str,
        principal: Option<crate::principal::Principal>,
    ) -> Self {
        Asker { transport, source, principal }
    }
}

impl Front {
    /// The tokens and JWT settings requests are checked against now.
    pub(crate) fn auth(&self) -> Arc<auth::Tokens> {
        self.auth.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// The core (the configuration's gateway and agents) requests start under now.
    pub(crate) fn core(&self) -> Arc<crate::intake::Core> {
        self.intake.core()
    }

    /// Takes one decoded envelope from an HTTP request or a socket through the intake, and
    /// waits for the agent's answer when there is one to wait for. `parent` is the trace
    /// context the request came with (empty: a new trace).
    pub(crate) async fn request(
        &self,
        envelope: Message,
        asker: Asker<'_>,
        parent: opentelemetry::Context,
    ) -> ToSender {
        self.request_with(envelope, asker, parent, None).await
    }

    /// As [`Front::request`], with the agent's interim events (its progress on the way to the
    /// answer, see [`crate::connectors::Progress`]) sent to `progress` as they come.
    pub(crate) async fn request_streaming(
        &self,
        envelope: Message,
        asker: Asker<'_>,
        parent: opentelemetry::Context,
        progress: tokio::sync::mpsc::UnboundedSender<Message>,
    ) -> ToSender {
        self.request_with(envelope, asker, parent, Some(progress)).await
    }

    async fn request_with(
        &self,
        envelope: Message,
        asker: Asker<'_>,
        parent: opentelemetry::Context,
        progress: Option<tokio::sync::mpsc::UnboundedSender<Message>>,
    ) -> ToSender {
        match self.submit_with(envelope, asker, parent, progress).await {
            Submitted::Ready(to_sender) => to_sender,
            Submitted::Awaiting(awaiting) => awaiting.wait().await,
        }
    }

    /// Takes one decoded envelope through the intake and returns once it is handled and
    /// delivered: with its answer when that is known now, else with the wait for the agent's
    /// answer. A socket submits its messages one after another, so that a conversation's
    /// messages are handled in the order they came, and waits for the answers side by side.
    /// The agent's interim events go to `progress` as they come (until the answer is known,
    /// for an agent that answers in the call).
    pub(crate) async fn submit_streaming(
        &self,
        envelope: Message,
        asker: Asker<'_>,
        parent: opentelemetry::Context,
        progress: tokio::sync::mpsc::UnboundedSender<Message>,
    ) -> Submitted {
        self.submit_with(envelope, asker, parent, Some(progress)).await
    }

    async fn submit_with(
        &self,
        envelope: Message,
        asker: Asker<'_>,
        parent: opentelemetry::Context,
        progress: Option<tokio::sync::mpsc::UnboundedSender<Message>>,
    ) -> Submitted {
        let Asker { transport, source, principal } = asker;
        let span = crate::telemetry::message_span!(
            "nlip request",
            otel.name = %format!("process {source}"),
            otel.kind = "server",
            network.transport = "tcp",
            network.protocol.name = if transport == Transport::WebSocket { "websocket" } else { "http" },
            silpgate.transport = transport.as_str(),
            silpgate.source = source,
            enduser.id = principal.as_ref().map(|p| p.subject.as_str())
        );
        crate::telemetry::adopt(&span, parent);
        let label = transport.as_str();
        crate::metrics::get().messages_in.with_label_values(&[label, source]).inc();
        let measure = Measure::start(label);
        // The intake answers every wait, at the latest with a timeout error; the margin only
        // guards against a wait that was never registered.
        let limit = self.intake.waiting().timeout() + Duration::from_secs(5);
        if self.intake.forwards_to_owner(&envelope) {
            let answered =
                match self.intake.forward(&envelope, (transport, source, principal.as_ref()), &span).await {
                    Ok(replies) => AnswerSource::Owner(replies),
                    Err(refused) => return Submitted::Ready(refused_to_sender(refused, label, source)),
                };
            return Submitted::Awaiting(Awaiting { answered, limit, span, _measure: measure });
        }
        let (path, answered) = InPlace::new(progress);
        let arrival = Arrival {
            envelope,
            origin: Origin { principal, ..Origin::new(transport, source) },
            span: span.clone(),
            answers: Some(path),
            content_id: None,
        };
        let to_sender = match self.intake.take(arrival).await {
            Err(refused) => refused_to_sender(refused, label, source),
            Ok(Taken { answer: Some(answer), mut replies, .. }) => {
                replies.push(answer);
                final_to_sender(replies)
            }
            Ok(taken) if taken.awaiting.is_some() => {
                let answered = AnswerSource::Agent(answered);
                return Submitted::Awaiting(Awaiting { answered, limit, span, _measure: measure });
            }
            Ok(taken) if taken.replies.is_empty() && !taken.delivered.is_empty() => {
                ToSender::Accepted(taken.delivered)
            }
            Ok(mut taken) => match taken.replies.pop() {
                Some(reply) => ToSender::Reply { notices: taken.replies, reply },
                None => no_reply(),
            },
        };
        Submitted::Ready(to_sender)
    }
}

/// What a refused message's sender is told.
fn refused_to_sender(refused: NotTaken, label: &str, source: &str) -> ToSender {
    let NotTaken { failure, replies } = refused;
    tracing::warn!(transport = label, source, code = failure.code(), error = %failure, "Message not delivered.");
    let message = replies
        .into_iter()
        .last()
        .unwrap_or_else(|| reply::error_message(failure.code(), &failure.to_string(), &Location::None));
    let transient = failure.disposition() == crate::gateway::Disposition::Transient;
    ToSender::Refused { message, code: failure.code().to_owned(), transient }
}

fn no_reply() -> ToSender {
    let message =
        reply::error_message(Code::Internal.as_str(), "the message produced no reply", &Location::None);
    ToSender::Refused { message, code: Code::Internal.as_str().into(), transient: false }
}

/// A request taken through the intake.
pub(crate) enum Submitted {
    /// Its answer is known now.
    Ready(ToSender),
    /// Its agent's answer is awaited.
    Awaiting(Awaiting),
}

/// Where a request's answer comes from.
enum AnswerSource {
    /// The agent's answer, through this instance's core.
    Agent(tokio::sync::oneshot::Receiver<Message>),
    /// A forwarded request's replies from its partition's owner, through the owner's core.
    Owner(tokio::sync::oneshot::Receiver<Vec<Message>>),
}

/// The wait for the answer to one request: its agent's, or its partition owner's.
pub(crate) struct Awaiting {
    answered: AnswerSource,
    limit: Duration,
    span: tracing::Span,
    _measure: Measure,
}

impl Awaiting {
    /// What the sender is told: the answer, or a `timeout` error.
    pub(crate) async fn wait(self) -> ToSender {
        let wait = tracing::info_span!(parent: &self.span, "await answer");
        let answered = async {
            match self.answered {
                AnswerSource::Agent(answer) => answer.await.ok().map(to_sender_of),
                AnswerSource::Owner(replies) => replies.await.ok().map(final_to_sender),
            }
        };
        match tokio::time::timeout(self.limit, answered).instrument(wait).await {
            Ok(Some(answer)) => answer,
            _ => {
                let message = reply::error_message(
                    Code::Timeout.as_str(),
                    "the agent did not answer in time",
                    &Location::None,
                );
                ToSender::Refused { message, code: Code::Timeout.as_str().into(), transient: true }
            }
        }
    }
}

/// A request from arrival to answer, for the metrics: in flight while it lives, its time and
/// its reply counted when it ends.
struct Measure {
    label: &'static str,
    started: std::time::Instant,
}

impl Measure {
    fn start(label: &'static str) -> Self {
        crate::metrics::get().in_flight.inc();
        Measure { label, started: std::time::Instant::now() }
    }
}

impl Drop for Measure {
    fn drop(&mut self) {
        let metrics = crate::metrics::get();
        metrics.messages_out.with_label_values(&[self.label, "reply"]).inc();
        metrics
            .message_seconds
            .with_label_values(&[self.label])
            .observe(self.started.elapsed().as_secs_f64());
        metrics.in_flight.dec();
    }
}

/// An agent's answer as the door returns it: an NLIP error answer keeps its code.
fn to_sender_of(message: Message) -> ToSender {
    match reply::error_code(&message) {
        Some(code) => {
            let transient = crate::code::is_transient(&code);
            ToSender::Refused { message, code, transient }
        }
        None => ToSender::Reply { notices: Vec::new(), reply: message },
    }
}

/// Replies that end in a request's answer (an agent's answer in hand, or a partition owner's
/// replies to a forwarded request), as the door returns them: the last is the answer (an
/// error keeps its code, a delivery confirmation is an acceptance), the ones before it notices.
fn final_to_sender(mut replies: Vec<Message>) -> ToSender {
    let Some(last) = replies.pop() else { return no_reply() };
    if let Some(ids) = reply::accepted_ids(&last) {
        return ToSender::Accepted(ids);
    }
    match to_sender_of(last) {
        ToSender::Reply { reply, .. } => ToSender::Reply { notices: replies, reply },
        refused => refused,
    }
}
