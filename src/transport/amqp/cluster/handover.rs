//! Putting a partition's messages back in order when this instance takes it over.
//!
//! RabbitMQ makes the next consumer active as soon as the previous one cancels or its channel
//! closes, and only afterwards returns what that consumer still had on its way: the new owner
//! can be given newer messages before such an older one. Returned messages are delivered
//! ahead of the rest, and marked redelivered. So the new owner, once its replay is done and
//! the previous owner's messages have had [`STRAY_GRACE`] to return, puts back what it was
//! given meanwhile, and collects until all of it has come again. Then it handles the previous
//! owner's returned messages first (redelivered but not its own: older than anything it was
//! given), then its own in the order they first came (RabbitMQ may requeue them in another),
//! then anything delivered fresh meanwhile.

use super::ClusterError;
use super::connection::Parked;
use crate::transport::amqp::properties;
use lapin::options::BasicNackOptions;
use std::collections::HashMap;
use std::time::Duration;
use tokio::time::Instant;
use tracing::warn;

/// How long a previous owner's messages may take to return to the queue after it let go.
pub const STRAY_GRACE: Duration = Duration::from_millis(500);
/// How long settling waits for what it put back (one may have been dead-lettered by the
/// broker's delivery limit meanwhile) before it serves anyway.
const SETTLE_LIMIT: Duration = Duration::from_secs(30);

/// A partition being taken over by this instance.
pub enum Handover {
    /// Replaying; the deliveries wait.
    Parking(Vec<Parked>),
    /// Put back; waiting for them to come again.
    Settling(Settling),
}

/// Deliveries put back, and what has come since.
pub struct Settling {
    since: Instant,
    /// Where each put-back delivery stood, by identity (a message may come twice).
    positions: HashMap<String, Vec<usize>>,
    /// The put-back deliveries as they come again, in their original order.
    ours: Vec<Option<Parked>>,
    missing: usize,
    /// Redelivered messages that were not ours: the previous owner's, older than all of ours.
    strays: Vec<Parked>,
    /// Delivered for the first time meanwhile: newer than all of the above.
    fresh: Vec<Parked>,
}

impl Handover {
    /// Takes one delivery; returns `Some` with the deliveries to handle, in order, once the
    /// hand-over is complete.
    pub fn receive(&mut self, parked: Parked) -> Option<Vec<Parked>> {
        match self {
            Handover::Parking(held) => held.push(parked),
            Handover::Settling(settling) => settling.receive(parked),
        }
        self.settled()
    }

    /// The replay is done: puts the parked deliveries back.
    ///
    /// # Errors
    /// The channel failed.
    pub async fn requeue(&mut self) -> Result<Option<Vec<Parked>>, ClusterError> {
        let Handover::Parking(held) = self else { return Ok(None) };
        let held = std::mem::take(held);
        let mut positions: HashMap<String, Vec<usize>> = HashMap::new();
        for (position, parked) in held.iter().enumerate() {
            positions.entry(identity(parked)).or_default().push(position);
        }
        let missing = held.len();
        // One nack for them all (the partition's channel holds nothing else unacknowledged).
        if let Some(last) = held.last() {
            last.delivery.acker.nack(BasicNackOptions { multiple: true, requeue: true }).await?;
        }
        *self = Handover::Settling(Settling {
            since: Instant::now(),
            positions,
            ours: std::iter::repeat_with(|| None).take(missing).collect(),
            missing,
            strays: Vec::new(),
            fresh: Vec::new(),
        });
        Ok(self.settled())
    }

    /// `Some` with the deliveries to handle once everything put back has come again (or it has
    /// waited too long): the previous owner's first, then ours in their original order, then
    /// the fresh ones.
    pub fn settled(&mut self) -> Option<Vec<Parked>> {
        let Handover::Settling(settling) = self else { return None };
        let overdue = settling.since.elapsed() >= SETTLE_LIMIT;
        if settling.missing > 0 && !overdue {
            return None;
        }
        if overdue {
            warn!(missing = settling.missing, "Requeued deliveries did not all come back; serving anyway.");
        }
        let mut ready = std::mem::take(&mut settling.strays);
        ready.extend(settling.ours.drain(..).flatten());
        ready.append(&mut settling.fresh);
        Some(ready)
    }
}

impl Settling {
    fn receive(&mut self, parked: Parked) {
        if !parked.delivery.redelivered {
            self.fresh.push(parked);
            return;
        }
        let slot = self
            .positions
            .get(&identity(&parked))
            .and_then(|positions| positions.iter().copied().find(|&p| self.ours[p].is_none()));
        match slot {
            Some(position) => {
                self.ours[position] = Some(parked);
                self.missing -= 1;
            }
            None => self.strays.push(parked),
        }
    }
}

/// What tells a delivery from the others when it comes again: its message id, else its body.
fn identity(parked: &Parked) -> String {
    parked.envelope.message_id.clone().unwrap_or_else(|| properties::content_id(&parked.delivery.data))
}
