//! Publishing that is safe by construction: every message is mandatory, and a publish
//! succeeds only when the broker confirms it. A message the broker returns as unroutable is
//! confirmed too (RabbitMQ confirms guide), so a return is a failure here.
//!
//! A return is matched to its publish by what the message is, not by which confirm lapin hands
//! it to: lapin attaches a returned message to the first confirm it completes after the return
//! arrived, and when the broker confirms several publishes at once (`multiple`) that is any one
//! of them. Left as it was, a returned answer could pass for delivered (and its inbound
//! message be acknowledged, so lost) while a delivered one was retried. One settling task per
//! channel owns every outstanding confirm and decides them, see [`settle`].
//!
//! One exception: a reply to a [direct reply-to](DIRECT_REPLY_TO) address goes to a waiting
//! client's channel, not to a queue, and RabbitMQ returns a mandatory publish to it as
//! unroutable even when it delivers it. It is published without `mandatory`: when the client
//! has gone the reply is worth nothing, and its absence is not a failure to retry.

use crate::code::Code;
use lapin::message::BasicReturnMessage;
use lapin::options::BasicPublishOptions;
use lapin::{BasicProperties, Channel, Confirmation, PublisherConfirm};
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};
use tokio::sync::{Notify, mpsc, oneshot};

/// Why a publish did not make it into a queue.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error("unroutable: no queue is bound to exchange '{exchange}' with routing key '{routing_key}'")]
    Unroutable { exchange: String, routing_key: String },
    #[error(
        "refused by the broker (nack) on exchange '{exchange}', routing key '{routing_key}': a target queue may be full"
    )]
    Refused { exchange: String, routing_key: String },
    #[error("not confirmed within {0:?}")]
    Timeout(Duration),
    #[error("channel failed: {0}")]
    Channel(#[from] lapin::Error),
}

impl PublishError {
    /// The error code carried in dead-letter headers and logs.
    pub(crate) fn code(&self) -> &'static str {
        match self {
            PublishError::Unroutable { .. } => Code::Unroutable.as_str(),
            PublishError::Refused { .. } => Code::PublishRefused.as_str(),
            PublishError::Timeout(_) => Code::PublishTimeout.as_str(),
            PublishError::Channel(_) => Code::BrokerUnavailable.as_str(),
        }
    }
}

/// RabbitMQ's direct reply-to pseudo-queue: a client consuming it (without acknowledgements,
/// on the channel it publishes requests from) gets replies sent to the address the broker puts
/// in its requests' `reply_to`, which starts with this name, without a queue in between.
pub const DIRECT_REPLY_TO: &str = "amq.rabbitmq.reply-to";

/// One message to publish.
pub struct Publication<'a> {
    pub exchange: &'a str,
    pub routing_key: &'a str,
    pub body: Vec<u8>,
    pub properties: BasicProperties,
}

/// A confirm-mode channel, which the connection's owner may replace by a fresh one when the
/// broker refuses a publish (see [`Publisher::renewing`]). Clones share the channel in use.
#[derive(Clone)]
pub struct Publisher {
    shared: Arc<Shared>,
}

struct Shared {
    lane: Mutex<Arc<Lane>>,
    confirm_timeout: Duration,
    /// Where a refusal asks for a fresh channel, naming the channel that refused.
    renewals: Option<mpsc::UnboundedSender<ChannelId>>,
    /// When the channel in use was opened to replace a refusing one.
    renewed_at: Mutex<Option<Instant>>,
}

/// One channel's publishing: its order and its settling task.
struct Lane {
    channel: Channel,
    sending: Arc<Sending>,
    /// Told when the settling task has decided the lane's last publish.
    settled: Mutex<Option<oneshot::Receiver<()>>>,
}

/// How publishes reach the channel's settling task: in the order the channel numbered them.
struct Sending {
    order: Mutex<Order>,
    bell: Arc<Bell>,
}

struct Order {
    next_id: u64,
    settling: mpsc::UnboundedSender<Outstanding>,
}

/// A channel's number on its connection.
pub(crate) type ChannelId = u16;

/// How soon after one renewal a refusal may ask for another: a fresh channel opened before the
/// broker has elected a queue's new leader refuses too, and asking again at once would only
/// churn channels while the election runs.
pub const RENEWAL_PAUSE: Duration = Duration::from_secs(1);

