//! The cluster's compile.lock: one stream whose order is the chain's order. Instances propose
//! new entries to it (before acknowledging the message that froze them); every instance
//! follows it into its own sled chain, where the first proposal of an (IR hash, frontend)
//! becomes the record and later ones are dropped. Same stream, same order, same rule: every
//! instance's `silpgate lock export` is the same chain.
//!
//! The same stream carries the agent profiles learnt from `//ping` (a [`ProfileShare`] per
//! profile learnt): cluster-wide state that belongs to no partition, followed by the same
//! reader into the same store, so that one applied offset covers both. Each replaces what an
//! instance held for its agent: the last profile learnt anywhere is the one every instance
//! holds.

use super::{Cluster, ClusterError, changelog};
use crate::store::replica::{LockProposal, ProfileShare};
use futures_util::StreamExt;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicQosOptions};
use lapin::types::FieldTable;
use serde::{Deserialize, Serialize};
use tracing::warn;

/// Entries the broker sends ahead to the follower.
const PREFETCH: u16 = 500;
/// Acknowledge (grant credit) every this many entries.
const ACK_EVERY: u64 = 100;

/// One entry of the lock stream. A proposal is written bare (as every earlier version wrote
/// it); a profile under the key `profile`, which no proposal has.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub(crate) enum Entry {
    Profile { profile: ProfileShare },
    Proposal(LockProposal),
}

pub(crate) fn encode(proposal: &LockProposal) -> Vec<u8> {
    serde_json::to_vec(proposal).expect("lock proposals serialise")
}

pub(crate) fn encode_profile(share: &ProfileShare) -> Vec<u8> {
    serde_json::to_vec(&Entry::Profile { profile: share.clone() }).expect("profiles serialise")
}

/// Follows the lock stream from the entry after the last one applied, for as long as the
/// connection lives.
///
/// # Errors
/// Always, when it ends: the broker went away or the store failed.
pub(crate) async fn follow(channel: lapin::Channel, cluster: &Cluster) -> Result<(), ClusterError> {
    let stream = cluster.config.lock_stream.as_str();
    channel.basic_qos(PREFETCH, BasicQosOptions { global: false }).await?;
    let start = changelog::offset_argument(cluster.store.lock_offset()?);
    let mut arguments = FieldTable::default();
    arguments.insert("x-stream-offset".into(), start);
    let tag = format!("silpgate-lock-{}", cluster.instance);
    let mut consumer = channel
        .basic_consume(stream.into(), tag.as_str().into(), BasicConsumeOptions::default(), arguments)
        .await?;
    let mut read = 0u64;
    while let Some(delivery) = consumer.next().await {
        let delivery = delivery?;
        read += 1;
        let offset = changelog::stream_offset(&delivery).ok_or_else(|| {
            ClusterError::Stream(format!("{stream} delivered an entry without x-stream-offset"))
        })?;
        let entry = serde_json::from_slice::<Entry>(&delivery.data);
        match entry {
            // A lock entry freezes texts and sets profiles: only silpgate's own broker user
            // may append one.
            _ if !cluster.is_own(&delivery.properties) => {
                warn!(stream, offset, user_id = ?delivery.properties.user_id(), "A lock stream entry not from silpgate's broker user; skipped.");
            }
            Ok(Entry::Profile { profile }) => {
                cluster.store.follow_profile(offset, &profile)?;
            }
            Ok(Entry::Proposal(proposal)) => {
                let grew = cluster.store.follow_lock(offset, &proposal)?;
                if grew {
                    crate::metrics::get().lock_records.inc();
                }
                if proposal.by == cluster.instance {
                    cluster.followed_own();
                }
            }
            Err(e) => warn!(stream, offset, error = %e, "Not a lock stream entry; skipped."),
        }
        if read.is_multiple_of(ACK_EVERY) {
            delivery.acker.ack(BasicAckOptions { multiple: true }).await?;
        }
    }
    Err(ClusterError::Stream(format!("the broker ended the lock stream consumer on {stream}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway::store::{AgentProfile, ProfileSource};
    use crate::silp::Frontend;

    #[test]
    fn proposals_read_as_before_and_profiles_read_as_profiles() {
        let proposal = LockProposal {
            ir_hash: "sha256:00".into(),
            frontend: "code".into(),
            output: "cancel(x)".into(),
            at: 1,
            by: "a".into(),
            principal: None,
        };
        let read = serde_json::from_slice::<Entry>(&encode(&proposal)).unwrap();
        assert_eq!(read, Entry::Proposal(proposal));
        let profile = AgentProfile {
            frontends: vec![Frontend::Code],
            source: ProfileSource::Ping,
            updated: 2,
            tokenizer: None,
        };
        let share = ProfileShare { agent: "planner".into(), profile, by: "b".into() };
        let read = serde_json::from_slice::<Entry>(&encode_profile(&share)).unwrap();
        assert_eq!(read, Entry::Profile { profile: share });
    }
}
