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

use lapin::message::BasicReturnMessage;
use lapin::options::BasicPublishOptions;
use lapin::{BasicProperties, Channel, Confirmation, PublisherConfirm};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;
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
    pub fn code(&self) -> &'static str {
        match self {
            PublishError::Unroutable { .. } => "unroutable",
            PublishError::Refused { .. } => "publish_refused",
            PublishError::Timeout(_) => "publish_timeout",
            PublishError::Channel(_) => "broker_unavailable",
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

/// A confirm-mode channel.
#[derive(Clone)]
pub struct Publisher {
    channel: Channel,
    confirm_timeout: Duration,
    settling: mpsc::UnboundedSender<Outstanding>,
}

impl Publisher {
    /// `channel` must be in confirm mode (`confirm_select`). Starts the channel's settling task,
    /// so it must be called on a Tokio runtime; the task ends with the last clone of this
    /// publisher once every confirm it holds is decided.
    pub fn new(channel: Channel, confirm_timeout: Duration) -> Self {
        let (settling, outstanding) = mpsc::unbounded_channel();
        tokio::spawn(settle(outstanding));
        Publisher { channel, confirm_timeout, settling }
    }

    pub fn channel(&self) -> &Channel {
        &self.channel
    }

    /// Publishes `publications` in order on the one channel (so that their order holds) and
    /// waits until the broker has confirmed every one of them.
    ///
    /// # Errors
    /// The first failure; messages before it may have been delivered (receivers dedupe on
    /// `message_id`).
    pub async fn publish_all(&self, publications: Vec<Publication<'_>>) -> Result<(), PublishError> {
        let mut pending = Vec::with_capacity(publications.len());
        for p in &publications {
            pending.push(self.send(p).await?);
        }
        for confirm in pending {
            confirm.confirmed().await?;
        }
        Ok(())
    }

    /// Hands one message to the broker without waiting for its confirm: messages sent one
    /// after another on this channel keep their order.
    ///
    /// # Errors
    /// The channel failed.
    pub async fn send(&self, p: &Publication<'_>) -> Result<Pending, PublishError> {
        let direct_reply = p.exchange.is_empty() && p.routing_key.starts_with(DIRECT_REPLY_TO);
        let options = BasicPublishOptions { mandatory: !direct_reply, immediate: false };
        let confirm = self
            .channel
            .basic_publish(p.exchange.into(), p.routing_key.into(), options, &p.body, p.properties.clone())
            .await?;
        let (decided, verdict) = oneshot::channel();
        let identity = Identity {
            exchange: p.exchange.to_owned(),
            routing_key: p.routing_key.to_owned(),
            message_id: p.properties.message_id().as_ref().map(|id| id.as_str().to_owned()),
            length: p.body.len(),
        };
        // The settling task ends only once every publisher is gone, and this is one.
        let _ = self.settling.send(Outstanding { identity, confirm, outcome: None, decided });
        Ok(Pending { verdict, timeout: self.confirm_timeout })
    }
}

/// A message sent and not yet confirmed.
pub struct Pending {
    verdict: oneshot::Receiver<Result<(), PublishError>>,
    timeout: Duration,
}

impl Pending {
    /// Waits for the broker's confirm.
    ///
    /// # Errors
    /// Returned as unroutable, refused (nack), not confirmed in time, or the channel failed.
    pub async fn confirmed(self) -> Result<(), PublishError> {
        match tokio::time::timeout(self.timeout, self.verdict).await {
            Ok(Ok(verdict)) => verdict,
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
    fn of_return(message: &BasicReturnMessage) -> Self {
        let delivery = &message.delivery;
        Identity {
            exchange: delivery.exchange.as_str().to_owned(),
            routing_key: delivery.routing_key.as_str().to_owned(),
            message_id: delivery.properties.message_id().as_ref().map(|id| id.as_str().to_owned()),
            length: delivery.data.len(),
        }
    }
}

/// A publish whose confirm the settling task holds.
struct Outstanding {
    identity: Identity,
    confirm: PublisherConfirm,
    outcome: Option<lapin::Result<Confirmation>>,
    decided: oneshot::Sender<Result<(), PublishError>>,
}

/// Wakes the settling task when any confirm it polled completes.
struct ConfirmBell(Notify);

impl Wake for ConfirmBell {
    fn wake(self: Arc<Self>) {
        self.0.notify_one();
    }
}

/// Decides every publish of one channel.
///
/// lapin completes confirms on its I/O thread one after another, and a returned message is
/// attached to a confirm completed no later than its own publish's (the broker sends the
/// return before the confirm). So once one confirm is seen complete, the confirm carrying its
/// return, if any, is complete too. Each round therefore first collects every completed
/// confirm and the returns they carry, and only then decides them: a publish fails as
/// unroutable when a return with its identity has been seen. A return is kept until its
/// publish is decided (it can ride an earlier confirm than its own); two publishes in flight
/// with the same identity both fail when one of them is returned, which at worst sends one of
/// them twice, never loses it.
async fn settle(mut incoming: mpsc::UnboundedReceiver<Outstanding>) {
    let bell = Arc::new(ConfirmBell(Notify::new()));
    let waker = Waker::from(Arc::clone(&bell));
    let mut outstanding: Vec<Outstanding> = Vec::new();
    let mut returned: Vec<Identity> = Vec::new();
    let mut open = true;
    while open || !outstanding.is_empty() {
        let mut sweep = false;
        tokio::select! {
            next = incoming.recv(), if open => match next {
                Some(mut publish) => {
                    // A first poll registers the bell; a confirm already complete calls for a round.
                    sweep = poll_confirm(&mut publish, &waker, &mut returned);
                    outstanding.push(publish);
                }
                None => open = false,
            },
            () = bell.0.notified() => sweep = true,
        }
        if !sweep {
            continue;
        }
        for publish in outstanding.iter_mut().filter(|p| p.outcome.is_none()) {
            poll_confirm(publish, &waker, &mut returned);
        }
        let decided: Vec<Outstanding> = outstanding.extract_if(.., |p| p.outcome.is_some()).collect();
        let mut matched = Vec::new();
        for publish in decided {
            let was_returned = returned.iter().position(|r| *r == publish.identity);
            if let Some(at) = was_returned {
                matched.push(at);
            }
            let Outstanding { identity, outcome, decided, .. } = publish;
            let verdict = match outcome.expect("only completed confirms are decided") {
                Err(error) => Err(PublishError::Channel(error)),
                Ok(Confirmation::Nack(_)) => Err(PublishError::Refused {
                    exchange: identity.exchange,
                    routing_key: identity.routing_key,
                }),
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
        if outstanding.is_empty() && !returned.is_empty() {
            // Cannot happen by the rule above; if a broker ever broke it, the unmatched
            // returns must not fail a later publish that happens to look the same.
            tracing::warn!(count = returned.len(), "returned messages matched no publish in flight");
            returned.clear();
        }
    }
}

/// Polls one confirm; on completion keeps its outcome and the return it carries (which may
/// belong to another publish). Reports whether it completed.
fn poll_confirm(publish: &mut Outstanding, waker: &Waker, returned: &mut Vec<Identity>) -> bool {
    let mut context = Context::from_waker(waker);
    let Poll::Ready(outcome) = Pin::new(&mut publish.confirm).poll(&mut context) else {
        return false;
    };
    if let Ok(Confirmation::Ack(Some(message)) | Confirmation::Nack(Some(message))) = &outcome {
        returned.push(Identity::of_return(message));
    }
    publish.outcome = Some(outcome);
    true
}