impl Lane {
    /// Starts the channel's settling task, which ends once the lane is dropped and every
    /// publish it holds is decided.
    fn start(channel: Channel) -> Arc<Lane> {
        let (settling, incoming) = mpsc::unbounded_channel();
        let sending = Arc::new(Sending {
            order: Mutex::new(Order { next_id: 0, settling }),
            bell: Arc::new(Bell::default()),
        });
        let (done, settled) = oneshot::channel();
        let task = settle(incoming, Arc::downgrade(&sending), Arc::clone(&sending.bell));
        tokio::spawn(async move {
            task.await;
            let _ = done.send(());
        });
        Arc::new(Lane { channel, sending, settled: Mutex::new(Some(settled)) })
    }
}

impl Publisher {
    /// `channel` must be in confirm mode (`confirm_select`). Starts the channel's settling task,
    /// so it must be called on a Tokio runtime; the task ends with the last clone of this
    /// publisher once every publish it holds is decided.
    pub fn new(channel: Channel, confirm_timeout: Duration) -> Self {
        Publisher::build(channel, confirm_timeout, None)
    }

    /// A publisher whose refusals ask for a fresh channel through the returned receiver: it
    /// names the channel that refused, and whoever holds the connection answers with
    /// [`Publisher::replace`].
    ///
    /// Why: RabbitMQ (3.10) keeps a channel's publishing state for each quorum queue, made on
    /// the channel's first publish to it from the queue's recorded leader. Made while that
    /// leader's node is dead (a connection that moved to another node at once), it refuses
    /// every publish to the queue for as long as the channel lives. A fresh channel, opened
    /// once the queue has its new leader, publishes normally. A refusal for another reason (a
    /// full queue) costs a channel a second at most.
    pub fn renewing(
        channel: Channel,
        confirm_timeout: Duration,
    ) -> (Self, mpsc::UnboundedReceiver<ChannelId>) {
        let (asks, renewals) = mpsc::unbounded_channel();
        (Publisher::build(channel, confirm_timeout, Some(asks)), renewals)
    }

    fn build(
        channel: Channel,
        confirm_timeout: Duration,
        renewals: Option<mpsc::UnboundedSender<ChannelId>>,
    ) -> Self {
        let lane = Lane::start(channel);
        let shared =
            Shared { lane: Mutex::new(lane), confirm_timeout, renewals, renewed_at: Mutex::new(None) };
        Publisher { shared: Arc::new(shared) }
    }

    /// The channel in use.
    pub fn channel(&self) -> Channel {
        self.lane().channel.clone()
    }

