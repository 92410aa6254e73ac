//! Which partitions this instance consumes, and handing partitions on as the members change.
//! Each partition queue this instance consumes is consumed on a channel of its own.
//!
//! The members ([`super::membership`]) rank the instances for every partition
//! ([`super::rendezvous`]): this instance consumes the partitions it ranks first for (their
//! owner) and those it ranks within the next `standby` for, where it waits as a
//! single-active consumer to take over at once if the owner dies. When the members change
//! ([`Ownership::reconcile`]) it subscribes to partitions new to its share, closes the channels
//! of the waiting consumers of those it no longer ranks for ([`let_go`]), and hands on the
//! partitions it serves but no longer ranks first for, once the new owner waits on them:
//!
//! 1. quiesce: hold the partition's new deliveries until the broker has nothing more on its
//!    way (the prefetch window is full of deliveries held or in the workers' hands, or nothing
//!    came for [`QUIET`]): a message the broker is sending at the moment of the cancel would go
//!    back to the queue behind newer ones the next owner already has. Deliveries in the
//!    workers' hands need not be settled first: they stay this instance's after the cancel;
//!    waiting for them here, unbounded, held the hand-over for as long as a slow agent took;
//! 2. append `Releasing` to the changelog and cancel the consumer: the broker makes the next
//!    waiting consumer active, which replays and waits for step 4;
//! 3. handle what was held (it stays this instance's after the cancel) and anything that
//!    arrived before the cancel went through, and let the workers settle what they have;
//! 4. once all is settled, append `Released`, and subscribe again at the back of the line if
//!    the partition is still in this instance's share (as a standby), else close its channel.
//!
//! The new owner gets only messages after the ones handled here, and starts on them once it
//! has read everything this instance appended: order and state both hold. It waits for
//! `Released` only so long (the hand-over wait) before it serves anyway, taking this instance
//! for dead; so steps 3 and 4 must be over within half of that ([`Cluster::finish_limit`]). A
//! hand-over that is not (its messages refused by the broker, say) lets go of the whole
//! connection: the broker takes back every message still held here, which then reach the
//! next owner as the rest of the previous owner's, and nothing is acknowledged here after the
//! next owner has started on state that lacks it. (What quiescing
//! cannot rule out: a message published within milliseconds of the cancel to a partition that
//! had been idle for [`QUIET`].)

use super::changelog::{self, Entry, Marker};
use super::handover::{Parked, STRAY_GRACE};
use super::membership::Members;
use super::rendezvous;
use super::{Cluster, ClusterError};
use crate::broker::publish::Publisher;
use crate::gateway::session::Partition;
use futures_util::StreamExt;
use futures_util::stream::{BoxStream, SelectAll};
use lapin::message::Delivery;
use lapin::options::{BasicCancelOptions, BasicConsumeOptions, BasicQosOptions};
use lapin::types::FieldTable;
use lapin::{Channel, Connection};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use tracing::{info, warn};

/// One consumer's deliveries, tagged with its queue; `None` once the consumer has ended.
pub(crate) type Tagged = (Arc<str>, Option<lapin::Result<Delivery>>);

/// Every consumer of a connection, merged.
pub(crate) type Deliveries = SelectAll<BoxStream<'static, Tagged>>;

/// Deliveries a partition's consumer may hold unacknowledged. RabbitMQ returns a departed
/// consumer's messages in delivery order; small windows keep what goes back small. At most 32:
/// a put-back `nack` with `multiple` keeps its order only up to that ([`super::handover`]).
const PARTITION_PREFETCH: u16 = 32;
/// No delivery for this long while quiescing: the broker has nothing on its way here. A
/// delivery takes a millisecond or two from the queue to this instance; what the broker may
/// still have on its way at the cancel goes back to the queue within [`STRAY_GRACE`], which
/// both sides of the hand-over allow for. Longer is no safer and stalls the hand-over: under
/// steady traffic at tens of messages a second, a partition with a few conversations never
/// went quiet for 300 ms, and each hand-over waited seconds for a full window instead.
pub(crate) const QUIET: std::time::Duration = std::time::Duration::from_millis(50);
/// How often a hand-over that waits for its messages in flight says so: a message retried
/// for long (a broker that refuses its publishes) holds the partition's hand-over with it.
const WAITING_SAID_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// Subscribes to `queue` on `channel`; the stream ends with one `None`.
///
/// # Errors
/// The broker refused the subscription.
pub(crate) async fn subscribe(
    channel: &Channel,
    queue: &str,
    tag: &str,
) -> lapin::Result<BoxStream<'static, Tagged>> {
    let consumer = channel
        .basic_consume(queue.into(), tag.into(), BasicConsumeOptions::default(), FieldTable::default())
        .await?;
    let name: Arc<str> = queue.into();
    let end = name.clone();
    Ok(consumer
        .map(move |d| (name.clone(), Some(d)))
        .chain(futures_util::stream::once(async move { (end, None) }))
        .boxed())
}

