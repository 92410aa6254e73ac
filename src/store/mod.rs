//! Durable state in sled: sessions, agent profiles, the hash-chained compile.lock and the
//! processed-message ledger, behind the gateway core's [`Store`] interface.
//!
//! sled (0.34.7, unmaintained) stays behind this one module, with a schema version key, so that
//! it can be replaced. It only makes a write durable on an explicit flush: a message's changes
//! are committed in one transaction across all trees, and [`Store::flush`] (or
//! [`SledStore::flush_async`]) is called before the message is acknowledged.
//!
//! Trees: `meta` (schema version, chain head), `sessions` (token -> record), `session_ids`
//! (id -> token), `profiles` (agent -> profile), `lock` (seq -> record), `lock_index`
//! (frontend, IR hash -> seq), `ledger` (message id -> state), `ledger_by_time` (time, id).

pub mod chain;
pub mod time;

use crate::gateway::store::{
    AgentProfile, Changes, Frozen, LedgerState, Millis, SessionRecord, Store, StoreError,
};
use crate::silp::Frontend;
use chain::{ChainError, Head, LockRecord, Sealer};
use serde::{Deserialize, Serialize};
use sled::Transactional;
use sled::transaction::{ConflictableTransactionError, TransactionError, TransactionalTree};
use std::path::Path;

/// The layout version written into `meta`; a store with another version is refused.
pub const SCHEMA_VERSION: &str = "1";

/// Retention of the ledger and of expired sessions.
#[derive(Debug, Clone, Copy)]
pub struct Retention {
    /// Ledger entries older than this are dropped.
    pub ledger_ttl_ms: Millis,
    /// At most this many ledger entries are kept (oldest dropped first).
    pub ledger_max_entries: usize,
    /// A session idle this long is expired (it answers `session_expired`).
    pub session_idle_ms: Millis,
    /// An expired session is forgotten (its id freed) this long after it expired.
    pub tombstone_ms: Millis,
}

/// What a sweep removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Swept {
    pub sessions_expired: usize,
    pub sessions_forgotten: usize,
    pub ledger_dropped: usize,
}

/// The sled-backed store.
pub struct SledStore {
    db: sled::Db,
    meta: sled::Tree,
    sessions: sled::Tree,
    session_ids: sled::Tree,
    profiles: sled::Tree,
    lock: sled::Tree,
    lock_index: sled::Tree,
    ledger: sled::Tree,
    ledger_by_time: sled::Tree,
    sealer: Sealer,
}

/// The chain's last record, kept in `meta` so that truncation is evident.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct ChainHead {
    records: u64,
    last_hash: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct LedgerEntry {
    state: LedgerState,
    at: Millis,
}

fn unavailable(e: impl std::fmt::Display) -> StoreError {
    StoreError::Unavailable(e.to_string())
}

fn corrupt(e: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(e.to_string())
}

fn decode<T: for<'de> Deserialize<'de>>(bytes: &[u8], what: &str) -> Result<T, StoreError> {
    serde_json::from_slice(bytes).map_err(|e| corrupt(format!("{what}: {e}")))
}

fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    serde_json::to_vec(value).expect("store records serialise")
}

fn lock_key(frontend: Frontend, ir_hash: &str) -> Vec<u8> {
    let mut key = Vec::with_capacity(16 + ir_hash.len());
    key.extend_from_slice(frontend.name().as_bytes());
    key.push(0);
    key.extend_from_slice(ir_hash.as_bytes());
    key
}

fn time_key(at: Millis, id: &str) -> Vec<u8> {
    let mut key = at.to_be_bytes().to_vec();
    key.extend_from_slice(id.as_bytes());
    key
}