    fn lane(&self) -> Arc<Lane> {
        Arc::clone(&self.shared.lane.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Publishes on `channel` (in confirm mode) from now on. The channel it replaces is closed
    /// once every publish sent on it is decided and `linger` has passed (what answers its
    /// publishes, such as direct reply-to, arrives on it meanwhile).
    pub fn replace(&self, channel: Channel, linger: Duration) {
        let lane = Lane::start(channel);
        let retired =
            std::mem::replace(&mut *self.shared.lane.lock().unwrap_or_else(PoisonError::into_inner), lane);
        *self.shared.renewed_at.lock().unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
        let channel = retired.channel.clone();
        let settled = retired.settled.lock().unwrap_or_else(PoisonError::into_inner).take();
        drop(retired);
        tokio::spawn(async move {
            if let Some(settled) = settled {
                let _ = settled.await;
            }
            tokio::time::sleep(linger).await;
            let _ = channel.close(200, "replaced after a refused publish".into()).await;
        });
    }

    /// Publishes `publications` in order on the one channel (so that their order holds) and
    /// waits until the broker has confirmed every one of them.
    ///
    /// # Errors
    /// The first failure; messages before it may have been delivered (receivers dedupe on
    /// `message_id`).
    pub async fn publish_all(&self, publications: Vec<Publication<'_>>) -> Result<(), PublishError> {
        let mut pending = Vec::with_capacity(publications.len());
        for p in publications {
            pending.push(self.send(p)?);
        }
        for confirm in pending {
            confirm.confirmed().await?;
        }
        Ok(())
    }

    /// Hands one message to the channel without waiting for it to be written or confirmed:
    /// messages sent one after another on this channel keep their order.
    ///
    /// # Errors
    /// The channel failed.
    pub fn send(&self, p: Publication<'_>) -> Result<Pending, PublishError> {
        let direct_reply = p.exchange.is_empty() && p.routing_key.starts_with(DIRECT_REPLY_TO);
        let options = BasicPublishOptions { mandatory: !direct_reply, immediate: false };
        let identity = Identity::of(p.exchange, p.routing_key, &p.properties, p.body.len());
        let lane = self.lane();
        let channel = lane.channel.clone();
        let (exchange, routing_key) = (p.exchange.into(), p.routing_key.into());
        let Publication { body, properties, .. } = p;
        let mut publishing: Publishing = Box::pin(async move {
            channel.basic_publish(exchange, routing_key, options, &body, properties).await
        });
        let (decided, verdict) = oneshot::channel();

        // lapin numbers the publish (its confirm's delivery tag) and queues its frames in the
        // first poll, before its first await. Doing that and handing it to the settling task
        // under one lock keeps the settling task's order the channel's (see `settle`).
        let mut order = lane.sending.order.lock().unwrap_or_else(PoisonError::into_inner);
        let id = order.next_id;
        let waker = Waker::from(Arc::new(ConfirmWaker { id, bell: Arc::clone(&lane.sending.bell) }));
        let stage = match publishing.as_mut().poll(&mut Context::from_waker(&waker)) {
            Poll::Ready(Err(e)) => return Err(PublishError::Channel(e)),
            Poll::Ready(Ok(confirm)) => Stage::Confirming(confirm),
            Poll::Pending => Stage::Publishing(publishing),
        };
        order.next_id += 1;
        // The settling task ends only once every publisher is gone, and this is one.
        let _ = order.settling.send(Outstanding { id, identity, stage, waker, decided });
        drop(order);
        let refusals = Refusals { publisher: Arc::downgrade(&self.shared), channel: lane.channel.id() };
        Ok(Pending { verdict, timeout: self.shared.confirm_timeout, refusals })
    }
}

/// A message sent and not yet confirmed.
pub struct Pending {
    verdict: oneshot::Receiver<Result<(), PublishError>>,
    timeout: Duration,
    refusals: Refusals,
}

/// Where a refused publish reports its channel.
struct Refusals {
    publisher: Weak<Shared>,
    channel: ChannelId,
}

impl Shared {
    /// Asks for a fresh channel when `channel` is still the one in use and the last renewal
    /// is at least [`RENEWAL_PAUSE`] old.
    fn refused(&self, channel: ChannelId) {
        let Some(renewals) = &self.renewals else { return };
        if self.lane.lock().unwrap_or_else(PoisonError::into_inner).channel.id() != channel {
            return;
        }
        let mut renewed_at = self.renewed_at.lock().unwrap_or_else(PoisonError::into_inner);
        if renewed_at.is_some_and(|at| at.elapsed() < RENEWAL_PAUSE) {
            return;
        }
        // Counted as a renewal from the ask on, so that a burst of refusals asks once.
        *renewed_at = Some(Instant::now());
        let _ = renewals.send(channel);
    }
}

impl Pending {
    /// Waits for the broker's confirm.
    ///
    /// # Errors
    /// Returned as unroutable, refused (nack), not confirmed in time, or the channel failed.
    pub async fn confirmed(self) -> Result<(), PublishError> {
        match tokio::time::timeout(self.timeout, self.verdict).await {
            Ok(Ok(verdict)) => {
                if let (Err(PublishError::Refused { .. }), Some(publisher)) =
                    (&verdict, self.refusals.publisher.upgrade())
                {
                    publisher.refused(self.refusals.channel);
                }
                verdict
            }
            Ok(Err(_)) => {
                let state = lapin::ChannelState::Closed;
                Err(PublishError::Channel(
                    lapin::ErrorKind::InvalidChannelState(state, "no longer settled").into(),
                ))
            }
            Err(_) => Err(PublishError::Timeout(self.timeout)),
        }
    }
}

/// What a returned message is matched on: enough to tell apart the publishes in flight on one
/// channel (their message ids differ), without keeping a copy of every body.
#[derive(Debug, PartialEq, Eq)]
struct Identity {
    exchange: String,
    routing_key: String,
    message_id: Option<String>,
    length: usize,
}

impl Identity {
    fn of(exchange: &str, routing_key: &str, properties: &BasicProperties, length: usize) -> Self {
        Identity {
            exchange: exchange.to_owned(),
            routing_key: routing_key.to_owned(),
            message_id: properties.message_id().as_ref().map(|id| id.as_str().to_owned()),
            length,
        }
    }

    fn of_return(message: &BasicReturnMessage) -> Self {
        let delivery = &message.delivery;
        let (exchange, routing_key) = (delivery.exchange.as_str(), delivery.routing_key.as_str());
        Identity::of(exchange, routing_key, &delivery.properties, delivery.data.len())
    }
}

/// A publish being written to the channel (lapin resolves it once its frames are out).
type Publishing = Pin<Box<dyn Future<Output = lapin::Result<PublisherConfirm>> + Send>>;

/// Where a publish is: its frames on their way to the socket, waiting for its confirm, or
/// complete, its outcome among those of the round (a confirm is polled to completion once).
enum Stage {
    Publishing(Publishing),
    Confirming(PublisherConfirm),
    Complete,
}

/// A publish the settling task holds, with the waker it is polled with.
struct Outstanding {
    /// Its place in the channel's order.
    id: u64,
    identity: Identity,
    stage: Stage,
    waker: Waker,
    decided: oneshot::Sender<Result<(), PublishError>>,
}

/// Which confirms have woken the settling task since it last looked: each outstanding confirm
/// is polled with a waker of its own, so a round looks only at the confirms that moved, not
/// at every one in flight.
#[derive(Default)]
struct Bell {
    woken: Mutex<Vec<u64>>,
    ring: Notify,
}

struct ConfirmWaker {
    id: u64,
    bell: Arc<Bell>,
}

impl Wake for ConfirmWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.bell.woken.lock().unwrap_or_else(PoisonError::into_inner).push(self.id);
        self.bell.ring.notify_one();
    }
}