/// Where a hand-over to another instance stands.
enum Step {
    /// Holding new deliveries until the broker has nothing more on its way.
    Quiescing,
    /// Cancelled; waiting for the consumer's end, after which the held deliveries go out.
    Cancelled,
    /// Handling the rest; `Released` once it is all settled.
    Finishing,
}

struct Release {
    step: Step,
    marker: Marker,
    held: Vec<Parked>,
    last_arrival: tokio::time::Instant,
    /// When the cancel went through: `Released` waits until what the broker still had on its
    /// way here has gone back to the queue ([`STRAY_GRACE`]).
    cancelled_at: tokio::time::Instant,
    /// When the cancel was sent: from then on the next owner may be serving, and the rest
    /// must be finished within [`Cluster::finish_limit`].
    cancel_sent: Option<tokio::time::Instant>,
    /// When the hand-over last said it was still waiting for its messages in flight.
    waiting_said: tokio::time::Instant,
}

impl Release {
    fn new(cluster: &Cluster) -> Release {
        Release {
            step: Step::Quiescing,
            marker: cluster.marker(),
            held: Vec::new(),
            last_arrival: tokio::time::Instant::now(),
            cancelled_at: tokio::time::Instant::now(),
            cancel_sent: None,
            waiting_said: tokio::time::Instant::now(),
        }
    }
}

/// The partition consumers of one connection.
pub(crate) struct Ownership {
    /// The partitions consumed here (owned, being taken over or handed on, or waiting), each
    /// on its channel.
    channels: BTreeMap<u16, Channel>,
    releases: BTreeMap<u16, Release>,
    /// Waiting consumers cancelled because the partition left this instance's share: their
    /// end is expected.
    dropped: BTreeSet<u16>,
    /// The partitions of this instance's share, as of the last reconcile.
    share: BTreeSet<u16>,
    /// The members the share was computed for, and each partition's owner and standbys among
    /// them: computed again only when the members change.
    ranked_for: Vec<String>,
    leaders: Vec<Vec<String>>,
    prefetch: u16,
}

impl Ownership {
    /// Consumes no partition yet: [`Ownership::reconcile`] subscribes to this instance's share
    /// once it knows the members.
    pub(crate) fn new(prefetch: u16) -> Ownership {
        Ownership {
            channels: BTreeMap::new(),
            releases: BTreeMap::new(),
            dropped: BTreeSet::new(),
            share: BTreeSet::new(),
            ranked_for: Vec::new(),
            leaders: Vec::new(),
            prefetch: prefetch.clamp(1, PARTITION_PREFETCH),
        }
    }

    /// The partitions consumed here, each on a channel of its own.
    pub(crate) fn subscribed(&self) -> Vec<u16> {
        self.channels.keys().copied().collect()
    }

    /// Whether `partition` is consumed here.
    pub(crate) fn consumes(&self, partition: Partition) -> bool {
        self.channels.contains_key(&partition.index)
    }

