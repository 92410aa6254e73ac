//! Requests waiting for an agent's answer, by the id of the parcel the agent answers: where the
//! answer goes (the asker's door, behind [`ReturnPath`]), in which form, and until when.
//!
//! Every wait ends exactly once: with the answer, or at the reply timeout with an NLIP
//! `timeout` error sent the same way. All waits share one timeout, so they expire in the order
//! they began: a queue, not a timer per request.
//!
//! A request whose sender has heard its outcome (the `timeout`, or the error when retries ran
//! out) is remembered for a while as concluded: a later attempt at it (an AMQP retry) waits for
//! no answer, so that the sender never hears a second outcome.

use crate::connectors::Progress;
use crate::gateway::payload::OutputForm;
use crate::nlip::Message;
use futures_util::future::BoxFuture;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Why an answer could not be handed to its asker's door.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub(crate) enum Returned {
    /// The asker is gone (the socket closed, the HTTP request ended): nobody will take it.
    #[error("the requester is gone")]
    Gone,
    /// The door could not take it now (its broker publish failed): try again.
    #[error("the answer could not be passed on: {0}")]
    Retry(String),
}

/// How an answer reaches the door its request came through; and the answer's interim events
/// (an agent's progress), for a door that passes them on (most take only the answer).
pub(crate) trait ReturnPath: Progress + Send + Sync {
    fn send(&self, answer: Message) -> BoxFuture<'_, Result<(), Returned>>;
}

/// The return path of a door that waits in place (an HTTP request, a WebSocket): the answer
/// goes to a channel its handler reads, and, for a handler that streams, interim events to
/// another.
pub(crate) struct InPlace {
    answer: Mutex<Option<tokio::sync::oneshot::Sender<Message>>>,
    progress: Option<tokio::sync::mpsc::UnboundedSender<Message>>,
}

impl InPlace {
    /// A return path for the answer that also takes interim events, sent to `progress` when
    /// given.
    pub(crate) fn new(
        progress: Option<tokio::sync::mpsc::UnboundedSender<Message>>,
    ) -> (Arc<InPlace>, tokio::sync::oneshot::Receiver<Message>) {
        let (tx, rx) = tokio::sync::oneshot::channel();
        (Arc::new(InPlace { answer: Mutex::new(Some(tx)), progress }), rx)
    }
}

impl ReturnPath for InPlace {
    fn send(&self, answer: Message) -> BoxFuture<'_, Result<(), Returned>> {
        let sender = self.answer.lock().unwrap_or_else(|p| p.into_inner()).take();
        let sent = sender.map_or(Err(Returned::Gone), |tx| tx.send(answer).map_err(|_| Returned::Gone));
        Box::pin(std::future::ready(sent))
    }
}

impl Progress for InPlace {
    fn progress(&self, event: Message) {
        if let Some(progress) = &self.progress {
            // An asker that is gone takes no more events; the answer is still delivered.
            let _ = progress.send(event);
        }
    }

    /// A handler that streams gives the work up by dropping its end of the events.
    fn abandoned(&self) -> bool {
        self.progress.as_ref().is_some_and(tokio::sync::mpsc::UnboundedSender::is_closed)
    }
}

/// One request waiting for its agent.
#[derive(Clone)]
pub(crate) struct Waiter {
    pub agent: String,
    /// The form the asker reads SILP in.
    pub form: OutputForm,
    pub path: Arc<dyn ReturnPath>,
    pub since: Instant,
    /// The inbound message the request came from, the same on every attempt at it.
    pub request: String,
}

/// How long a concluded request is remembered: longer than any retry schedule runs.
const CONCLUDED_FOR: Duration = Duration::from_secs(30 * 60);
/// Concluded requests remembered at most; the oldest are forgotten first.
const MAX_CONCLUDED: usize = 100_000;

#[derive(Default)]
struct Inner {
    by_id: HashMap<String, Waiter>,
    /// (deadline, id) in the order waits began, which is the order they expire in.
    deadlines: VecDeque<(Instant, String)>,
    /// Requests whose sender heard their outcome, and when, oldest first.
    concluded: HashMap<String, Instant>,
    concluded_order: VecDeque<(Instant, String)>,
}

