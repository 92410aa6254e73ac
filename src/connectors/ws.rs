//! Agents on WebSocket (ECMA-432): one persistent client connection per agent, one NLIP
//! message per frame (CBOR in binary frames by default, JSON in text frames with
//! `encoding = "json"`). A parcel is delivered once its frame is written to the open socket;
//! the agent answers later, on the same socket, and each answer goes to the intake's answer
//! path ([`AnswerSink`]).
//!
//! Correlation (NLIP has no message id): every frame written is an outstanding request of
//! the socket, queued in write order. An answer carrying a conversation token belongs to the
//! oldest outstanding request of that conversation; an answer without one to the oldest
//! outstanding request without a token, else to the oldest outstanding request. So an agent
//! answers every message it gets, once, and in the order it got them within a conversation
//! (conversations may interleave). An answer to a notice (a parcel nobody waits for) is
//! dropped; one that matches nothing is logged and counted as orphaned.
//!
//! Connection loss: the connector reconnects with capped, jittered backoff. While it is
//! down, a delivery waits for the connection at most `timeout_ms` and then fails as transient
//! (`agent_unavailable`), so the door retries it. Requests written to the lost socket that
//! still wait for their answer are written again, first, on the next connection (their
//! answers would have come on the lost one): a request may reach the agent twice, and its
//! asker gets one answer (a wait ends once; a second answer to the same id is orphaned).
//! A request not answered within the reply timeout keeps its place in the queue (its
//! answer may still come) but frees its `max_in_flight` slot; when as many are overdue as
//! the agent has slots, the connection is closed and opened again, which resets the queue.
//!
//! TLS is always verified (the system's roots plus `ca_file`; ring); the bearer token of
//! `token_env` and the `traceparent` of the connection's span travel on the upgrade request.

use super::AnswerError;
use super::{AnswerSink, Connector, Delivered, DeliveryError, Parcel, SetupError};
use crate::code::Code;
use crate::config::WsReach;
use crate::gateway::{Origin, Transport};
use crate::nlip::{self, Encoding, Message};
use crate::util::backoff::Backoff;
use crate::websocket::{DialError, Dialer, PING_EVERY, Socket, frame_of, message_of};
use futures_util::future::BoxFuture;
use futures_util::{SinkExt, StreamExt};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot, watch};
use tokio_tungstenite::tungstenite::Message as Frame;
use tracing::Instrument;

/// The backoff of reconnecting to an agent.
const CONNECT_INITIAL: Duration = Duration::from_millis(100);
const CONNECT_MAX: Duration = Duration::from_secs(5);

/// A frame written to the agent, waiting for its answer.
struct Pending {
    seq: u64,
    id: String,
    token: Option<String>,
    /// Somebody waits for the answer (the request of its message), so it is written again
    /// after a reconnect; notices are not.
    awaited: bool,
    frame: Frame,
    since: Instant,
    /// Set by the writer once the frame is on the socket.
    written: Arc<AtomicBool>,
    /// The `max_in_flight` slot; freed when the request is answered or overdue.
    slot: Option<OwnedSemaphorePermit>,
}

/// A frame for the writer, and who to tell when it is written.
struct Outgoing {
    frame: Frame,
    written: Option<(Arc<AtomicBool>, oneshot::Sender<()>)>,
}

#[derive(Default)]
struct State {
    /// The open connection's writer; `None` while disconnected.
    link: Option<mpsc::UnboundedSender<Outgoing>>,
    outstanding: VecDeque<Pending>,
    seq: u64,
}

struct Inner {
    name: String,
    dialer: Dialer,
    encoding: Encoding,
    timeout: Duration,
    reply_timeout: Duration,
    limits: nlip::Limits,
    max_in_flight: usize,
    slots: Arc<Semaphore>,
    answers: AnswerSink,
    state: Mutex<State>,
    connected: watch::Sender<bool>,
}

