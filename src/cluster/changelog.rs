//! A partition's changelog: a RabbitMQ stream of JSON entries, one per session change (plus
//! periodic snapshots), written by the partition's owner before it acknowledges a message.
//!
//! Replay, when an instance takes a partition over: append a claim with a fresh nonce, then
//! read the stream from the offset the local store applied last (or from its start) up to that
//! claim. An owner that went away (crash, shutdown) appended everything before its connection
//! closed, so it all sits before the claim: the claim is the fence that says "complete".
//!
//! An owner that hands a partition on while it keeps running (rebalancing) appends
//! `Releasing`, stops consuming, finishes the messages it holds, and appends `Released`. A
//! replay that meets `Releasing` without its `Released` before the claim reads on past the
//! claim until `Released` arrives, or the hand-over wait runs out: the old owner died, or gave
//! up and let go of its connection, which it does after half that wait (see
//! [`super::ownership`]), so that nothing of the partition is acknowledged there afterwards.
//! The wait ends sooner when the broker says the old owner's connection is gone (its presence,
//! [`super::membership::is_gone`]): the replay then appends a second claim and reads up to it,
//! for what the old owner appended before its connection ended.
//!
//! A standby does not wait for a takeover to read: it follows the changelog of each partition
//! it waits on ([`follow`]), so that the replay of a takeover reads only the last few entries,
//! however long the changelog is.
//!
//! A gap (retention cut the stream past the local offset) is bridged by the first snapshot
//! after it.

use super::ClusterError;
use crate::broker::properties;
use crate::broker::publish::{Publication, Publisher};
use crate::gateway::session::Partition;
use crate::store::SledStore;
use crate::store::replica::PartitionChange;
use futures_util::StreamExt;
use lapin::options::{BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicQosOptions};
use lapin::types::{AMQPValue, FieldTable, LongString};
use serde::{Deserialize, Serialize};
use std::time::Duration;
use tracing::{info, warn};

/// How long a replay may go without the next entry before it is given up (and retried).
const STALL: Duration = Duration::from_secs(30);
/// Entries the broker sends ahead during a replay.
const PREFETCH: u16 = 1000;
/// Acknowledge (grant credit) every this many entries.
const ACK_EVERY: u64 = 200;

/// One changelog entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Entry {
    Change(PartitionChange),
    /// An instance taking the partition over: the end of its replay.
    Claim(Marker),
    /// The owner hands the partition on: it has stopped consuming and finishes what it holds.
    Releasing(Marker),
    /// ...and has finished: everything it did is above this entry.
    Released(Marker),
}

/// Who wrote an ownership entry, with a nonce that tells this entry from every other.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Marker {
    pub owner: String,
    pub nonce: String,
    /// The writer's presence ([`super::membership`]): gone when its connection is.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub presence: String,
}

impl Marker {
    pub(crate) fn new(owner: &str, presence: String) -> Marker {
        let nonce = format!("{owner}/{}/{:016x}", std::process::id(), crate::util::backoff::random());
        Marker { owner: owner.to_owned(), nonce, presence }
    }
}

pub(crate) fn encode(entry: &Entry) -> Vec<u8> {
    serde_json::to_vec(entry).expect("changelog entries serialise")
}

/// Where a replay stands with respect to ownership.
struct Fence {
    claim: String,
    /// A hand-over in progress: `Releasing` read, its `Released` not yet.
    handing_over: Option<Marker>,
    /// This replay's claim has been read while a hand-over was in progress: wait until then.
    waiting_until: Option<tokio::time::Instant>,
    handover_wait: Duration,
}

impl Fence {
    /// Reads one ownership entry; true when the replay is complete.
    fn read(&mut self, entry: &Entry) -> bool {
        match entry {
            Entry::Claim(m) if m.nonce == self.claim => {
                if self.handing_over.is_some() {
                    self.waiting_until = Some(tokio::time::Instant::now() + self.handover_wait);
                }
                self.handing_over.is_none()
            }
            // A later claim settled (or gave up on) any hand-over before it.
            Entry::Claim(_) => {
                self.handing_over = None;
                false
            }
            Entry::Releasing(m) => {
                self.handing_over = Some(m.clone());
                false
            }
            Entry::Released(m) => {
                if self.handing_over.as_ref().is_some_and(|h| h.nonce == m.nonce) {
                    self.handing_over = None;
                }
                self.waiting_until.is_some() && self.handing_over.is_none()
            }
            Entry::Change(_) => false,
        }
    }

