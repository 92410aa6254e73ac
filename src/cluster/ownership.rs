//! Which partitions this instance consumes, and handing some on so that the instances share
//! them. Each partition queue is consumed on a channel of its own.
//!
//! Single active consumer gives a partition to whichever instance subscribed first, so the
//! first instance up would keep them all. Every few seconds each instance reads how many
//! instances there are (the consumer count of the members queue, which every instance
//! consumes and nobody publishes to; a single-active-consumer queue counts only its active
//! consumer) and, if it serves more than its share (P divided by the instances, rounded up),
//! hands the surplus on:
//!
//! 1. quiesce: hold the partition's new deliveries until every one handed out is settled and
//!    the broker has nothing more on its way (the prefetch window is full of held deliveries,
//!    or nothing came for a moment): a message the broker is sending at the moment of the
//!    cancel would go back to the queue behind newer ones the next owner already has;
//! 2. append `Releasing` to the changelog and cancel the consumer: the broker makes the next
//!    waiting consumer active, which replays and waits for step 4;
//! 3. handle what was held (it stays this instance's after the cancel) and anything that
//!    arrived before the cancel went through;
//! 4. once all is settled, append `Released`, and subscribe again, at the back of the line.
//!
//! The new owner gets only messages after the ones handled here, and starts on them once it
//! has read everything this instance appended: order and state both hold. (What quiescing
//! cannot rule out: a message published within milliseconds of the cancel to a partition that
//! had been idle for [`QUIET`].)