/// One agent reached over WebSocket.
pub(crate) struct WsAgent {
    inner: Arc<Inner>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Drop for WsAgent {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

impl WsAgent {
    /// Starts connecting at once (inside a runtime); `limits` bound the agent's answers,
    /// `reply_timeout` is the gateway's.
    pub(crate) fn new(
        name: &str,
        reach: &WsReach,
        limits: nlip::Limits,
        reply_timeout: Duration,
        answers: AnswerSink,
    ) -> Result<Self, SetupError> {
        let agent = &reach.outbound;
        let timeout = Duration::from_millis(agent.timeout_ms.max(1));
        let dialer = Dialer::new(
            &agent.url,
            agent.token_env.as_deref(),
            agent.ca_file.as_deref(),
            limits.max_bytes,
            timeout,
        )
        .map_err(|e| match e {
            DialError::TokenUnset(variable) => SetupError::TokenUnset { agent: name.to_owned(), variable },
            DialError::Invalid(detail) => SetupError::Client { agent: name.to_owned(), detail },
        })?;
        let max_in_flight = agent.max_in_flight.max(1);
        let inner = Arc::new(Inner {
            name: name.to_owned(),
            dialer,
            encoding: reach.encoding.nlip(),
            timeout,
            reply_timeout,
            limits,
            max_in_flight,
            slots: Arc::new(Semaphore::new(max_in_flight)),
            answers,
            state: Mutex::default(),
            connected: watch::channel(false).0,
        });
        let task =
            tokio::runtime::Handle::try_current().ok().map(|runtime| runtime.spawn(inner.clone().run()));
        Ok(WsAgent { inner, task })
    }
}

impl Connector for WsAgent {
    fn transport(&self) -> crate::transport::Transport {
        crate::transport::Transport::WebSocket
    }

    fn answers_in_call(&self) -> bool {
        false
    }

    fn deliver(&self, parcels: Vec<Parcel>) -> BoxFuture<'_, Result<Delivered, DeliveryError>> {
        Box::pin(self.inner.clone().send_all(parcels))
    }
}

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn unavailable(&self, code: &'static str, detail: String) -> DeliveryError {
        DeliveryError::Unavailable { agent: self.name.clone(), code, detail }
    }

    /// Writes the parcels in order; delivered once every frame is on the open socket.
    async fn send_all(self: Arc<Self>, parcels: Vec<Parcel>) -> Result<Delivered, DeliveryError> {
        let span = tracing::info_span!(
            "agent deliver",
            otel.name = "send",
            otel.kind = "client",
            network.protocol.name = "websocket",
            url.full = %self.dialer.url(),
            server.address = %self.dialer.host(),
            server.port = self.dialer.port(),
            messaging.batch.message_count = parcels.len(),
            silpgate.agent = %self.name,
            error.type = tracing::field::Empty,
        );
        let result = self.write(parcels).instrument(span.clone()).await;
        if let Err(e) = &result {
            span.record("error.type", e.code());
        }
        result
    }

    async fn write(&self, parcels: Vec<Parcel>) -> Result<Delivered, DeliveryError> {
        let deadline = tokio::time::Instant::now() + self.timeout;
        let mut slots = Vec::with_capacity(parcels.len());
        for _ in &parcels {
            let slot = tokio::time::timeout_at(deadline, self.slots.clone().acquire_owned()).await;
            match slot {
                Ok(Ok(slot)) => slots.push(slot),
                _ => {
                    return Err(self.unavailable(
                        "agent_unavailable",
                        format!("{} requests wait for its answers (max_in_flight)", self.max_in_flight),
                    ));
                }
            }
        }
        let mut connected = self.connected.subscribe();
        if !matches!(tokio::time::timeout_at(deadline, connected.wait_for(|up| *up)).await, Ok(Ok(_))) {
            return Err(self.unavailable(
                "agent_unavailable",
                format!("not connected to {} within {} ms", self.dialer.url(), self.timeout.as_millis()),
            ));
        }
        let mut confirmations = Vec::with_capacity(parcels.len());
        let mut seqs = Vec::with_capacity(parcels.len());
        {
            let mut state = self.lock();
            let Some(link) = state.link.clone() else {
                return Err(
                    self.unavailable(Code::AgentUnavailable.as_str(), "the connection just closed".into())
                );
            };
            for (parcel, slot) in parcels.into_iter().zip(slots) {
                state.seq += 1;
                let seq = state.seq;
                let frame = frame_of(&parcel.envelope, self.encoding);
                let written = Arc::new(AtomicBool::new(false));
                let (tx, rx) = oneshot::channel();
                state.outstanding.push_back(Pending {
                    seq,
                    token: parcel.envelope.conversation_token().map(str::to_owned),
                    awaited: parcel.answer_to.correlation().is_some(),
                    id: parcel.answer_to.correlation().map_or(parcel.message_id, str::to_owned),
                    frame: frame.clone(),
                    since: Instant::now(),
                    written: written.clone(),
                    slot: Some(slot),
                });
                // Registered before it is written, in write order: the answer finds it.
                let _ = link.send(Outgoing { frame, written: Some((written, tx)) });
                confirmations.push(rx);
                seqs.push(seq);
            }
        }
        let all_written =
            tokio::time::timeout_at(deadline, futures_util::future::join_all(confirmations)).await;
        if matches!(&all_written, Ok(results) if results.iter().all(Result::is_ok)) {
            return Ok(Delivered::default());
        }
        // What was not written is forgotten (the door retries the message); what was written
        // stays, so that the agent's answer to it still finds its place.
        self.lock().outstanding.retain(|p| !seqs.contains(&p.seq) || p.written.load(Ordering::SeqCst));
        Err(self.unavailable(
            Code::AgentUnavailable.as_str(),
            "the connection closed before the message was written".into(),
        ))
    }

