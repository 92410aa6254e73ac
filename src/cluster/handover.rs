//! Putting a partition's messages back in order when this instance takes it over.
//!
//! RabbitMQ makes the next consumer active as soon as the previous one cancels or its channel
//! closes, and only afterwards returns what that consumer still had on its way: the new owner
//! can be given newer messages before such an older one. Returned messages are delivered
//! ahead of the rest, in the order they were returned, and marked redelivered. So the new
//! owner, once its replay is done and the previous owner's messages have had [`STRAY_GRACE`]
//! to return, handles the redelivered messages it was given meanwhile at once (a message a
//! previous owner returned was taken from the queue before anything this instance was given
//! fresh, even when it came here later), puts back the fresh ones (in one step where it can,
//! see [`put_back_in_order`]), and collects until they have all come again: behind whatever
//! else of the previous owner's is still to come back.
//!
//! A message given fresh while it waits (one the broker had on its way when the put-back
//! went out) is put back too, behind them, and waited for like them. Held instead, it would
//! be handled in its turn, but the broker would know it as handed out before them: if this
//! instance died before acknowledging them all, the broker would return it to the next owner
//! ahead of older turns of its conversation (it returns a dead consumer's messages in the
//! order it last handed them out).
//!
//! Meanwhile, redelivered messages that are not its own are the previous owner's, older than
//! all it was given fresh and newer than those it was given before: they are handled at once.
//! (A previous owner, or this instance's own lost connection, can have its messages returned
//! in two parts, one before the replay ended and one after, and the later part holds newer
//! turns of the same conversations.) Holding them would be wrong as well as slow: they would
//! take up the prefetch window that its own need to come back through. Its own are handled
//! once all have come back, in the order they were put back (RabbitMQ may return them in
//! another).
//!
//! The partition is served, and can be handed on, only once this is complete
//! ([`super::Cluster::serve`]): handed on earlier, what it put back would go to the next
//! owner, behind newer messages, while deliveries held here wait for an owner that has left.

use super::ClusterError;
use crate::broker::properties::{self, Envelope};
use lapin::message::Delivery;
use lapin::options::BasicNackOptions;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use tracing::warn;

/// A delivery held back while a queue is handed over to this instance (or to another).
pub(crate) struct Parked {
    pub queue: Arc<str>,
    pub envelope: Envelope,
    pub delivery: Delivery,
    /// Set when it is handed to a worker ([`super::Cluster::dispatched`]).
    pub in_flight: Option<super::InFlight>,
}

/// How long a previous owner's messages may take to return to the queue after it let go.
pub(crate) const STRAY_GRACE: Duration = Duration::from_millis(500);
/// How long settling waits for what it put back (one may have been dead-lettered by the
/// broker's delivery limit meanwhile) before it serves anyway.
const SETTLE_LIMIT: Duration = Duration::from_secs(30);

/// A partition being taken over by this instance.
pub(crate) enum Handover {
    /// Replaying; the deliveries wait.
    Parking(Vec<Parked>),
    /// Put back; waiting for them to come again.
    Settling(Settling),
}

/// Deliveries put back, as they come again.
pub(crate) struct Settling {
    since: Instant,
    /// Where each put-back delivery stood, by identity (a message may come twice).
    positions: HashMap<String, Vec<usize>>,
    /// The put-back deliveries as they come again, in the order they were put back.
    ours: Vec<Option<Parked>>,
    missing: usize,
}

impl Handover {
    /// Takes one delivery; returns the deliveries to handle now, in order.
    ///
    /// # Errors
    /// The channel failed (putting a fresh delivery back).
    pub(crate) async fn receive(&mut self, parked: Parked) -> Result<Vec<Parked>, ClusterError> {
        match self {
            Handover::Parking(held) => {
                held.push(parked);
                Ok(Vec::new())
            }
            Handover::Settling(settling) => Ok(settling.receive(parked).await?.into_iter().collect()),
        }
    }

    /// The replay is done: puts the fresh deliveries that waited for it back; returns the
    /// redelivered ones, to handle now, in the order they came.
    ///
    /// # Errors
    /// The channel failed.
    pub(crate) async fn requeue(&mut self) -> Result<Vec<Parked>, ClusterError> {
        let Handover::Parking(held) = self else { return Ok(Vec::new()) };
        let (now, put_back): (Vec<Parked>, Vec<Parked>) =
            std::mem::take(held).into_iter().partition(|parked| parked.delivery.redelivered);
        let mut positions: HashMap<String, Vec<usize>> = HashMap::new();
        for (position, parked) in put_back.iter().enumerate() {
            positions.entry(identity(parked)).or_default().push(position);
        }
        tracing::debug!(
            now = ?now.iter().map(identity).collect::<Vec<_>>(),
            put_back = ?put_back.iter().map(identity).collect::<Vec<_>>(),
            "Handling the redelivered, putting back the rest of what came during the replay."
        );
        put_back_in_order(&now, &put_back).await?;
        let missing = put_back.len();
        *self = Handover::Settling(Settling {
            since: Instant::now(),
            positions,
            ours: std::iter::repeat_with(|| None).take(missing).collect(),
            missing,
        });
        Ok(now)
    }

