//! The state the gateway core keeps, behind one interface: sessions, agent profiles, the
//! compile.lock and the processed-message ledger.
//!
//! The core reads what it needs while it plans a message, then hands every change of that
//! message to [`Store::commit`] at once, so that a message's state step is atomic: all of it or
//! none. [`MemoryStore`] keeps state in the process (tests, single runs); the durable sled
//! store is `crate::store::SledStore`.

use crate::silp::Frontend;
use std::collections::HashMap;
use std::sync::Mutex;

/// Milliseconds since the Unix epoch.
pub type Millis = u64;

/// One conversation's session.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
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
    /// When the session began (its first turn): tells it from a later session of the same
    /// conversation, begun after this one expired (records written before it was kept: 0).
    #[serde(default)]
    pub started: Millis,
    /// The context was reset after the last turn; the next message carries a renewal notice.
    pub renewal_due: bool,
    /// Expired sessions stay as tombstones (answering `session_expired`) until swept.
    pub expired: bool,
    /// In a cluster: the partition the conversation belongs to, whose changelog carries it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<u16>,
    /// The subject of the principal that began the conversation: no other may continue it.
    /// None: begun without authentication (or before owners were kept), anyone's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
}

impl SessionRecord {
    /// A session of conversation `token` that begins `now`, before its first turn.
    pub(crate) fn begin(
        id: String,
        token: &str,
        heartbeat: u32,
        now: Millis,
        partition: Option<u16>,
    ) -> SessionRecord {
        SessionRecord {
            id,
            token: token.to_owned(),
            turns: 0,
            heartbeat,
            last_activity: now,
            started: now,
            renewal_due: false,
            expired: false,
            owner: None,
            partition,
        }
    }
}

/// Where an agent's accepted frontends came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum ProfileSource {
    Config,
    Ping,
}

/// The frontends an agent accepts, most preferred first.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct AgentProfile {
    #[serde(with = "frontend_names")]
    pub frontends: Vec<Frontend>,
    pub source: ProfileSource,
    pub updated: Millis,
    /// The tokenizer the agent announced, if any (records without one read as `None`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokenizer: Option<crate::silp::tokens::Tokenizer>,
}

/// A compile to freeze in the compile.lock unless (IR hash, frontend) is frozen already.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Freeze {
    pub ir_hash: String,
    pub frontend: Frontend,
    pub output: String,
    /// The subject of the principal whose message froze it, recorded in the record.
    pub principal: Option<String>,
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
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum LedgerState {
    /// Handled, state changed, publishes not yet all confirmed. `turn` is the session turn the
    /// message counted: a redelivery sends the same envelopes again without counting it twice.
    /// `session` is the session as this message left it, which a cluster's changelog must
    /// carry with this entry, even when the message is sent again after later turns were
    /// counted (a replica holding those turns without their ledger entries would count them
    /// again). Replicas receive the entry without it: it came with its session.
    Pending {
        turn: Option<Turn>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        session: Option<Box<SessionRecord>>,
    },
    /// Every publish confirmed; a redelivery must not publish again.
    Published,
}

/// The session state after counting one turn. A pending ledger entry keeps it, so that a
/// redelivered message reports the turn it counted instead of counting another.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Turn {
    pub id: String,
    pub turn: u64,
    /// The session renewed after the previous turn: send a renewal notice with this message.
    pub renewed: bool,
}

impl LedgerState {
    /// The entry as a replica receives it, beside the session it carries.
    pub(crate) fn for_replica(&self) -> LedgerState {
        match self {
            LedgerState::Pending { turn, .. } => LedgerState::Pending { turn: turn.clone(), session: None },
            LedgerState::Published => LedgerState::Published,
        }
    }
}

/// What a message changed in its conversation, for the replicas of its partition: the
/// session as the message left it (not as it stands when the change is sent: later messages
/// may have counted turns since) and the message's ledger entry, which must travel together.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionChange {
    pub session: Option<SessionRecord>,
    pub message: Option<(String, LedgerState)>,
}

/// Everything one message changes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Changes {
    pub sessions: Vec<SessionRecord>,
    /// The turn count each changed session had when the change was planned, by conversation
    /// token. Messages of one conversation may be handled at once (two doors, or a request and
    /// its answer): a commit whose session moved meanwhile is refused as a conflict, and the
    /// message is planned again, so that no turn is lost.
    pub turns_seen: Vec<(String, u64)>,
    pub profiles: Vec<(String, AgentProfile)>,
    pub freezes: Vec<Freeze>,
    pub ledger: Vec<(String, LedgerState)>,
    /// Ledger entries to drop: messages refused for good after their state was committed,
    /// whose ids may come again as new messages.
    pub forgotten: Vec<String>,
    /// The subject of the principal whose message made these changes: its new ledger entries
    /// name it, and keep it when later marked published.
    pub principal: Option<String>,
}