    /// Connects, serves the connection until it ends, and connects again, forever.
    async fn run(self: Arc<Self>) {
        let mut backoff = Backoff::new(CONNECT_INITIAL, CONNECT_MAX);
        loop {
            let span = tracing::info_span!(
                "agent connect",
                otel.kind = "client",
                network.protocol.name = "websocket",
                url.full = %self.dialer.url(),
                server.address = %self.dialer.host(),
                server.port = self.dialer.port(),
                silpgate.agent = %self.name,
            );
            match self.dialer.connect(&span).instrument(span.clone()).await {
                Ok(socket) => {
                    tracing::info!(agent = %self.name, url = %self.dialer.url(), "Connected to the WebSocket agent.");
                    let since = std::time::Instant::now();
                    let why = self.serve(socket).await;
                    backoff.connection_ended(since.elapsed());
                    tracing::warn!(agent = %self.name, reason = %why, "The WebSocket agent's connection closed; reconnecting.");
                }
                Err(e) => {
                    tracing::warn!(agent = %self.name, url = %self.dialer.url(), error = %e, "Cannot connect to the WebSocket agent.");
                }
            }
            tokio::time::sleep(backoff.next_delay()).await;
        }
    }

    /// One connection: requests out, answers in, until it breaks. Returns why it ended.
    async fn serve(&self, socket: Socket) -> String {
        let (mut sink, mut stream) = socket.split();
        let (link, mut frames) = mpsc::unbounded_channel::<Outgoing>();
        {
            let mut state = self.lock();
            // Requests still waiting for an answer from the last connection go first; the
            // rest of the old queue (notices, unwritten or overdue frames) is dropped.
            let reply_timeout = self.reply_timeout;
            state.outstanding.retain(|p| {
                p.awaited && p.written.load(Ordering::SeqCst) && p.since.elapsed() < reply_timeout
            });
            for pending in &state.outstanding {
                let _ = link.send(Outgoing { frame: pending.frame.clone(), written: None });
            }
            state.link = Some(link);
        }
        self.connected.send_replace(true);
        let (answers_tx, answers_rx) = mpsc::unbounded_channel::<(String, Message)>();
        let answering = tokio::spawn(pass_answers(self.answers.clone(), self.name.clone(), answers_rx));
        let writing = async {
            while let Some(Outgoing { frame, written }) = frames.recv().await {
                let sent = tokio::time::timeout(self.timeout, sink.send(frame)).await;
                if !matches!(sent, Ok(Ok(()))) {
                    return "writing failed".to_owned();
                }
                if let Some((flag, tx)) = written {
                    flag.store(true, Ordering::SeqCst);
                    let _ = tx.send(());
                }
            }
            "closed".to_owned()
        };
        let reading = async {
            let mut ticker = tokio::time::interval(PING_EVERY);
            ticker.tick().await;
            let mut heard = Instant::now();
            loop {
                let next = tokio::select! {
                    next = stream.next() => next,
                    _ = ticker.tick() => {
                        if heard.elapsed() > 3 * PING_EVERY {
                            return "no frame for three ping intervals".to_owned();
                        }
                        if let Some(link) = &self.lock().link {
                            let _ = link.send(Outgoing { frame: Frame::Ping(Vec::new().into()), written: None });
                        }
                        if self.expire_overdue() {
                            return format!("{} requests are overdue: the answer queue is reset", self.max_in_flight);
                        }
                        continue;
                    }
                };
                heard = Instant::now();
                let frame = match next {
                    None => return "the agent closed the connection".to_owned(),
                    Some(Err(e)) => return e.to_string(),
                    Some(Ok(Frame::Close(_))) => return "the agent closed the connection".to_owned(),
                    Some(Ok(frame)) => frame,
                };
                let Some(decoded) = message_of(&frame, &self.limits) else { continue };
                let answer = decoded.unwrap_or_else(|why| {
                    let detail = format!("the answer of agent {} cannot be read: {why}", self.name);
                    nlip::reply::error_message(
                        Code::InvalidEnvelope.as_str(),
                        &detail,
                        &nlip::reply::Location::None,
                    )
                });
                let matched = correlate(&mut self.lock().outstanding, answer.conversation_token());
                match matched {
                    Some(pending) if pending.awaited => {
                        let _ = answers_tx.send((pending.id, answer));
                    }
                    Some(pending) => {
                        tracing::debug!(agent = %self.name, id = %pending.id, "An answer to a notice is dropped.");
                    }
                    None => {
                        crate::metrics::get().replies_orphaned.with_label_values(&["uncorrelated"]).inc();
                        tracing::warn!(agent = %self.name, "An answer that matches no request is dropped.");
                    }
                }
            }
        };
        let why = tokio::select! {
            why = writing => why,
            why = reading => why,
        };
        {
            let mut state = self.lock();
            state.link = None;
        }
        self.connected.send_replace(false);
        // Answers already read still go on; the task ends when its queue is empty.
        drop(answers_tx);
        drop(answering);
        why
    }

