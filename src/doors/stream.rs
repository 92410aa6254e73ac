//! Upstream WebSocket streams (`[[streams]]`): silpgate connects to each configured server
//! as a client (ECMA-432) and takes every NLIP message the server sends through the intake,
//! with the stream's name as its source. Each message's reply (the reply route's envelope,
//! the agent's answer, a delivery confirmation for a route that awaits nothing, or an error)
//! is written back on the socket, in the order the messages came: the n-th reply on a
//! connection answers the n-th message read on it. Up to `max_in_flight` messages are taken
//! at once; at the bound silpgate stops reading.
//!
//! A stream has no acknowledgement, so its guarantee is this: a message silpgate has read is
//! taken through the intake exactly once, to the end, even if the connection breaks
//! meanwhile (its reply is then dropped); a reply on the socket means the message was
//! handled as the reply says. A message the server sent that silpgate had not read when the
//! connection broke is lost, and silpgate does not ask for it again: the server tells what
//! was handled by the replies it got. A message the server sends again is a new message.
//!
//! silpgate pings the server every 15 s and gives the connection up when nothing has been
//! heard for three intervals. The connection is opened again with capped, jittered backoff. On shutdown silpgate stops
//! reading, lets the messages in flight finish, writes their replies and closes the socket.
//!
//! In cluster mode one instance at a time holds a stream ([`crate::cluster::streams`]): the
//! others do not connect, and the holder lets go (as on shutdown) when another instance's
//! turn comes.

use super::{Front, ToSender};
use crate::code::Code;
use crate::config::StreamConfig;
use crate::gateway::Transport;
use crate::nlip::Message;
use crate::nlip::reply::{self, Location};
use crate::util::backoff::Backoff;
use crate::util::shutdown::Shutdown;
use crate::websocket::{Dialer, PING_EVERY, frame_of, message_of};
use futures_util::stream::FuturesOrdered;
use futures_util::{SinkExt, StreamExt};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio_tungstenite::tungstenite::Message as Frame;
use tracing::Instrument;

/// Why a stream cannot be set up. Never carries a secret.
#[derive(Debug, thiserror::Error)]
#[error("stream '{stream}': {error}")]
pub struct StreamError {
    pub stream: String,
    pub error: crate::websocket::DialError,
}

/// One configured stream, ready to connect.
pub(crate) struct Stream {
    config: StreamConfig,
    dialer: Dialer,
}

impl Stream {
    /// Checks the stream's token and TLS setup; `max_bytes` bounds its messages.
    pub(crate) fn new(config: &StreamConfig, max_bytes: usize) -> Result<Stream, StreamError> {
        let dialer = Dialer::new(
            &config.url,
            config.token_env.as_deref(),
            config.ca_file.as_deref(),
            max_bytes,
            Duration::from_secs(10),
        )
        .map_err(|error| StreamError { stream: config.name.clone(), error })?;
        Ok(Stream { config: config.clone(), dialer })
    }

    /// Connects, takes messages, and connects again, until `stop` says stop; in cluster mode,
    /// only while this instance holds the stream.
    pub(crate) async fn run(self, front: Arc<Front>, stop: Shutdown) {
        let name = self.config.name.clone();
        let initial = Duration::from_millis(self.config.reconnect_initial_ms.max(1));
        let mut backoff = Backoff::new(initial, Duration::from_millis(self.config.reconnect_max_ms.max(1)));
        let grants = front.cluster.as_ref().map(|cluster| cluster.streams.grants());
        let mut turn = Turn { stop, grants, name: name.clone() };
        loop {
            if !turn.begin().await {
                return;
            }
            let _holding = front.cluster.as_ref().map(|cluster| cluster.streams.hold(&name));
            let span = tracing::info_span!(
                "stream connect",
                otel.kind = "client",
                network.protocol.name = "websocket",
                url.full = %self.dialer.url(),
                server.address = %self.dialer.host(),
                server.port = self.dialer.port(),
                silpgate.source = %name,
            );
            let connected = tokio::select! {
                connected = self.dialer.connect(&span).instrument(span.clone()) => connected,
                () = turn.ended() => continue,
            };
            match connected {
                Ok(socket) => {
                    tracing::info!(stream = %name, url = %self.dialer.url(), "Connected to the stream.");
                    let since = std::time::Instant::now();
                    let why = self.serve(&front, socket, &mut turn).await;
                    backoff.connection_ended(since.elapsed());
                    if turn.over() {
                        tracing::info!(stream = %name, reason = %why, "Let go of the stream.");
                        continue;
                    }
                    tracing::warn!(stream = %name, reason = %why, "The stream's connection closed; reconnecting.");
                }
                Err(e) => {
                    tracing::warn!(stream = %name, url = %self.dialer.url(), error = %e, "Cannot connect to the stream.");
                }
            }
            tokio::select! {
                () = tokio::time::sleep(backoff.next_delay()) => {}
                () = turn.ended() => {}
            }
        }
    }