    /// The presence of the owner this replay waits for, while it waits past its claim.
    fn waiting_for(&self) -> Option<&str> {
        self.waiting_until?;
        self.handing_over.as_ref().map(|m| m.presence.as_str()).filter(|p| !p.is_empty())
    }

    /// The owner being waited for is gone: the replay is complete at `claim`, a claim appended
    /// after its connection ended.
    fn gave_up(&mut self, claim: &Marker) {
        self.claim.clone_from(&claim.nonce);
        self.handing_over = None;
        self.waiting_until = None;
    }
}

/// How often a replay waiting for a hand-over asks whether the owner handing over is gone.
const PROBE_EVERY: Duration = Duration::from_millis(200);

/// Replays `stream` into `store` on `channel` up to a new claim of `cluster`'s (and, while
/// the previous owner is still handing over, up to its `Released`, waiting at most
/// `handover_wait`, or until its connection is gone); returns the changes applied.
///
/// # Errors
/// The broker failed, the replay stalled, or the store failed.
pub(crate) async fn replay(
    channel: lapin::Channel,
    publisher: &Publisher,
    stream: &str,
    cluster: &super::Cluster,
    partition: Partition,
    handover_wait: Duration,
) -> Result<u64, ClusterError> {
    let store: &SledStore = &cluster.store;
    let claim = cluster.marker();
    let mut fence =
        Fence { claim: claim.nonce.clone(), handing_over: None, waiting_until: None, handover_wait };
    append(publisher, stream, &Entry::Claim(claim)).await?;

    let mut applier = Applier::new(store, partition, stream)?;
    channel.basic_qos(PREFETCH, BasicQosOptions { global: false }).await?;
    let mut arguments = FieldTable::default();
    arguments.insert("x-stream-offset".into(), offset_argument(applier.applied));
    let tag = format!("silpgate-replay-{}", fence.claim);
    let mut consumer = channel
        .basic_consume(stream.into(), tag.as_str().into(), BasicConsumeOptions::default(), arguments)
        .await?;

    let mut read = 0u64;
    let mut probe = tokio::time::interval(PROBE_EVERY);
    probe.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let result = loop {
        let deadline = fence.waiting_until.unwrap_or_else(|| tokio::time::Instant::now() + STALL);
        let next = tokio::select! {
            next = tokio::time::timeout_at(deadline, consumer.next()) => next,
            _ = probe.tick(), if fence.waiting_for().is_some() => {
                let presence = fence.waiting_for().unwrap_or_default().to_owned();
                if cluster.is_gone(publisher, &presence).await {
                    info!(stream, "The previous owner's connection is gone in the middle of its hand-over; reading on to a new claim.");
                    let claim = cluster.marker();
                    fence.gave_up(&claim);
                    append(publisher, stream, &Entry::Claim(claim)).await?;
                }
                continue;
            }
        };
        let delivery = match next {
            Err(_) if fence.waiting_until.is_some() => {
                warn!(stream, "The previous owner did not finish handing over in time; taking over.");
                break Ok(applier.changes);
            }
            Err(_) => break Err(ClusterError::Stream(format!("replay of {stream} stalled for {STALL:?}"))),
            Ok(None) => break Err(ClusterError::Stream(format!("the broker ended the replay of {stream}"))),
            Ok(Some(delivery)) => delivery?,
        };
        read += 1;
        let (offset, entry) = applier.read(&delivery)?;
        let done = match entry {
            Some(Entry::Change(change)) => {
                applier.apply(offset, &change, true)?;
                false
            }
            Some(marker) => fence.read(&marker),
            None => false,
        };
        if done || read.is_multiple_of(ACK_EVERY) {
            delivery.acker.ack(BasicAckOptions { multiple: true }).await?;
        }
        if done {
            store.set_partition_offset(partition.index, offset)?;
            break Ok(applier.changes);
        }
    };
    let _ = channel.basic_cancel(tag.as_str().into(), BasicCancelOptions::default()).await;
    let _ = channel.close(200, "replayed".into()).await;
    result
}