    /// Frees the slots of requests not answered within the reply timeout; true when as many
    /// are overdue as the agent has slots (the connection is then reset).
    fn expire_overdue(&self) -> bool {
        let mut state = self.lock();
        let mut overdue = 0;
        for pending in state.outstanding.iter_mut() {
            if pending.since.elapsed() >= self.reply_timeout {
                pending.slot = None;
                overdue += 1;
            }
        }
        overdue >= self.max_in_flight
    }
}

/// Hands answers to the intake one after another, in the order they came.
async fn pass_answers(
    sink: AnswerSink,
    agent: String,
    mut answers: mpsc::UnboundedReceiver<(String, Message)>,
) {
    while let Some((id, answer)) = answers.recv().await {
        let from = Origin::new(Transport::WebSocket, agent.as_str());
        let mut tries = 0;
        loop {
            match sink.pass(id.clone(), answer.clone(), from.clone()).await {
                Err(AnswerError::Retry(why)) if tries < 20 => {
                    tries += 1;
                    tracing::debug!(agent = %agent, id = %id, reason = %why, "An answer waits to be passed on.");
                    tokio::time::sleep(Duration::from_millis(100 * tries)).await;
                }
                Ok(()) => break,
                Err(e) => {
                    tracing::warn!(agent = %agent, id = %id, error = %e, "An answer could not be passed on.");
                    break;
                }
            }
        }
    }
}

/// The outstanding request an answer belongs to, taken out of the queue: the oldest of the
/// answer's conversation; for an answer without a token, the oldest without a token, else
/// the oldest.
fn correlate(outstanding: &mut VecDeque<Pending>, token: Option<&str>) -> Option<Pending> {
    let position = match token {
        Some(token) => outstanding.iter().position(|p| p.token.as_deref() == Some(token)),
        None => outstanding.iter().position(|p| p.token.is_none()).or((!outstanding.is_empty()).then_some(0)),
    }?;
    outstanding.remove(position)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pending(seq: u64, token: Option<&str>) -> Pending {
        Pending {
            seq,
            id: format!("m-{seq}"),
            token: token.map(str::to_owned),
            awaited: true,
            frame: Frame::Text("{}".into()),
            since: Instant::now(),
            written: Arc::new(AtomicBool::new(true)),
            slot: None,
        }
    }

    #[test]
    fn answers_match_the_oldest_request_of_their_conversation() {
        let mut queue: VecDeque<Pending> =
            [pending(1, Some("a")), pending(2, Some("b")), pending(3, Some("a")), pending(4, None)].into();
        assert_eq!(correlate(&mut queue, Some("a")).map(|p| p.seq), Some(1));
        assert_eq!(correlate(&mut queue, Some("a")).map(|p| p.seq), Some(3));
        assert_eq!(correlate(&mut queue, Some("a")).map(|p| p.seq), None, "nothing left in a");
        assert_eq!(correlate(&mut queue, None).map(|p| p.seq), Some(4), "no token: the oldest without one");
        assert_eq!(correlate(&mut queue, None).map(|p| p.seq), Some(2), "then the oldest");
        assert!(correlate(&mut queue, None).is_none());
    }

    #[test]
    fn the_dialer_keeps_credentials_out_of_the_url_it_shows() {
        let dialer =
            Dialer::new("ws://user:secret@127.0.0.1:9/agent?x=1", None, None, 1024, Duration::from_secs(1))
                .unwrap();
        assert_eq!(dialer.url(), "ws://127.0.0.1:9/agent?x=1");
        assert_eq!((dialer.host(), dialer.port()), ("127.0.0.1", 9));
        let e =
            Dialer::new("ws://h/", Some("SILPGATE_TEST_UNSET_TOKEN_VAR"), None, 1, Duration::from_secs(1));
        assert!(matches!(e, Err(DialError::TokenUnset(_))));
    }
}
