//! The state the gateway core keeps, behind one interface: sessions, agent profiles, the
//! compile.lock and the processed-message ledger. [`MemoryStore`] is the in-process
//! implementation (tests, single runs); the durable one lives in `crate::store`.

use crate::silp::Frontend;
use std::collections::HashMap;
use std::sync::Mutex;

/// Milliseconds since the Unix epoch.
pub type Millis = u64;

/// One conversation's session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionRecord {
    /// The 2-character SILP session id.
    pub id: String,
    /// The NLIP conversation token it belongs to.
    pub token: String,
    /// Turns seen so far.
    pub turns: u64,
    /// Heartbeat N in force for this session.
    pub heartbeat: u32,
    pub last_activity: Millis,
    /// The context was reset after the last turn; the next message carries a renewal notice.
    pub renewal_due: bool,
    /// Expired sessions stay as tombstones (answering `session_expired`) until swept.
    pub expired: bool,
}

/// Where an agent's accepted frontends came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProfileSource {
    Config,
    Ping,
}

/// The frontends an agent accepts, most preferred first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentProfile {
    pub frontends: Vec<Frontend>,
    pub source: ProfileSource,
    pub updated: Millis,
}

/// The result of a compile through the compile.lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frozen {
    /// The text to send: the frozen one.
    pub output: String,
    /// This compile froze the entry.
    pub first: bool,
    /// The compile produced different text than the frozen one.
    pub drift: bool,
}

/// Where an inbound message stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LedgerState {
    /// Handled, state changed, publishes not yet all confirmed.
    Pending,
    /// Every publish confirmed; a redelivery must not publish again.
    Published,
}

/// A store failure. Transient unless the store says its data is damaged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    #[error("store unavailable: {0}")]
    Unavailable(String),
    #[error("store data is damaged: {0}")]
    Corrupt(String),
}

/// The storage interface of the gateway core.
pub trait Store: Send + Sync {
    fn session_by_token(&self, token: &str) -> Result<Option<SessionRecord>, StoreError>;
    /// Ids held by live sessions and tombstones.
    fn session_ids_in_use(&self) -> Result<Vec<String>, StoreError>;
    fn put_session(&self, record: &SessionRecord) -> Result<(), StoreError>;

    fn profile(&self, agent: &str) -> Result<Option<AgentProfile>, StoreError>;
    fn put_profile(&self, agent: &str, profile: &AgentProfile) -> Result<(), StoreError>;

    /// Freezes `output` for `(ir_hash, frontend)` unless an entry exists, and returns the
    /// frozen entry.
    fn freeze(
        &self,
        ir_hash: &str,
        frontend: Frontend,
        output: &str,
        now: Millis,
    ) -> Result<Frozen, StoreError>;

    fn ledger(&self, message_id: &str) -> Result<Option<LedgerState>, StoreError>;
    fn set_ledger(&self, message_id: &str, state: LedgerState, now: Millis) -> Result<(), StoreError>;
}

/// All state in memory, behind one mutex.
#[derive(Debug, Default)]
pub struct MemoryStore {
    inner: Mutex<Memory>,
}

#[derive(Debug, Default)]
struct Memory {
    sessions: HashMap<String, SessionRecord>,
    profiles: HashMap<String, AgentProfile>,
    /// compile.lock: per frontend, IR hash -> frozen text.
    lock: HashMap<Frontend, HashMap<String, String>>,
    ledger: HashMap<String, LedgerState>,
}

impl MemoryStore {
    pub fn new() -> Self {
        Self::default()
    }

    fn with<T>(&self, f: impl FnOnce(&mut Memory) -> T) -> Result<T, StoreError> {
        let mut guard = self.inner.lock().map_err(|_| StoreError::Corrupt("a writer panicked".into()))?;
        Ok(f(&mut guard))
    }

    /// Number of compile.lock entries.
    pub fn lock_len(&self) -> usize {
        self.with(|m| m.lock.values().map(HashMap::len).sum()).unwrap_or_default()
    }
}

impl Store for MemoryStore {
    fn session_by_token(&self, token: &str) -> Result<Option<SessionRecord>, StoreError> {
        self.with(|m| m.sessions.get(token).cloned())
    }

    fn session_ids_in_use(&self) -> Result<Vec<String>, StoreError> {
        self.with(|m| m.sessions.values().map(|s| s.id.clone()).collect())
    }

    fn put_session(&self, record: &SessionRecord) -> Result<(), StoreError> {
        self.with(|m| match m.sessions.get_mut(&record.token) {
            Some(stored) => stored.clone_from(record),
            None => {
                m.sessions.insert(record.token.clone(), record.clone());
            }
        })
    }

    fn profile(&self, agent: &str) -> Result<Option<AgentProfile>, StoreError> {
        self.with(|m| m.profiles.get(agent).cloned())
    }

    fn put_profile(&self, agent: &str, profile: &AgentProfile) -> Result<(), StoreError> {
        self.with(|m| {
            m.profiles.insert(agent.to_owned(), profile.clone());
        })
    }

    fn freeze(
        &self,
        ir_hash: &str,
        frontend: Frontend,
        output: &str,
        _now: Millis,
    ) -> Result<Frozen, StoreError> {
        self.with(|m| {
            let entries = m.lock.entry(frontend).or_default();
            match entries.get(ir_hash) {
                Some(frozen) => Frozen { output: frozen.clone(), first: false, drift: frozen != output },
                None => {
                    entries.insert(ir_hash.to_owned(), output.to_owned());
                    Frozen { output: output.to_owned(), first: true, drift: false }
                }
            }
        })
    }

    fn ledger(&self, message_id: &str) -> Result<Option<LedgerState>, StoreError> {
        self.with(|m| m.ledger.get(message_id).copied())
    }

    fn set_ledger(&self, message_id: &str, state: LedgerState, _now: Millis) -> Result<(), StoreError> {
        self.with(|m| {
            m.ledger.insert(message_id.to_owned(), state);
        })
    }
}