/// A partition's changes applied to the local store in stream order, from the entry after
/// the last one it applied: what a replay and a standby's follower share.
struct Applier<'a> {
    store: &'a SledStore,
    partition: Partition,
    stream: &'a str,
    /// The last offset recorded as applied.
    applied: Option<u64>,
    /// Whether changes are skipped: the stream no longer holds what follows the local offset
    /// (decided at the first entry), until a snapshot restarts the state.
    skipping: Option<bool>,
    /// Changes applied so far.
    changes: u64,
}

impl<'a> Applier<'a> {
    fn new(store: &'a SledStore, partition: Partition, stream: &'a str) -> Result<Applier<'a>, ClusterError> {
        let applied = store.partition_offset(partition.index)?;
        Ok(Applier { store, partition, stream, applied, skipping: None, changes: 0 })
    }

    /// A delivery's offset and entry (`None` for what is not an entry: skipped, with a warning).
    fn read(&mut self, delivery: &lapin::message::Delivery) -> Result<(u64, Option<Entry>), ClusterError> {
        let stream = self.stream;
        let Some(offset) = stream_offset(delivery) else {
            return Err(ClusterError::Stream(format!("{stream} delivered an entry without x-stream-offset")));
        };
        let applied = self.applied;
        // Decided at the first entry only: whether the stream still holds the one after the
        // last applied.
        self.skipping.get_or_insert_with(|| {
            let first = applied.map_or(0, |o| o + 1);
            let cut = offset > first;
            if cut {
                warn!(
                    stream,
                    from = first,
                    first_held = offset,
                    "Changelog cut by retention; replaying from the next snapshot."
                );
            }
            cut
        });
        match serde_json::from_slice::<Entry>(&delivery.data) {
            Ok(entry) => Ok((offset, Some(entry))),
            Err(e) => {
                warn!(stream, offset, error = %e, "Not a changelog entry; skipped.");
                Ok((offset, None))
            }
        }
    }

    /// Applies `change`, read at `offset`, and records `offset` as applied when `record`.
    fn apply(&mut self, offset: u64, change: &PartitionChange, record: bool) -> Result<(), ClusterError> {
        let snapshot = matches!(change, PartitionChange::Snapshot { .. });
        if self.skipping == Some(true) && !snapshot {
            return Ok(());
        }
        self.skipping = Some(false);
        let offset = record.then_some(offset);
        self.store.apply_change(self.partition, change, offset, crate::util::time::now_millis())?;
        if offset.is_some() {
            self.applied = offset;
        }
        self.changes += 1;
        Ok(())
    }
}

/// Keeps the local store up with `stream` while another instance serves the partition and
/// this one waits on it as a standby, so that a takeover replays only the last few entries,
/// whatever the changelog's length: a crash is taken over at once. Runs until it is aborted
/// (before a takeover starts its replay: the two never apply at once) or the stream fails.
///
/// The applied offset is recorded only where a replay's fence sees no hand-over in progress
/// (never past a `Releasing` that neither its `Released` nor a later claim has settled), so a
/// replay that starts there decides exactly as one that started earlier would. The changes in
/// between are applied all the same; a replay applies them again, in order, to the same end.
///
/// # Errors
/// The broker or the store failed.
pub(crate) async fn follow(
    channel: lapin::Channel,
    stream: &str,
    store: &SledStore,
    partition: Partition,
) -> Result<(), ClusterError> {
    let mut applier = Applier::new(store, partition, stream)?;
    channel.basic_qos(PREFETCH, BasicQosOptions { global: false }).await?;
    let mut arguments = FieldTable::default();
    arguments.insert("x-stream-offset".into(), offset_argument(applier.applied));
    let tag = format!("silpgate-follow-{:016x}", crate::util::backoff::random());
    let mut consumer = channel
        .basic_consume(stream.into(), tag.as_str().into(), BasicConsumeOptions::default(), arguments)
        .await?;
    // What a replay's fence would see at each entry (a follower has no claim of its own).
    let mut fence = Fence {
        claim: String::new(),
        handing_over: None,
        waiting_until: None,
        handover_wait: Duration::ZERO,
    };
    let mut read = 0u64;
    while let Some(delivery) = consumer.next().await {
        let delivery = delivery?;
        read += 1;
        let (offset, entry) = applier.read(&delivery)?;
        match entry {
            Some(Entry::Change(change)) => applier.apply(offset, &change, fence.handing_over.is_none())?,
            Some(marker) => {
                fence.read(&marker);
                // No hand-over open here: a replay may start after this entry.
                if fence.handing_over.is_none() {
                    store.set_partition_offset(partition.index, offset)?;
                    applier.applied = Some(offset);
                }
            }
            None => {}
        }
        if read.is_multiple_of(ACK_EVERY) {
            delivery.acker.ack(BasicAckOptions { multiple: true }).await?;
        }
    }
    Err(ClusterError::Stream(format!("the broker ended following {stream}")))
}