    /// One connection: messages in, each on its own task; replies out in message order.
    async fn serve(&self, front: &Arc<Front>, socket: crate::websocket::Socket, turn: &mut Turn) -> String {
        let (mut sink, mut stream) = socket.split();
        let encoding = self.config.encoding.nlip();
        let max_in_flight = self.config.max_in_flight.max(1);
        let write_bound = Duration::from_secs(30);
        let mut in_flight = FuturesOrdered::new();
        let mut writable = true;
        // A server that stops answering pings is gone, even if its TCP connection is not.
        let mut ticker = tokio::time::interval(PING_EVERY);
        ticker.tick().await;
        let mut heard = std::time::Instant::now();
        let why = loop {
            tokio::select! {
                _ = ticker.tick() => {
                    if in_flight.len() >= max_in_flight {
                        // Not reading: the server's pongs wait unread.
                        heard = std::time::Instant::now();
                    } else if heard.elapsed() > 3 * PING_EVERY {
                        break "no frame for three ping intervals".to_owned();
                    }
                    let ping = Frame::Ping(Vec::new().into());
                    if !matches!(tokio::time::timeout(write_bound, sink.send(ping)).await, Ok(Ok(()))) {
                        writable = false;
                        break "writing a ping failed".to_owned();
                    }
                }
                Some(done) = in_flight.next(), if !in_flight.is_empty() => {
                    let frame = frame_of(&reply_of(done), encoding);
                    if !matches!(tokio::time::timeout(write_bound, sink.send(frame)).await, Ok(Ok(()))) {
                        writable = false;
                        break "writing a reply failed".to_owned();
                    }
                }
                next = stream.next(), if in_flight.len() < max_in_flight => {
                    let frame = match next {
                        None | Some(Ok(Frame::Close(_))) => break "the server closed the connection".to_owned(),
                        Some(Err(e)) => break e.to_string(),
                        Some(Ok(frame)) => frame,
                    };
                    heard = std::time::Instant::now();
                    let Some(decoded) = message_of(&frame, &front.limits) else { continue };
                    let (front, source) = (front.clone(), self.config.name.clone());
                    // Its own task: a message read is taken to the end whatever the socket does.
                    in_flight.push_back(tokio::spawn(async move {
                        match decoded {
                            Ok(message) => {
                                let parent = opentelemetry::Context::new();
                                front.request(message, super::Asker::new(Transport::WebSocket, &source, None), parent).await
                            }
                            Err(why) => {
                                let detail = format!("the message cannot be read: {why}");
                                let message = reply::error_message(Code::InvalidEnvelope.as_str(), &detail, &Location::None);
                                ToSender::Refused { message, code: Code::InvalidEnvelope.as_str().into(), transient: false }
                            }
                        }
                    }));
                }
                () = turn.ended() => break turn.why_over().to_owned(),
            }
        };
        // What was read finishes; its replies go out while the socket takes them.
        while let Some(done) = in_flight.next().await {
            if writable {
                let frame = frame_of(&reply_of(done), encoding);
                writable = matches!(tokio::time::timeout(write_bound, sink.send(frame)).await, Ok(Ok(())));
            }
        }
        if writable {
            let _ = tokio::time::timeout(Duration::from_secs(1), sink.close()).await;
        }
        why
    }
}

/// What ends a stream's connection: the daemon stopping, or, in cluster mode, this instance's
/// turn to hold the stream ending.
struct Turn {
    stop: Shutdown,
    /// The streams this instance may hold; `None` outside cluster mode.
    grants: Option<watch::Receiver<BTreeSet<String>>>,
    name: String,
}

impl Turn {
    fn stopping(&self) -> bool {
        self.stop.is_stopping()
    }

    fn held(&self) -> bool {
        self.grants.as_ref().is_none_or(|grants| grants.borrow().contains(&self.name))
    }

    /// Whether the connection is to end.
    fn over(&self) -> bool {
        self.stopping() || !self.held()
    }

    fn why_over(&self) -> &'static str {
        if self.stopping() { "stopping" } else { "another instance holds the stream now" }
    }

    /// Waits until this instance may connect: true then, false when the daemon stops instead.
    async fn begin(&mut self) -> bool {
        loop {
            if self.stopping() {
                return false;
            }
            if self.held() {
                return true;
            }
            self.changed().await;
        }
    }

    /// Completes once the connection is to end ([`Turn::over`]).
    async fn ended(&mut self) {
        while !self.over() {
            self.changed().await;
        }
    }

    /// Waits for the next change of either; a side that can no longer change is waited for
    /// no more.
    async fn changed(&mut self) {
        let Turn { stop, grants, .. } = self;
        let grants_changed = async {
            let changed = match grants {
                Some(grants) => grants.changed().await.is_ok(),
                None => false,
            };
            if !changed {
                std::future::pending::<()>().await;
            }
        };
        let stopping = async {
            stop.stopped().await;
            if !stop.is_stopping() {
                std::future::pending::<()>().await;
            }
        };
        tokio::select! {
            () = stopping => {}
            () = grants_changed => {}
        }
    }
}

/// The envelope a message's outcome is written back as.
fn reply_of(done: Result<ToSender, tokio::task::JoinError>) -> Message {
    match done {
        // One reply per message, so that the n-th reply answers the n-th message: a notice
        // before a reply (a session renewal) is not sent on a stream.
        Ok(ToSender::Reply { reply: message, .. }) | Ok(ToSender::Refused { message, .. }) => message,
        Ok(ToSender::Accepted(ids)) => crate::nlip::reply::accepted(&ids),
        Err(_) => {
            reply::error_message(Code::Internal.as_str(), "the message could not be handled", &Location::None)
        }
    }
}