impl Changes {
    pub(crate) fn is_empty(&self) -> bool {
        self.sessions.is_empty()
            && self.profiles.is_empty()
            && self.freezes.is_empty()
            && self.ledger.is_empty()
            && self.forgotten.is_empty()
    }
}

/// A store failure: transient unless the store says its data is damaged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// Another message changed the same state at the same time; handle this one again.
    #[error("conflicting update: {0}")]
    Conflict(String),
    #[error("store data is damaged: {0}")]
    Corrupt(String),
    /// The compile.lock key does not fit the store (too short, another key, or none).
    #[error("store refused the compile.lock key: {0}")]
    Key(String),
}

/// The storage interface of the gateway core.
pub trait Store: Send + Sync {
    fn session_by_token(&self, token: &str) -> Result<Option<SessionRecord>, StoreError>;
    /// Ids held by live sessions and tombstones.
    fn profile(&self, agent: &str) -> Result<Option<AgentProfile>, StoreError>;
    /// Number of stored agent profiles (each learnt from a `//ping`).
    fn profile_count(&self) -> Result<usize, StoreError>;
    /// The frozen compile of (IR hash, frontend), if any.
    fn frozen(&self, ir_hash: &str, frontend: Frontend) -> Result<Option<String>, StoreError>;
    fn ledger(&self, message_id: &str) -> Result<Option<LedgerState>, StoreError>;

    /// Applies every change of one message atomically, and returns, for each freeze in order,
    /// what the compile.lock now holds (the first freeze of an entry wins). A session whose
    /// turns moved since the change was planned ([`Changes::turns_seen`]) is a
    /// [`StoreError::Conflict`].
    fn commit(&self, changes: &Changes, now: Millis) -> Result<Vec<Frozen>, StoreError>;

    /// Makes every committed change durable. A message is acknowledged only after this.
    fn flush(&self) -> Result<(), StoreError>;

    /// [`Store::flush`] for async callers: it does not block the runtime, and concurrent
    /// flushes may share one disk sync.
    fn flush_async(&self) -> FlushFuture<'_> {
        let result = self.flush();
        Box::pin(std::future::ready(result))
    }
}

/// The future of [`Store::flush_async`].
pub(crate) type FlushFuture<'a> =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), StoreError>> + Send + 'a>>;

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

    fn profile(&self, agent: &str) -> Result<Option<AgentProfile>, StoreError> {
        self.with(|m| m.profiles.get(agent).cloned())
    }

    fn profile_count(&self) -> Result<usize, StoreError> {
        self.with(|m| m.profiles.len())
    }

    fn frozen(&self, ir_hash: &str, frontend: Frontend) -> Result<Option<String>, StoreError> {
        self.with(|m| m.lock.get(&frontend).and_then(|l| l.get(ir_hash)).cloned())
    }

    fn ledger(&self, message_id: &str) -> Result<Option<LedgerState>, StoreError> {
        self.with(|m| m.ledger.get(message_id).cloned())
    }

    fn commit(&self, changes: &Changes, _now: Millis) -> Result<Vec<Frozen>, StoreError> {
        self.with(|m| {
            for (token, seen) in &changes.turns_seen {
                let now = m.sessions.get(token).map_or(0, |s| s.turns);
                if now != *seen {
                    return Err(StoreError::Conflict(format!(
                        "the session of {token} moved from turn {seen} to {now}"
                    )));
                }
            }
            for s in &changes.sessions {
                match m.sessions.get_mut(&s.token) {
                    Some(stored) => stored.clone_from(s),
                    None => {
                        m.sessions.insert(s.token.clone(), s.clone());
                    }
                }
            }
            for (agent, profile) in &changes.profiles {
                m.profiles.insert(agent.clone(), profile.clone());
            }
            for (id, state) in &changes.ledger {
                m.ledger.insert(id.clone(), state.clone());
            }
            for id in &changes.forgotten {
                m.ledger.remove(id);
            }
            Ok(changes
                .freezes
                .iter()
                .map(|f| {
                    let entries = m.lock.entry(f.frontend).or_default();
                    match entries.get(&f.ir_hash) {
                        Some(frozen) => {
                            Frozen { output: frozen.clone(), first: false, drift: *frozen != f.output }
                        }
                        None => {
                            entries.insert(f.ir_hash.clone(), f.output.clone());
                            Frozen { output: f.output.clone(), first: true, drift: false }
                        }
                    }
                })
                .collect())
        })?
    }

    fn flush(&self) -> Result<(), StoreError> {
        Ok(())
    }
}

/// Frontends stored by name, so the stored form does not depend on enum order.
mod frontend_names {
    use crate::silp::Frontend;
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(frontends: &[Frontend], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(frontends.iter().map(|f| f.name()))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Frontend>, D::Error> {
        let names = Vec::<String>::deserialize(d)?;
        names
            .iter()
            .map(|n| n.parse().map_err(|e: crate::silp::SilpError| serde::de::Error::custom(e.message)))
            .collect()
    }
}