/// `entry` as a message for `stream`.
pub(crate) fn publication<'a>(stream: &'a str, entry: &Entry) -> Publication<'a> {
    Publication {
        exchange: "",
        routing_key: stream,
        body: encode(entry),
        properties: properties::stream_properties(),
    }
}

/// Appends one entry to `stream` and waits for the broker's confirm.
///
/// # Errors
/// Not confirmed.
pub(crate) async fn append(publisher: &Publisher, stream: &str, entry: &Entry) -> Result<(), ClusterError> {
    let publication = publication(stream, entry);
    Ok(publisher.publish_all(vec![publication]).await?)
}

/// The offset of a stream delivery.
pub(crate) fn stream_offset(delivery: &lapin::message::Delivery) -> Option<u64> {
    delivery
        .properties
        .headers()
        .as_ref()
        .and_then(|h| h.inner().get("x-stream-offset"))
        .and_then(properties::value_integer)
        .and_then(|o| u64::try_from(o).ok())
}

/// `x-stream-offset`: just after the last applied entry, or the stream's start.
pub(crate) fn offset_argument(applied: Option<u64>) -> AMQPValue {
    match applied {
        Some(offset) => AMQPValue::LongLongInt(i64::try_from(offset + 1).unwrap_or(i64::MAX)),
        None => AMQPValue::LongString(LongString::from(b"first".to_vec())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn marker(nonce: &str) -> Marker {
        Marker { owner: "x".into(), nonce: nonce.into(), presence: format!("q-{nonce}") }
    }

    fn fence(claim: &str) -> Fence {
        Fence {
            claim: claim.into(),
            handing_over: None,
            waiting_until: None,
            handover_wait: Duration::from_secs(5),
        }
    }

    #[test]
    fn a_replay_ends_at_its_own_claim_when_no_hand_over_is_in_progress() {
        let mut f = fence("mine");
        assert!(!f.read(&Entry::Claim(marker("theirs"))));
        assert!(!f.read(&Entry::Releasing(marker("r1"))));
        assert!(!f.read(&Entry::Released(marker("r1"))));
        assert!(f.read(&Entry::Claim(marker("mine"))));
    }

    #[test]
    fn a_replay_reads_past_its_claim_until_the_hand_over_in_progress_is_released() {
        let mut f = fence("mine");
        assert!(!f.read(&Entry::Releasing(marker("r1"))));
        assert!(!f.read(&Entry::Claim(marker("mine"))), "the previous owner is still finishing");
        assert!(f.waiting_until.is_some());
        assert!(!f.read(&Entry::Released(marker("other"))));
        assert!(f.read(&Entry::Released(marker("r1"))));
    }

    #[test]
    fn a_replay_whose_releasing_owner_is_gone_ends_at_a_second_claim() {
        let mut f = fence("mine");
        assert_eq!(f.waiting_for(), None);
        f.read(&Entry::Releasing(marker("r1")));
        assert_eq!(f.waiting_for(), None, "not waiting before its own claim is read");
        assert!(!f.read(&Entry::Claim(marker("mine"))));
        assert_eq!(f.waiting_for(), Some("q-r1"), "waits on the releasing owner's presence");
        f.gave_up(&marker("again"));
        assert_eq!(f.waiting_for(), None);
        assert!(!f.read(&Entry::Claim(marker("mine"))), "the first claim no longer ends it");
        assert!(f.read(&Entry::Claim(marker("again"))), "complete at the second claim");
    }

    #[test]
    fn a_later_claim_settles_an_earlier_hand_over() {
        let mut f = fence("mine");
        f.read(&Entry::Releasing(marker("r1")));
        f.read(&Entry::Claim(marker("theirs")));
        assert!(f.read(&Entry::Claim(marker("mine"))));
    }
}
