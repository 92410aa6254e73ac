//! Putting a partition's messages back in order when this instance takes it over.
//!
//! RabbitMQ makes the next consumer active as soon as the previous one cancels or its channel
//! closes, and only afterwards returns what that consumer still had on its way: the new owner
//! can be given newer messages before such an older one. Returned messages are delivered
//! ahead of the rest, and marked redelivered. So the new owner, once its replay is done and
//! the previous owner's messages have had [`STRAY_GRACE`] to return, puts back what it was
//! given meanwhile (with one nack for all, which RabbitMQ requeues in delivery order), and
//! collects until all of it has come again: the redelivered ones
//! (returned, then its own) come first, in arrival order, then anything delivered fresh.

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
const SETTLE_LIMIT: Duration = Duration::from_secs(10);

/// A partition being taken over by this instance.
pub enum Handover {
    /// Replaying; the deliveries wait.
    Parking(Vec<Parked>),
    /// Put back; waiting for them to come again.
    Settling { since: Instant, awaited: HashMap<String, usize>, returned: Vec<Parked>, fresh: Vec<Parked> },
}

impl Handover {
    /// Takes one delivery; returns `Some` with the deliveries to handle, in order, once the
    /// hand-over is complete.
    pub fn receive(&mut self, parked: Parked) -> Option<Vec<Parked>> {
        match self {
            Handover::Parking(held) => held.push(parked),
            Handover::Settling { awaited, returned, fresh, .. } => {
                if parked.delivery.redelivered {
                    let id = identity(&parked);
                    if let Some(count) = awaited.get_mut(&id) {
                        *count -= 1;
                        if *count == 0 {
                            awaited.remove(&id);
                        }
                    }
                    returned.push(parked);
                } else {
                    fresh.push(parked);
                }
            }
        }
        self.settled()
    }

    /// The replay is done: puts the parked deliveries back, in order.
    ///
    /// # Errors
    /// The channel failed.
    pub async fn requeue(&mut self) -> Result<Option<Vec<Parked>>, ClusterError> {
        let Handover::Parking(held) = self else { return Ok(None) };
        let held = std::mem::take(held);
        let mut awaited: HashMap<String, usize> = HashMap::new();
        for parked in &held {
            *awaited.entry(identity(parked)).or_default() += 1;
        }
        // One nack for them all (the partition's channel holds nothing else unacknowledged):
        // nacked one by one, RabbitMQ may requeue them in another order.
        if let Some(last) = held.last() {
            last.delivery.acker.nack(BasicNackOptions { multiple: true, requeue: true }).await?;
        }
        *self =
            Handover::Settling { since: Instant::now(), awaited, returned: Vec::new(), fresh: Vec::new() };
        Ok(self.settled())
    }

    /// `Some` with the deliveries to handle once everything put back has come again (or it has
    /// waited too long).
    pub fn settled(&mut self) -> Option<Vec<Parked>> {
        let Handover::Settling { since, awaited, returned, fresh } = self else { return None };
        let overdue = since.elapsed() >= SETTLE_LIMIT;
        if !awaited.is_empty() && !overdue {
            return None;
        }
        if overdue {
            warn!(missing = awaited.len(), "Requeued deliveries did not all come back; serving anyway.");
        }
        let mut ready = std::mem::take(returned);
        ready.append(fresh);
        Some(ready)
    }
}

/// What tells a delivery from the others when it comes again: its message id, else its body.
fn identity(parked: &Parked) -> String {
    parked.envelope.message_id.clone().unwrap_or_else(|| properties::content_id(&parked.delivery.data))
}