    /// `Some` with the deliveries still to handle once everything put back has come again (or
    /// it has waited too long), in the order they were put back.
    pub(crate) fn settled(&mut self) -> Option<Vec<Parked>> {
        let Handover::Settling(settling) = self else { return None };
        let overdue = settling.since.elapsed() >= SETTLE_LIMIT;
        if settling.missing > 0 && !overdue {
            return None;
        }
        if overdue {
            warn!(missing = settling.missing, "Requeued deliveries did not all come back; serving anyway.");
        }
        let ready: Vec<Parked> = settling.ours.drain(..).flatten().collect();
        tracing::debug!(ready = ?ready.iter().map(identity).collect::<Vec<_>>(), "Settled.");
        Some(ready)
    }
}

impl Settling {
    /// Keeps a delivery that waits for the rest of ours, or puts a fresh one back behind them;
    /// gives back one to handle now.
    async fn receive(&mut self, parked: Parked) -> Result<Option<Parked>, ClusterError> {
        if !parked.delivery.redelivered {
            tracing::debug!(message_id = %identity(&parked), "Given fresh while settling: put back behind ours.");
            self.positions.entry(identity(&parked)).or_default().push(self.ours.len());
            self.ours.push(None);
            self.missing += 1;
            parked.delivery.acker.nack(BasicNackOptions { multiple: false, requeue: true }).await?;
            return Ok(None);
        }
        let slot = self
            .positions
            .get(&identity(&parked))
            .and_then(|positions| positions.iter().copied().find(|&p| self.ours[p].is_none()));
        let Some(position) = slot else {
            tracing::debug!(message_id = %identity(&parked), "A previous owner's message, handled at once.");
            return Ok(Some(parked));
        };
        self.ours[position] = Some(parked);
        self.missing -= 1;
        Ok(None)
    }
}

/// Gives `put_back` back to the queue, to come again in this order (the order they came in).
///
/// In one `nack` with `multiple` when that covers exactly them: the broker takes them back in
/// one step, in the order it handed them out (RabbitMQ 3.10 keeps that order for up to 32, the
/// most a partition's prefetch allows). One by one, the broker hands each out again as soon as
/// it is back, and if this instance dies between two, it returns what it had handed out in the
/// order it handed it out: those not yet put back first, then those that had come again, newer
/// turns ahead of older ones.
///
/// One `multiple` covers every unacknowledged delivery of the channel up to its tag. Tags on a
/// channel are consecutive, and a partition's channel has nothing unacknowledged from before
/// its takeover (a release waits for its in-flight deliveries; a lost connection brings new
/// channels), so it is exact when the parked deliveries' tags run without a gap and those
/// handled now all came after the put-back ones. Otherwise (a previous owner's returns came
/// between ours) they go back one by one, in order.
async fn put_back_in_order(now: &[Parked], put_back: &[Parked]) -> Result<(), ClusterError> {
    let Some(last) = put_back.last() else { return Ok(()) };
    let tags = put_back.iter().chain(now).map(|parked| parked.delivery.delivery_tag);
    if consecutive(tags) {
        last.delivery.acker.nack(BasicNackOptions { multiple: true, requeue: true }).await?;
        return Ok(());
    }
    tracing::debug!("A previous owner's returns came between ours: putting back one by one.");
    for parked in put_back {
        parked.delivery.acker.nack(BasicNackOptions { multiple: false, requeue: true }).await?;
    }
    Ok(())
}

/// Whether `tags` run up one by one, without a gap.
fn consecutive(tags: impl Iterator<Item = u64> + Clone) -> bool {
    tags.clone().zip(tags.skip(1)).all(|(tag, next)| next == tag + 1)
}

/// What tells a delivery from the others when it comes again: its message id, else its body.
fn identity(parked: &Parked) -> String {
    parked.envelope.message_id.clone().unwrap_or_else(|| properties::content_id(&parked.delivery.data))
}

#[cfg(test)]
mod tests {
    use super::consecutive;

    #[test]
    fn one_nack_covers_the_put_back_only_when_the_tags_run_without_a_gap() {
        // Put back 4..=6, then handled now 7 and 8: one `multiple` up to 6 is exact.
        assert!(consecutive([4, 5, 6, 7, 8].into_iter()));
        assert!(consecutive([9].into_iter()));
        // A redelivered 5 came between the put-back 4 and 6: a `multiple` would take it too.
        assert!(!consecutive([4, 6, 5].into_iter()));
        assert!(!consecutive([4, 5, 7].into_iter()));
    }
}