    /// Brings what this instance consumes in line with the `live` members' ranking: subscribes
    /// to partitions new to its share, lets go of the waiting consumers of partitions no longer
    /// in it (not those in `taking_over`: they are handed on once served), and starts handing
    /// on the partitions it serves but another member now ranks first for, once that member
    /// waits on them ([`Members::ready_for`]) and the broker still has its presence. Returns
    /// the presences found gone: a member that crashed still ranks first until its heartbeats
    /// expire, and the partitions this instance took over from it are not handed back.
    ///
    /// # Errors
    /// The broker refused a channel, a subscription or a cancel.
    pub(crate) async fn reconcile(
        &mut self,
        (connection, publisher): (&Connection, &Publisher),
        cluster: &Cluster,
        live: &[String],
        members: &Members,
        taking_over: &BTreeSet<u16>,
        deliveries: &mut Deliveries,
    ) -> lapin::Result<Vec<String>> {
        let mut present: BTreeMap<&str, bool> = BTreeMap::new();
        if self.ranked_for != live {
            let count = 1 + usize::from(cluster.config.standby);
            self.leaders = (0..cluster.config.partitions)
                .map(|index| rendezvous::leaders(index, live, count).into_iter().map(str::to_owned).collect())
                .collect();
            self.share = (0..cluster.config.partitions)
                .filter(|&index| self.leaders[usize::from(index)].contains(&cluster.instance))
                .collect();
            live.clone_into(&mut self.ranked_for);
        }
        for index in 0..cluster.config.partitions {
            let leaders = &self.leaders[usize::from(index)];
            let in_share = self.share.contains(&index);
            let partition = cluster.partition(index);
            if cluster.owns(partition) {
                let owner = leaders.first().map(String::as_str);
                // This instance may still wait on it too, whatever its rank: it is the one
                // handing it on.
                let mut allowed: Vec<&str> = leaders.iter().map(String::as_str).collect();
                allowed.push(&cluster.instance);
                let hand_on = owner.is_some_and(|owner| {
                    owner != cluster.instance && members.ready_for(index, owner, &allowed)
                });
                if hand_on && !self.releases.contains_key(&index) {
                    let owner = owner.unwrap_or_default();
                    if let Some(presence) = members.presence_of(owner) {
                        let here = match present.get(presence) {
                            Some(&here) => here,
                            None => {
                                let here = !cluster.is_gone(publisher, presence).await;
                                present.insert(presence, here);
                                here
                            }
                        };
                        if !here {
                            continue;
                        }
                    }
                    info!(instance = %cluster.instance, partition = index, owner, "Handing a partition on to its owner.");
                    self.releases.insert(index, Release::new(cluster));
                }
            } else if in_share && !self.channels.contains_key(&index) {
                let channel = connection.create_channel().await?;
                channel.basic_qos(self.prefetch, BasicQosOptions { global: false }).await?;
                let queue = cluster.config.partition_queue(index);
                deliveries.push(subscribe(&channel, &queue, &tag(cluster, index)).await?);
                self.channels.insert(index, channel);
            } else if !in_share
                && self.channels.contains_key(&index)
                && !self.releases.contains_key(&index)
                && !taking_over.contains(&index)
            {
                self.drop_partition(index).await?;
            }
        }
        Ok(present.into_iter().filter(|&(_, here)| !here).map(|(presence, _)| presence.to_owned()).collect())
    }

    /// Stops waiting on a partition: whatever the broker gave it in the meantime (it may just
    /// have turned active) goes back to the queue, unacknowledged, ahead of anything newer
    /// (see [`let_go`]).
    async fn drop_partition(&mut self, index: u16) -> lapin::Result<()> {
        let Some(channel) = self.channels.remove(&index) else { return Ok(()) };
        self.dropped.insert(index);
        let_go(&channel).await
    }

    /// Holds a delivery of a partition that is quiescing before its hand-over; gives it back
    /// otherwise.
    pub(crate) fn hold(&mut self, partition: Partition, parked: Parked) -> Option<Parked> {
        match self.releases.get_mut(&partition.index) {
            Some(release) if matches!(release.step, Step::Quiescing | Step::Cancelled) => {
                tracing::debug!(partition = partition.index, message_id = ?parked.envelope.message_id, "Held for the partition's hand-over.");
                release.held.push(parked);
                release.last_arrival = tokio::time::Instant::now();
                None
            }
            _ => Some(parked),
        }
    }

    /// Whether a consumer that ended is a partition this instance is handing on or dropped.
    pub(crate) fn expected_end(&mut self, cluster: &Cluster, queue: &str) -> bool {
        let Some(partition) = cluster.partition_of(queue) else { return false };
        if self.dropped.remove(&partition.index) {
            return true;
        }
        match self.releases.get_mut(&partition.index) {
            Some(release) if matches!(release.step, Step::Cancelled) => {
                release.step = Step::Finishing;
                release.cancelled_at = tokio::time::Instant::now();
                true
            }
            _ => false,
        }
    }

    /// Whether partitions are being handed on.
    pub(crate) fn releasing(&self) -> bool {
        !self.releases.is_empty()
    }

    /// The partitions being handed on.
    pub(crate) fn handing_on(&self) -> Vec<u16> {
        self.releases.keys().copied().collect()
    }

    /// Starts handing on every partition this instance serves: the instance is leaving. (Its
    /// waiting consumers stay until the connection closes: one that turns active meanwhile is
    /// taken over and handed on like the others, which cancelling it could not promise.)
    pub(crate) fn release_all(&mut self, cluster: &Cluster) {
        for partition in cluster.owned() {
            self.releases.entry(partition.index).or_insert_with(|| Release::new(cluster));
        }
    }

