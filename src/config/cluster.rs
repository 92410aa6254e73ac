//! `[cluster]`: several instances sharing the work through partitions on the broker.

use super::ConfigError;
use serde::Deserialize;

/// Cluster mode: conversations are spread over `partitions` quorum queues behind a
/// consistent-hash exchange; the broker gives each partition to one live instance (single
/// active consumer); each partition's session changes go to its changelog stream, the
/// compile.lock to one lock stream. docs/cluster.md explains the design and how to size it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterConfig {
    /// Number of partitions P, 1..=1296. Every
    /// instance of a cluster must use the same P. Default 16.
    pub partitions: u16,
    /// The consistent-hash exchange in front of the partition queues; it hashes the header
    /// `nlip-conversation`. Default `silpgate.partitions`.
    pub exchange: String,
    /// Partition queues are named `<queue_prefix>.<index>` (index zero-padded to 2 digits or
    /// more). Default `silpgate.partition`.
    pub queue_prefix: String,
    /// Changelog streams are named `<changelog_prefix>.<index>`. Default `silpgate.changelog`.
    pub changelog_prefix: String,
    /// The stream the whole cluster's compile.lock is decided in. Default `silpgate.lock`.
    pub lock_stream: String,
    /// A snapshot of a partition's sessions is appended to its changelog after this many
    /// changes, so that a stream cut by retention still holds a complete state. Default 1000.
    pub snapshot_every: u64,
    /// Retention of each changelog stream in bytes (`x-max-length-bytes`); keep it above a few
    /// snapshot intervals. Default 256 MiB.
    pub changelog_max_bytes: u64,
    /// This instance's name in partition claims, heartbeats, logs and `cluster status`; it also
    /// decides which partitions the instance owns (rendezvous hashing over the members' names),
    /// so it must be unique and should stay the same across restarts. Default: the `HOSTNAME`
    /// environment variable, else `silpgate-<pid>`.
    pub instance: Option<String>,
    /// Instances waiting behind each partition's owner, ready to take it over the moment the
    /// owner dies, 0..=8; the same on every instance (an owner hands a partition on only once
    /// no member beyond the owner and its standbys waits on it). Each instance consumes about
    /// P × (1 + standby) / instances partitions. With 0, a crashed owner's partitions wait
    /// until the members miss its heartbeats (5 s). Default 1.
    pub standby: u16,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            partitions: 16,
            exchange: "silpgate.partitions".into(),
            queue_prefix: "silpgate.partition".into(),
            changelog_prefix: "silpgate.changelog".into(),
            lock_stream: "silpgate.lock".into(),
            snapshot_every: 1000,
            changelog_max_bytes: 256 * 1024 * 1024,
            instance: None,
            standby: 1,
        }
    }
}

impl ClusterConfig {
    /// Zero-padded partition index, so that queue names sort in partition order.
    fn suffix(&self, index: u16) -> String {
        let width = self.partitions.saturating_sub(1).to_string().len().max(2);
        format!("{index:0width$}")
    }

    /// The queue of partition `index`.
    pub(crate) fn partition_queue(&self, index: u16) -> String {
        format!("{}.{}", self.queue_prefix, self.suffix(index))
    }

    /// The fanout exchange the instances' heartbeats go through: `<queue_prefix>.members`.
    pub(crate) fn members_exchange(&self) -> String {
        format!("{}.members", self.queue_prefix)
    }

    /// The changelog stream of partition `index`.
    pub(crate) fn changelog_stream(&self, index: u16) -> String {
        format!("{}.{}", self.changelog_prefix, self.suffix(index))
    }

    /// This instance's name.
    pub(crate) fn instance_name(&self) -> String {
        self.instance
            .clone()
            .or_else(|| std::env::var("HOSTNAME").ok().filter(|h| !h.is_empty()))
            .unwrap_or_else(|| format!("silpgate-{}", std::process::id()))
    }
}

impl ClusterConfig {
    pub(super) fn check(&self) -> Result<(), ConfigError> {
        if !(1..=1296).contains(&self.partitions) || self.snapshot_every == 0 {
            return Err(ConfigError::Invalid(format!(
                "cluster.partitions = {} must be in 1..=1296 and cluster.snapshot_every above 0",
                self.partitions
            )));
        }
        if self.standby > 8 {
            return Err(ConfigError::Invalid(format!("cluster.standby = {} must be in 0..=8", self.standby)));
        }
        Ok(())
    }
}
