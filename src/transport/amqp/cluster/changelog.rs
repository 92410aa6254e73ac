//! A partition's changelog: a RabbitMQ stream of JSON entries, one per session change (plus
//! periodic snapshots), written by the partition's owner before it acknowledges a message.
//!
//! Replay, when an instance takes a partition over: append a claim with a fresh nonce, then
//! read the stream from the offset the local store applied last (or from its start) up to that
//! claim. Everything the previous owner appended was confirmed before its connection went, so
//! it sits before the claim: the claim is the fence that says "the replay is complete". A gap
//! (retention cut the stream past the local offset) is bridged by the first snapshot after it.

use super::ClusterError;
use crate::gateway::session::Partition;
use crate::store::SledStore;
use crate::store::replica::PartitionChange;
use crate::transport::amqp::properties;
use crate::transport::amqp::publish::{Publication, Publisher};
use futures_util::StreamExt;
use lapin::options::{BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicQosOptions};
use lapin::types::{AMQPValue, FieldTable, LongString};
use serde::{Deserialize, Serialize};
use std::time::Duration;
use tracing::warn;

/// How long a replay may go without the next entry before it is given up (and retried).
const STALL: Duration = Duration::from_secs(30);
/// Entries the broker sends ahead during a replay.
const PREFETCH: u16 = 1000;
/// Acknowledge (grant credit) every this many entries.
const ACK_EVERY: u64 = 200;

/// One changelog entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Entry {
    Change(PartitionChange),
    /// An instance taking the partition over; the end of its replay.
    Claim { owner: String, nonce: String },
}

pub fn encode(entry: &Entry) -> Vec<u8> {
    serde_json::to_vec(entry).expect("changelog entries serialise")
}

/// Replays `stream` into `store` up to a new claim of `owner`; returns the entries applied.
///
/// # Errors
/// The broker failed, the replay stalled, or the store failed.
pub async fn replay(
    connection: &lapin::Connection,
    publisher: &Publisher,
    stream: &str,
    store: &SledStore,
    partition: Partition,
    owner: &str,
) -> Result<u64, ClusterError> {
    let nonce = format!("{owner}/{}/{:016x}", std::process::id(), crate::transport::amqp::backoff::random());
    let claim = Entry::Claim { owner: owner.to_owned(), nonce: nonce.clone() };
    publisher
        .publish_all(vec![Publication {
            exchange: "",
            routing_key: stream,
            body: encode(&claim),
            properties: properties::stream_properties(),
        }])
        .await?;

    let applied = store.partition_offset(partition.index)?;
    let first = applied.map_or(0, |o| o + 1);
    let channel = connection.create_channel().await?;
    channel.basic_qos(PREFETCH, BasicQosOptions { global: false }).await?;
    let mut arguments = FieldTable::default();
    arguments.insert("x-stream-offset".into(), offset_argument(applied));
    let tag = format!("silpgate-replay-{nonce}");
    let mut consumer = channel
        .basic_consume(stream.into(), tag.as_str().into(), BasicConsumeOptions::default(), arguments)
        .await?;

    let mut replayed = 0u64;
    let mut read = 0u64;
    // Whether entries are skipped: the stream no longer holds what follows the local offset
    // (decided at the first entry), until a snapshot restarts the state.
    let mut skipping: Option<bool> = None;
    let result = loop {
        let delivery = match tokio::time::timeout(STALL, consumer.next()).await {
            Err(_) => break Err(ClusterError::Stream(format!("replay of {stream} stalled for {STALL:?}"))),
            Ok(None) => break Err(ClusterError::Stream(format!("the broker ended the replay of {stream}"))),
            Ok(Some(delivery)) => delivery?,
        };
        read += 1;
        let offset = delivery
            .properties
            .headers()
            .as_ref()
            .and_then(|h| h.inner().get("x-stream-offset"))
            .and_then(properties::value_integer)
            .and_then(|o| u64::try_from(o).ok());
        let Some(offset) = offset else {
            break Err(ClusterError::Stream(format!("{stream} delivered an entry without x-stream-offset")));
        };
        let skip = *skipping.get_or_insert_with(|| {
            let cut = offset > first;
            if cut {
                warn!(stream, from = first, first_held = offset, "Changelog cut by retention; replaying from the next snapshot.");
            }
            cut
        });
        let done = match serde_json::from_slice::<Entry>(&delivery.data) {
            Ok(Entry::Claim { nonce: n, .. }) if n == nonce => {
                store.set_partition_offset(partition.index, offset)?;
                true
            }
            Ok(Entry::Claim { .. }) => false,
            Ok(Entry::Change(change)) => {
                let snapshot = matches!(change, PartitionChange::Snapshot { .. });
                if !skip || snapshot {
                    skipping = Some(false);
                    store.apply_change(partition, &change, Some(offset), crate::store::time::now_millis())?;
                    replayed += 1;
                }
                false
            }
            Err(e) => {
                warn!(stream, offset, error = %e, "Not a changelog entry; skipped.");
                false
            }
        };
        if done || read.is_multiple_of(ACK_EVERY) {
            delivery.acker.ack(BasicAckOptions { multiple: true }).await?;
        }
        if done {
            break Ok(replayed);
        }
    };
    let _ = channel.basic_cancel(tag.as_str().into(), BasicCancelOptions::default()).await;
    let _ = channel.close(200, "replayed".into()).await;
    result
}

/// `x-stream-offset`: just after the last applied entry, or the stream's start.
fn offset_argument(applied: Option<u64>) -> AMQPValue {
    match applied {
        Some(offset) => AMQPValue::LongLongInt(i64::try_from(offset + 1).unwrap_or(i64::MAX)),
        None => AMQPValue::LongString(LongString::from(b"first".to_vec())),
    }
}