impl SledStore {
    /// Opens (or creates) the store in `dir`. `key` makes the compile.lock chain keyed.
    pub fn open(dir: &Path, key: Option<Vec<u8>>) -> Result<SledStore, StoreError> {
        let db = sled::Config::new()
            .path(dir)
            .open()
            .map_err(|e| unavailable(format!("cannot open {}: {e}", dir.display())))?;
        let tree = |name: &str| db.open_tree(name).map_err(unavailable);
        let store = SledStore {
            meta: tree("meta")?,
            sessions: tree("sessions")?,
            session_ids: tree("session_ids")?,
            profiles: tree("profiles")?,
            lock: tree("lock")?,
            lock_index: tree("lock_index")?,
            ledger: tree("ledger")?,
            ledger_by_time: tree("ledger_by_time")?,
            sealer: Sealer::new(key),
            db,
        };
        match store.meta.get("schema_version").map_err(unavailable)? {
            None => {
                store.meta.insert("schema_version", SCHEMA_VERSION).map_err(unavailable)?;
                store.db.flush().map_err(unavailable)?;
            }
            Some(v) if v.as_ref() == SCHEMA_VERSION.as_bytes() => {}
            Some(v) => {
                return Err(corrupt(format!(
                    "store schema version {} is not {SCHEMA_VERSION}; migrate or start from an empty store",
                    String::from_utf8_lossy(&v)
                )));
            }
        }
        Ok(store)
    }

    /// Makes every committed change durable, without blocking the async runtime.
    pub async fn flush_async(&self) -> Result<(), StoreError> {
        self.db.flush_async().await.map(|_| ()).map_err(unavailable)
    }

    /// Every compile.lock record, in chain order.
    pub fn lock_records(&self) -> impl Iterator<Item = Result<LockRecord, ChainError>> + '_ {
        self.lock.iter().enumerate().map(|(i, entry)| {
            let (_, bytes) =
                entry.map_err(|e| ChainError { position: i as u64, reason: format!("cannot read: {e}") })?;
            serde_json::from_slice(&bytes)
                .map_err(|e| ChainError { position: i as u64, reason: format!("not a lock record: {e}") })
        })
    }

    /// The head sealing the current chain.
    pub fn lock_head(&self) -> Result<Head, StoreError> {
        let head = self.chain_head()?;
        Ok(self.sealer.head(head.records, &head.last_hash))
    }

    /// Verifies the whole compile.lock chain against the head kept in `meta`.
    pub fn verify_lock(&self) -> Result<u64, ChainError> {
        let head = self.lock_head().map_err(|e| ChainError { position: 0, reason: e.to_string() })?;
        chain::verify(self.lock_records(), Some(&head), &self.sealer)
    }

    /// The lock records of one IR (every frontend).
    pub fn lock_for(&self, ir_hash: &str) -> Result<Vec<LockRecord>, StoreError> {
        let mut out = Vec::new();
        for frontend in Frontend::ALL {
            if let Some(seq) = self.lock_index.get(lock_key(frontend, ir_hash)).map_err(unavailable)? {
                let bytes = self
                    .lock
                    .get(&seq)
                    .map_err(unavailable)?
                    .ok_or_else(|| corrupt("lock index points at a missing record"))?;
                out.push(decode(&bytes, "lock record")?);
            }
        }
        Ok(out)
    }

    /// Every session, live or expired.
    pub fn sessions(&self) -> Result<Vec<SessionRecord>, StoreError> {
        self.sessions
            .iter()
            .map(|e| e.map_err(unavailable).and_then(|(_, v)| decode(&v, "session")))
            .collect()
    }

    /// Number of ledger entries.
    pub fn ledger_len(&self) -> usize {
        self.ledger.len()
    }

    fn chain_head(&self) -> Result<ChainHead, StoreError> {
        match self.meta.get("lock_head").map_err(unavailable)? {
            Some(bytes) => decode(&bytes, "chain head"),
            None => Ok(ChainHead { records: 0, last_hash: chain::GENESIS.to_owned() }),
        }
    }

    /// Expires idle sessions, forgets old tombstones (freeing their ids) and trims the ledger.
    pub fn sweep(&self, now: Millis, retention: &Retention) -> Result<Swept, StoreError> {
        let mut swept = Swept::default();
        for record in self.sessions()? {
            let idle = now.saturating_sub(record.last_activity);
            if !record.expired && idle > retention.session_idle_ms {
                let expired = SessionRecord { expired: true, ..record };
                self.sessions.insert(expired.token.as_bytes(), encode(&expired)).map_err(unavailable)?;
                swept.sessions_expired += 1;
            } else if record.expired && idle > retention.session_idle_ms + retention.tombstone_ms {
                (&self.sessions, &self.session_ids)
                    .transaction(|(sessions, ids)| {
                        sessions.remove(record.token.as_bytes())?;
                        ids.remove(record.id.as_bytes())?;
                        Ok::<_, ConflictableTransactionError<()>>(())
                    })
                    .map_err(|e| unavailable(format!("{e:?}")))?;
                swept.sessions_forgotten += 1;
            }
        }
        let over = self.ledger.len().saturating_sub(retention.ledger_max_entries);
        for (i, entry) in self.ledger_by_time.iter().enumerate() {
            let (key, _) = entry.map_err(unavailable)?;
            let at = Millis::from_be_bytes(key[..8].try_into().expect("time keys start with 8 bytes"));
            if i >= over && now.saturating_sub(at) <= retention.ledger_ttl_ms {
                break;
            }
            let id = &key[8..];
            (&self.ledger, &self.ledger_by_time)
                .transaction(|(ledger, by_time)| {
                    ledger.remove(id)?;
                    by_time.remove(&key)?;
                    Ok::<_, ConflictableTransactionError<()>>(())
                })
                .map_err(|e| unavailable(format!("{e:?}")))?;
            swept.ledger_dropped += 1;
        }
        Ok(swept)
    }
}

