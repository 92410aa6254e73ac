//! `[a2a]`: silpgate's own A2A door, beyond what `[http]` says of every door.

use serde::Deserialize;

/// The tasks the A2A door keeps for requests it does not answer at once.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct A2aConfig {
    /// At most this many tasks are kept; at the bound, the oldest finished task is forgotten
    /// to make room, and a request finding every kept task still working is refused. Default
    /// 10000.
    pub max_tasks: usize,
    /// A task is forgotten this long after it last changed. Default 86400 (a day).
    pub task_ttl_secs: u64,
}

impl Default for A2aConfig {
    fn default() -> Self {
        A2aConfig { max_tasks: 10_000, task_ttl_secs: 86_400 }
    }
}