impl Inner {
    fn conclude(&mut self, request: String, now: Instant) {
        while self.concluded_order.len() >= MAX_CONCLUDED
            || self.concluded_order.front().is_some_and(|(at, _)| now.duration_since(*at) > CONCLUDED_FOR)
        {
            let (at, old) = self.concluded_order.pop_front().expect("checked");
            if self.concluded.get(&old) == Some(&at) {
                self.concluded.remove(&old);
            }
        }
        self.concluded.insert(request.clone(), now);
        self.concluded_order.push_back((now, request));
    }
}

/// Every request waiting for an answer.
pub(crate) struct Waiting {
    inner: Mutex<Inner>,
    timeout: Duration,
}

impl Waiting {
    pub(crate) fn new(timeout: Duration) -> Self {
        Waiting { inner: Mutex::default(), timeout }
    }

    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts a wait for the answer to parcel `id`.
    pub(crate) fn wait(&self, id: &str, waiter: Waiter) {
        let deadline = waiter.since + self.timeout;
        let mut inner = self.lock();
        inner.by_id.insert(id.to_owned(), waiter);
        inner.deadlines.push_back((deadline, id.to_owned()));
    }

    /// Ends the wait for `id` and returns it, if it is still waiting.
    pub(crate) fn take(&self, id: &str) -> Option<Waiter> {
        self.lock().by_id.remove(id)
    }

    /// Puts a wait back whose answer could not be passed on yet, if its time is not up.
    pub(crate) fn restore(&self, id: &str, waiter: Waiter) {
        if waiter.since + self.timeout > Instant::now() {
            self.lock().by_id.insert(id.to_owned(), waiter);
        }
    }

    /// Ends the waits whose time is up, and returns them; their requests are concluded (the
    /// caller tells each sender).
    pub(crate) fn expired(&self, now: Instant) -> Vec<Waiter> {
        let mut inner = self.lock();
        let mut expired = Vec::new();
        while inner.deadlines.front().is_some_and(|(deadline, _)| *deadline <= now) {
            let (_, id) = inner.deadlines.pop_front().expect("checked");
            if let Some(waiter) = inner.by_id.remove(&id) {
                inner.conclude(waiter.request.clone(), now);
                expired.push(waiter);
            }
        }
        expired
    }

    /// Notes that `request`'s sender heard its outcome. False if it had already.
    pub(crate) fn conclude(&self, request: &str) -> bool {
        let mut inner = self.lock();
        let first = !inner.concluded.contains_key(request);
        inner.conclude(request.to_owned(), Instant::now());
        first
    }

    /// Whether `request`'s sender has heard its outcome.
    pub(crate) fn is_concluded(&self, request: &str) -> bool {
        self.lock().concluded.contains_key(request)
    }

    /// Requests waiting now.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.lock().by_id.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::silp::Frontend;

    fn waiter(since: Instant) -> (Waiter, tokio::sync::oneshot::Receiver<Message>) {
        let (path, rx) = InPlace::new(None);
        let form = OutputForm::Surface(Frontend::Code);
        (Waiter { agent: "a".into(), form, path, since, request: "m".into() }, rx)
    }

    #[test]
    fn a_wait_ends_once_by_answer_or_by_time() {
        let waiting = Waiting::new(Duration::from_secs(1));
        let start = Instant::now();
        waiting.wait("m:0", waiter(start).0);
        waiting.wait("m:1", waiter(start).0);
        assert!(waiting.take("m:0").is_some());
        assert!(waiting.take("m:0").is_none(), "an answer ends a wait once");
        assert!(waiting.expired(start).is_empty(), "nothing is due yet");
        let due = waiting.expired(start + Duration::from_secs(1));
        assert_eq!(due.len(), 1, "only the wait still open expires");
        assert_eq!(waiting.len(), 0);
        assert!(waiting.is_concluded("m"), "its sender heard the timeout");
        assert!(!waiting.conclude("m"), "and hears nothing more");
        assert!(waiting.conclude("other"));
    }

    #[test]
    fn an_in_place_path_tells_when_the_asker_is_gone() {
        let (path, rx) = InPlace::new(None);
        drop(rx);
        let answer = Message::text("late");
        let sent = futures_util::FutureExt::now_or_never(path.send(answer)).expect("ready");
        assert_eq!(sent, Err(Returned::Gone));
    }
}