/// Why a transaction was aborted.
enum Abort {
    Conflict(String),
    Corrupt(String),
}

type Tx = TransactionalTree;

impl Store for SledStore {
    fn session_by_token(&self, token: &str) -> Result<Option<SessionRecord>, StoreError> {
        self.sessions.get(token.as_bytes()).map_err(unavailable)?.map(|b| decode(&b, "session")).transpose()
    }

    fn session_ids_in_use(&self) -> Result<Vec<String>, StoreError> {
        self.session_ids
            .iter()
            .keys()
            .map(|k| k.map_err(unavailable).map(|k| String::from_utf8_lossy(&k).into_owned()))
            .collect()
    }

    fn profile(&self, agent: &str) -> Result<Option<AgentProfile>, StoreError> {
        self.profiles.get(agent.as_bytes()).map_err(unavailable)?.map(|b| decode(&b, "profile")).transpose()
    }

    fn frozen(&self, ir_hash: &str, frontend: Frontend) -> Result<Option<String>, StoreError> {
        let Some(seq) = self.lock_index.get(lock_key(frontend, ir_hash)).map_err(unavailable)? else {
            return Ok(None);
        };
        let bytes = self
            .lock
            .get(&seq)
            .map_err(unavailable)?
            .ok_or_else(|| corrupt("lock index points at a missing record"))?;
        Ok(Some(decode::<LockRecord>(&bytes, "lock record")?.output))
    }

    fn ledger(&self, message_id: &str) -> Result<Option<LedgerState>, StoreError> {
        Ok(self
            .ledger
            .get(message_id.as_bytes())
            .map_err(unavailable)?
            .map(|b| decode::<LedgerEntry>(&b, "ledger entry"))
            .transpose()?
            .map(|e| e.state))
    }