    /// Moves every hand-over on as far as it can go; a partition handed on is consumed again,
    /// at the back of the line, when `resubscribe` and it is still in this instance's share,
    /// else its channel is closed. Returns held deliveries that are now to be handled here.
    ///
    /// # Errors
    /// The broker failed.
    pub(crate) async fn advance(
        &mut self,
        cluster: &Cluster,
        publisher: &Publisher,
        deliveries: &mut Deliveries,
        resubscribe: bool,
    ) -> Result<Vec<(Partition, Vec<Parked>)>, ClusterError> {
        let mut ready = Vec::new();
        let mut released = Vec::new();
        for (&index, release) in &mut self.releases {
            let partition = cluster.partition(index);
            let in_flight = cluster.in_flight(partition);
            let settled = in_flight == 0;
            if !settled && release.waiting_said.elapsed() >= WAITING_SAID_EVERY {
                release.waiting_said = tokio::time::Instant::now();
                let step = match release.step {
                    Step::Quiescing => "quiescing",
                    Step::Cancelled => "cancelled",
                    Step::Finishing => "finishing",
                };
                warn!(instance = %cluster.instance, partition = index, step, in_flight, held = release.held.len(), "A hand-over waits for messages in flight.");
            }
            let limit = cluster.finish_limit();
            if release.cancel_sent.is_some_and(|sent| sent.elapsed() >= limit) {
                warn!(instance = %cluster.instance, partition = index, in_flight, "A hand-over did not finish in time; letting go of the connection.");
                return Err(ClusterError::HandOverOverdue { partition: index, limit });
            }
            match release.step {
                // Nothing more can be on its way once the window is full of what is held or
                // still in the workers' hands; what is in their hands stays this instance's
                // after the cancel, and `Released` waits for it.
                Step::Quiescing
                    if release.held.len() + in_flight >= usize::from(self.prefetch)
                        || release.last_arrival.elapsed() >= QUIET =>
                {
                    let entry = Entry::Releasing(release.marker.clone());
                    changelog::append(publisher, cluster.changelog(partition), &entry).await?;
                    // Taken before the cancel: the broker may act on it before it answers.
                    let sent = tokio::time::Instant::now();
                    self.channels[&index]
                        .basic_cancel(tag(cluster, index).as_str().into(), BasicCancelOptions::default())
                        .await?;
                    release.step = Step::Cancelled;
                    release.cancel_sent = Some(sent);
                    info!(instance = %cluster.instance, partition = index, "Stopped consuming a partition handed on; finishing what it holds.");
                }
                Step::Finishing if !release.held.is_empty() => {
                    ready.push((partition, std::mem::take(&mut release.held)));
                }
                Step::Finishing if settled && release.cancelled_at.elapsed() >= STRAY_GRACE => {
                    // The last marks go before `Released`: the next owner reads them first.
                    let mut entries: Vec<_> = cluster.marks_entry(partition).into_iter().collect();
                    let done = Entry::Released(release.marker.clone());
                    entries.push(changelog::publication(cluster.changelog(partition), &done));
                    publisher.publish_all(entries).await?;
                    cluster.release(partition);
                    released.push(index);
                }
                _ => {}
            }
        }
        for index in released {
            self.releases.remove(&index);
            if !resubscribe {
                // Leaving: the channel goes with the connection.
                continue;
            }
            if self.share.contains(&index) {
                let queue = cluster.config.partition_queue(index);
                deliveries.push(subscribe(&self.channels[&index], &queue, &tag(cluster, index)).await?);
            } else if let Some(channel) = self.channels.remove(&index) {
                channel.close(200, "handed on".into()).await?;
            }
        }
        Ok(ready)
    }
}

/// Leaves a single-active-consumer quorum queue without handling what this consumer may hold:
/// closes its channel, and does not cancel first.
///
/// The two are not the same to a quorum queue (RabbitMQ 3.10, `rabbit_fifo`). A cancelled
/// consumer keeps the messages it was sent, unacknowledged, while the queue makes the next
/// consumer active at once and sends it newer ones; the held messages return only when the
/// channel closes, behind those. A consumer that goes down with its channel gives back
/// everything it held in the same step that makes the next one active, so the next one gets
/// them first, in order.
pub async fn let_go(channel: &Channel) -> lapin::Result<()> {
    channel.close(200, "not in this instance's share".into()).await
}

fn tag(cluster: &Cluster, index: u16) -> String {
    format!("silpgate-{}-{}", cluster.instance, cluster.config.partition_queue(index))
}