use super::changelog::{self, Entry, Marker};
use super::connection::Parked;
use super::handover::STRAY_GRACE;
use super::{Cluster, ClusterError};
use crate::broker::publish::Publisher;
use crate::gateway::session::Partition;
use futures_util::StreamExt;
use futures_util::stream::{BoxStream, SelectAll};
use lapin::message::Delivery;
use lapin::options::{BasicCancelOptions, BasicConsumeOptions, BasicQosOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use lapin::{Channel, Connection};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use tracing::info;

/// One consumer's deliveries, tagged with its queue; `None` once the consumer has ended.
pub type Tagged = (Arc<str>, Option<lapin::Result<Delivery>>);

/// Every consumer of a connection, merged.
pub type Deliveries = SelectAll<BoxStream<'static, Tagged>>;

/// Deliveries a partition's consumer may hold unacknowledged. RabbitMQ returns a departed
/// consumer's messages in delivery order; small windows keep what goes back small.
const PARTITION_PREFETCH: u16 = 32;
/// No delivery for this long while quiescing: the broker has nothing on its way here.
pub const QUIET: std::time::Duration = std::time::Duration::from_millis(300);

/// Subscribes to `queue` on `channel`; the stream ends with one `None`.
///
/// # Errors
/// The broker refused the subscription.
pub async fn subscribe(
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
    /// Holding new deliveries until those handed out are settled.
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
}

impl Release {
    fn new(cluster: &Cluster) -> Release {
        Release {
            step: Step::Quiescing,
            marker: Marker::new(&cluster.instance),
            held: Vec::new(),
            last_arrival: tokio::time::Instant::now(),
            cancelled_at: tokio::time::Instant::now(),
        }
    }
}

/// The partition consumers of one connection.
pub struct Ownership {
    channels: HashMap<u16, Channel>,
    releases: BTreeMap<u16, Release>,
    prefetch: u16,
    /// This instance's consumer on the members queue: it only has to exist.
    _member: lapin::Consumer,
}

impl Ownership {
    /// Joins the members and subscribes to every partition queue, each on its own channel.
    ///
    /// # Errors
    /// The broker refused a channel or a subscription.
    pub async fn subscribe_all(
        connection: &Connection,
        cluster: &Cluster,
        prefetch: u16,
        deliveries: &mut Deliveries,
    ) -> lapin::Result<Ownership> {
        let members = connection.create_channel().await?;
        let member = members
            .basic_consume(
                cluster.config.members_queue().as_str().into(),
                format!("silpgate-{}-member", cluster.instance).as_str().into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await?;
        let prefetch = prefetch.clamp(1, PARTITION_PREFETCH);
        let mut ownership =
            Ownership { channels: HashMap::new(), releases: BTreeMap::new(), prefetch, _member: member };
        for index in 0..cluster.config.partitions {
            let channel = connection.create_channel().await?;
            channel.basic_qos(prefetch, BasicQosOptions { global: false }).await?;
            deliveries.push(
                subscribe(&channel, &cluster.config.partition_queue(index), &tag(cluster, index)).await?,
            );
            ownership.channels.insert(index, channel);
        }
        Ok(ownership)
    }

    /// Holds a delivery of a partition that is quiescing before its hand-over; gives it back
    /// otherwise.
    pub fn hold(&mut self, partition: Partition, parked: Parked) -> Option<Parked> {
        match self.releases.get_mut(&partition.index) {
            Some(release) if matches!(release.step, Step::Quiescing | Step::Cancelled) => {
                release.held.push(parked);
                release.last_arrival = tokio::time::Instant::now();
                None
            }
            _ => Some(parked),
        }
    }

    /// Whether a consumer that ended is a partition this instance is handing on.
    pub fn expected_end(&mut self, cluster: &Cluster, queue: &str) -> bool {
        let Some(partition) = cluster.partition_of(queue) else { return false };
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
    pub fn releasing(&self) -> bool {
        !self.releases.is_empty()
    }

    /// Starts handing on every partition this instance serves: the instance is leaving. (Its
    /// waiting consumers stay until the connection closes: one that turns active meanwhile is
    /// taken over and handed on like the others, which cancelling it could not promise.)
    pub fn release_all(&mut self, cluster: &Cluster) {
        for partition in cluster.owned() {
            self.releases.entry(partition.index).or_insert_with(|| Release::new(cluster));
        }
    }

    /// Reads how many instances there are and starts handing on this instance's surplus.
    ///
    /// # Errors
    /// The broker failed.
    pub async fn rebalance(&mut self, channel: &Channel, cluster: &Cluster) -> Result<(), ClusterError> {
        let passive = QueueDeclareOptions { passive: true, ..QueueDeclareOptions::default() };
        let members = cluster.config.members_queue();
        let instances = channel
            .queue_declare(members.as_str().into(), passive, FieldTable::default())
            .await?
            .consumer_count();
        let share = usize::from(cluster.config.partitions).div_ceil(instances.max(1) as usize);
        let owned = cluster.owned();
        // The highest partitions go first, so that the shares stay predictable.
        for partition in owned.iter().rev().take(owned.len().saturating_sub(share)) {
            info!(instance = %cluster.instance, partition = partition.index, instances, share, "Handing a partition on.");
            self.releases.insert(partition.index, Release::new(cluster));
        }
        Ok(())
    }

    /// Moves every hand-over on as far as it can go, subscribing again to the partitions
    /// handed on when `resubscribe`; returns held deliveries that are now to be handled here.
    ///
    /// # Errors
    /// The broker failed.
    pub async fn advance(
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
            let settled = cluster.in_flight(partition) == 0;
            match release.step {
                Step::Quiescing
                    if settled
                        && (release.held.len() >= usize::from(self.prefetch)
                            || release.last_arrival.elapsed() >= QUIET) =>
                {
                    let entry = Entry::Releasing(release.marker.clone());
                    changelog::append(publisher, cluster.changelog(partition), &entry).await?;
                    self.channels[&index]
                        .basic_cancel(tag(cluster, index).as_str().into(), BasicCancelOptions::default())
                        .await?;
                    release.step = Step::Cancelled;
                }
                Step::Finishing if !release.held.is_empty() => {
                    ready.push((partition, std::mem::take(&mut release.held)));
                }
                Step::Finishing if settled && release.cancelled_at.elapsed() >= STRAY_GRACE => {
                    let entry = Entry::Released(release.marker.clone());
                    changelog::append(publisher, cluster.changelog(partition), &entry).await?;
                    cluster.release(partition);
                    released.push(index);
                }
                _ => {}
            }
        }
        for index in released {
            self.releases.remove(&index);
            if resubscribe {
                let queue = cluster.config.partition_queue(index);
                deliveries.push(subscribe(&self.channels[&index], &queue, &tag(cluster, index)).await?);
            }
        }
        Ok(ready)
    }
}

fn tag(cluster: &Cluster, index: u16) -> String {
    format!("silpgate-{}-{}", cluster.instance, cluster.config.partition_queue(index))
}