    fn commit(&self, changes: &Changes, now: Millis) -> Result<Vec<Frozen>, StoreError> {
        if changes.is_empty() {
            return Ok(Vec::new());
        }
        let trees = (
            &self.meta,
            &self.sessions,
            &self.session_ids,
            &self.profiles,
            &self.lock,
            &self.lock_index,
            &self.ledger,
            &self.ledger_by_time,
        );
        let timestamp = time::iso8601(now);
        let result = trees.transaction(
            |(meta, sessions, session_ids, profiles, lock, lock_index, ledger, by_time)| {
                for s in &changes.sessions {
                    if let Some(holder) = session_ids.get(s.id.as_bytes())?
                        && holder.as_ref() != s.token.as_bytes()
                    {
                        return Err(ConflictableTransactionError::Abort(Abort::Conflict(format!(
                            "session id {} is held by another conversation",
                            s.id
                        ))));
                    }
                    sessions.insert(s.token.as_bytes(), encode(s))?;
                    session_ids.insert(s.id.as_bytes(), s.token.as_bytes())?;
                }
                for (agent, profile) in &changes.profiles {
                    profiles.insert(agent.as_bytes(), encode(profile))?;
                }
                for (id, state) in &changes.ledger {
                    if let Some(old) = ledger.get(id.as_bytes())? {
                        let old: LedgerEntry = serde_json::from_slice(&old).map_err(|e| {
                            ConflictableTransactionError::Abort(Abort::Corrupt(format!("ledger entry: {e}")))
                        })?;
                        by_time.remove(time_key(old.at, id))?;
                    }
                    ledger.insert(id.as_bytes(), encode(&LedgerEntry { state: *state, at: now }))?;
                    by_time.insert(time_key(now, id), &[])?;
                }
                let mut frozen = Vec::with_capacity(changes.freezes.len());
                for f in &changes.freezes {
                    frozen.push(
                        self.freeze_in(
                            meta, lock, lock_index, f.frontend, &f.ir_hash, &f.output, &timestamp,
                        )?,
                    );
                }
                Ok(frozen)
            },
        );
        result.map_err(|e| match e {
            TransactionError::Abort(Abort::Conflict(m)) => StoreError::Conflict(m),
            TransactionError::Abort(Abort::Corrupt(m)) => StoreError::Corrupt(m),
            TransactionError::Storage(e) => unavailable(e),
        })
    }

    fn flush(&self) -> Result<(), StoreError> {
        self.db.flush().map(|_| ()).map_err(unavailable)
    }
}

impl SledStore {
    /// Inside a commit: the frozen entry of (frontend, IR hash), appending a chain record when
    /// this is the first compile.
    #[allow(clippy::too_many_arguments)]
    fn freeze_in(
        &self,
        meta: &Tx,
        lock: &Tx,
        lock_index: &Tx,
        frontend: Frontend,
        ir_hash: &str,
        output: &str,
        timestamp: &str,
    ) -> Result<Frozen, ConflictableTransactionError<Abort>> {
        let bad = |what: &str, e: serde_json::Error| {
            ConflictableTransactionError::Abort(Abort::Corrupt(format!("{what}: {e}")))
        };
        let key = lock_key(frontend, ir_hash);
        if let Some(seq) = lock_index.get(&key)? {
            let bytes = lock.get(&seq)?.ok_or_else(|| {
                ConflictableTransactionError::Abort(Abort::Corrupt(
                    "lock index points at a missing record".into(),
                ))
            })?;
            let record: LockRecord = serde_json::from_slice(&bytes).map_err(|e| bad("lock record", e))?;
            let drift = record.output != output;
            return Ok(Frozen { output: record.output, first: false, drift });
        }
        let head: ChainHead = match meta.get("lock_head")? {
            Some(bytes) => serde_json::from_slice(&bytes).map_err(|e| bad("chain head", e))?,
            None => ChainHead { records: 0, last_hash: chain::GENESIS.to_owned() },
        };
        let record = self.sealer.next(
            head.records,
            &head.last_hash,
            ir_hash,
            frontend.name(),
            output,
            timestamp.to_owned(),
        );
        let seq_key = head.records.to_be_bytes();
        lock.insert(&seq_key, encode(&record))?;
        lock_index.insert(key, &seq_key)?;
        meta.insert(
            "lock_head",
            encode(&ChainHead { records: head.records + 1, last_hash: record.record_hash }),
        )?;
        Ok(Frozen { output: output.to_owned(), first: true, drift: false })
    }
}