/// The publishes in flight, by the order the channel numbered them (ids count up from `base`).
#[derive(Default)]
struct InFlight {
    base: u64,
    slots: VecDeque<Option<Outstanding>>,
}

impl InFlight {
    fn push(&mut self, publish: Outstanding) -> u64 {
        let id = publish.id;
        assert_eq!(id, self.base + self.slots.len() as u64, "publishes arrive in the channel's order");
        self.slots.push_back(Some(publish));
        id
    }

    fn get_mut(&mut self, id: u64) -> Option<&mut Outstanding> {
        let at = usize::try_from(id.checked_sub(self.base)?).ok()?;
        self.slots.get_mut(at)?.as_mut()
    }

    fn remove(&mut self, id: u64) -> Option<Outstanding> {
        let at = usize::try_from(id.checked_sub(self.base)?).ok()?;
        let publish = self.slots.get_mut(at)?.take()?;
        while let Some(None) = self.slots.front() {
            self.slots.pop_front();
            self.base += 1;
        }
        Some(publish)
    }

    fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }
}

/// Decides every publish of one channel.
///
/// lapin completes confirms on its I/O thread one after another, waking each one's waiter as
/// it goes, and a returned message is attached to a confirm completed no later than its own
/// publish's (the broker sends the return before the confirm). So by the time one publish is
/// seen complete, the publish carrying its return, if any, is complete too, and either has
/// woken this task (every publish held here is polled with a waker of its own, and wakes it
/// when its frames are out and when its confirm arrives) or is not here yet: it was numbered
/// before that completion, so it is in the queue once no send holds the sending lock.
///
/// A completion seen in one pass is therefore decided only after a later pass has taken in
/// the queue and polled every publish that woke meanwhile, with the returns they carry: a
/// publish fails as unroutable when a return with its identity has been seen. A return is
/// kept until its publish is decided (it can ride an earlier confirm than its own); two
/// publishes in flight with the same identity both fail when one of them is returned, which
/// at worst sends one of them twice, never loses it.
async fn settle(mut incoming: mpsc::UnboundedReceiver<Outstanding>, sending: Weak<Sending>, bell: Arc<Bell>) {
    let mut in_flight = InFlight::default();
    let mut seen: Vec<(u64, lapin::Result<Confirmation>)> = Vec::new();
    let mut returned: Vec<Identity> = Vec::new();
    let mut open = true;
    while open || !in_flight.is_empty() {
        tokio::select! {
            next = incoming.recv(), if open => match next {
                Some(publish) => {
                    let id = in_flight.push(publish);
                    poll(&mut in_flight, id, &mut seen, &mut returned);
                }
                None => open = false,
            },
            () = bell.ring.notified() => {}
        }
        loop {
            let earlier = std::mem::take(&mut seen);
            // Everything numbered so far is in the queue once no send holds the lock (and
            // none can, once every publisher is gone).
            if let Some(sending) = sending.upgrade() {
                drop(sending.order.lock().unwrap_or_else(PoisonError::into_inner));
            }
            while let Ok(publish) = incoming.try_recv() {
                let id = in_flight.push(publish);
                poll(&mut in_flight, id, &mut seen, &mut returned);
            }
            let woken = std::mem::take(&mut *bell.woken.lock().unwrap_or_else(PoisonError::into_inner));
            for id in woken {
                poll(&mut in_flight, id, &mut seen, &mut returned);
            }
            decide(&mut in_flight, earlier, &mut returned);
            if seen.is_empty() {
                break;
            }
        }
    }
}

