//! Front-door conversations in cluster mode: a message that belongs to a conversation and
//! arrives over HTTP, a WebSocket or another front door is served by its partition's owner,
//! exactly like the conversation's AMQP messages (docs/cluster.md, "Every door partitioned").
//!
//! The receiving instance publishes the envelope to the partition exchange, keyed by its
//! conversation token, with RabbitMQ's direct reply-to as the reply address and a fresh id as
//! the correlation; the owner takes it like any partition delivery (session turn, changelog
//! entry, lock proposals, agent deliveries, one confirm wait, ack) and publishes what the
//! sender is to hear to that address: a reply route's replies, the agent's answer, an error,
//! or, for a route that waits for no answer, the confirmation of the agent's delivery. Those
//! replies have been through the owner's core already, so here they are passed on to the
//! waiting door as they are ([`Forwards::replied`]), never through this instance's core a
//! second time.
//!
//! Direct reply-to, not the instance's durable reply queue: a reply is worth something only to
//! the door still waiting for it, so it need not be written to disk on its way back (one
//! quorum-queue commit less per turn), and one whose door is gone (this instance restarted)
//! is dropped by the broker instead of waiting in a queue for nobody. The turn itself is safe
//! before any reply leaves the owner.
//!
//! One session per conversation in one place is what this buys: turns counted once and in
//! order with the conversation's AMQP messages, surviving hand-overs and crashes like theirs.
//! It costs two more broker hops and the owner's confirm wait per front-door turn.

use crate::nlip::Message;
use std::collections::HashMap;
use std::sync::Mutex;
use tokio::sync::oneshot;

/// A forwarded message's replies, each in its place as it arrives, until every place is
/// filled (replies are taken side by side, so they may come out of order).
struct Collecting {
    replies: Vec<Option<Message>>,
    to: oneshot::Sender<Vec<Message>>,
}

/// The forwarded messages whose replies are awaited, by correlation id.
#[derive(Default)]
pub(crate) struct Forwards {
    pending: Mutex<HashMap<String, Collecting>>,
}

impl Forwards {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Collecting>> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts waiting for the replies to the message forwarded under `correlation`, before it
    /// is published (a reply may come back before the publish's confirm).
    pub(crate) fn expect(&self, correlation: &str) -> oneshot::Receiver<Vec<Message>> {
        let (to, replies) = oneshot::channel();
        self.lock().insert(correlation.to_owned(), Collecting { replies: Vec::new(), to });
        replies
    }

    /// The message was not forwarded after all.
    pub(crate) fn cancel(&self, correlation: &str) {
        self.lock().remove(correlation);
    }

    /// A reply from a partition's owner to the message forwarded under `correlation`, the
    /// `index`-th of `count`. The reply comes back when no forwarded message waits under that
    /// id (it is some agent's answer, or its asker is gone).
    pub(crate) fn replied(
        &self,
        correlation: &str,
        reply: Message,
        (index, count): (usize, usize),
    ) -> Option<Message> {
        let mut pending = self.lock();
        let Some(collecting) = pending.get_mut(correlation) else { return Some(reply) };
        if collecting.replies.len() < count {
            collecting.replies.resize_with(count, || None);
        }
        collecting.replies[index.min(count.saturating_sub(1))] = Some(reply);
        if collecting.replies.iter().all(Option::is_some) {
            let done = pending.remove(correlation).expect("present");
            // The asker may have gone meanwhile: the replies then have nobody to go to.
            let _ = done.to.send(done.replies.into_iter().flatten().collect());
        }
        None
    }

    /// Forgets the waits whose askers are gone (a timeout, a closed socket).
    pub(crate) fn prune(&self) {
        self.lock().retain(|_, collecting| !collecting.to.is_closed());
    }

    /// Forwarded messages awaiting replies now.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_are_handed_over_together_once_all_have_come() {
        let forwards = Forwards::default();
        let mut replies = forwards.expect("f-1");
        assert!(
            forwards.replied("f-2", Message::text("stranger"), (0, 1)).is_some(),
            "not a forwarded message's"
        );
        assert!(forwards.replied("f-1", Message::text("reply"), (1, 2)).is_none());
        assert!(replies.try_recv().is_err(), "one of two replies is not all");
        assert!(forwards.replied("f-1", Message::text("notice"), (0, 2)).is_none());
        let got = replies.try_recv().expect("both replies");
        assert_eq!(got, vec![Message::text("notice"), Message::text("reply")], "in their places");
        assert!(forwards.replied("f-1", Message::text("late"), (0, 2)).is_some(), "a wait ends once");
    }

    #[test]
    fn a_wait_whose_asker_is_gone_is_forgotten() {
        let forwards = Forwards::default();
        let kept = forwards.expect("kept");
        drop(forwards.expect("gone"));
        forwards.prune();
        assert_eq!(forwards.len(), 1);
        drop(kept);
        forwards.prune();
        assert_eq!(forwards.len(), 0);
    }
}