/// Tells each completed publish its verdict and lets it go.
fn decide(
    in_flight: &mut InFlight,
    completed: Vec<(u64, lapin::Result<Confirmation>)>,
    returned: &mut Vec<Identity>,
) {
    let mut matched = Vec::new();
    for (id, outcome) in completed {
        let Some(Outstanding { identity, decided, .. }) = in_flight.remove(id) else { continue };
        let was_returned = returned.iter().position(|r| *r == identity);
        matched.extend(was_returned);
        let verdict = match outcome {
            Err(error) => Err(PublishError::Channel(error)),
            Ok(Confirmation::Nack(_)) => {
                Err(PublishError::Refused { exchange: identity.exchange, routing_key: identity.routing_key })
            }
            Ok(_) if was_returned.is_some() => Err(PublishError::Unroutable {
                exchange: identity.exchange,
                routing_key: identity.routing_key,
            }),
            Ok(Confirmation::Ack(_) | Confirmation::NotRequested) => Ok(()),
        };
        // A receiver that gave up waiting (timeout) has nothing left to tell.
        let _ = decided.send(verdict);
    }
    matched.sort_unstable();
    matched.dedup();
    for at in matched.into_iter().rev() {
        returned.swap_remove(at);
    }
    if in_flight.is_empty() && !returned.is_empty() {
        // Cannot happen by the rule above; if a broker ever broke it, the unmatched returns
        // must not fail a later publish that happens to look the same.
        tracing::warn!(count = returned.len(), "returned messages matched no publish in flight");
        returned.clear();
    }
}

/// Polls publish `id` with its own waker, if it is still waiting: its frames' way out, then
/// its confirm. On completion notes its outcome and the return it carries (which may be
/// another publish's).
fn poll(
    in_flight: &mut InFlight,
    id: u64,
    completed: &mut Vec<(u64, lapin::Result<Confirmation>)>,
    returned: &mut Vec<Identity>,
) {
    let Some(publish) = in_flight.get_mut(id) else { return };
    let mut context = Context::from_waker(&publish.waker);
    if let Stage::Publishing(publishing) = &mut publish.stage {
        match publishing.as_mut().poll(&mut context) {
            Poll::Pending => return,
            Poll::Ready(Ok(confirm)) => publish.stage = Stage::Confirming(confirm),
            Poll::Ready(Err(error)) => {
                publish.stage = Stage::Complete;
                completed.push((id, Err(error)));
                return;
            }
        }
    }
    let Stage::Confirming(confirm) = &mut publish.stage else { return };
    let Poll::Ready(outcome) = Pin::new(confirm).poll(&mut context) else { return };
    if let Ok(Confirmation::Ack(Some(message)) | Confirmation::Nack(Some(message))) = &outcome {
        returned.push(Identity::of_return(message));
    }
    publish.stage = Stage::Complete;
    completed.push((id, outcome));
}
