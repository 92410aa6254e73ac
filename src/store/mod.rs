//! Durable state in sled: sessions, agent profiles, the hash-chained compile.lock and the
//! processed-message ledger, behind the gateway core's [`Store`] interface.
//!
//! sled (0.34.7, unmaintained) stays behind this one module, with a schema version key, so that
//! it can be replaced. Its cost is per key (about 6-11 µs of tree work each), so the store uses
//! it as a log with checkpoints, the shape of a write-ahead log with snapshots:
//!
//! - A commit lands in memory ([`staged`]), where the next message's reads find it.
//! - [`Store::flush`] (or [`Store::flush_async`]), called before a message is acknowledged,
//!   appends everything committed since the last flush to the journal as **one** checksummed
//!   record ([`journal`]) and syncs: one key per window of messages.
//! - A checkpoint, in the background every 2 s (or 65,536 journaled keys), writes the
//!   journaled state into the keyed records below, each key once however many messages wrote
//!   it, and trims the journal behind it. What every message adds (compile.lock records,
//!   ledger entries) is packed into chunks there, found through maps kept in memory
//!   ([`keyed`]). Reads of what is not in memory go to those records.
//! - Opening the store replays what the journal still holds onto the keyed records.
//!
//! Commits are serialised by a mutex, which makes their read-check-write steps (session turns,
//! first freeze wins, chain order) atomic.
//!
//! The compile.lock is checked where it is opened: the stored head (record count, last hash)
//! is sealed with the chain's key and must match the chain's last record, and a fingerprint
//! of the key (`meta:lock_key`) must match the key given, so that a store is never appended to
//! under another key or none (which would break its chain for every key).
//!
//! Keys (logical; [`keyed`] says how sled holds them): `meta:schema_version`, `meta:lock_head`
//! (sealed), `meta:lock_key` (key fingerprint), `journal:<seq, 8 bytes BE>` (records not yet
//! checkpointed), `session:<token>`, `profile:<agent>`, `lock:<seq, 8 bytes BE>` (in chunks of
//! 32, `lockc:<seq / 32>`), `lockx:<frontend>\0<ir hash>` (-> seq; in memory only),
//! `ledger:<message id>` (in chunks by first-handling time, 100 ms to a chunk,
//! `ledgerc:<time / 100>`); in a cluster also `cluster:applied:<partition, 2 bytes BE>` and
//! `cluster:lock_applied` (stream offsets, see
//! [`replica`]).

pub mod chain;
mod journal;
pub mod keyed;
mod migrate;
pub mod replica;
mod staged;

use crate::gateway::store::{
    AgentProfile, Changes, Frozen, LedgerState, Millis, ProfileSource, SessionRecord, Store, StoreError,
};
use crate::silp::Frontend;
use chain::{ChainError, Head, LockRecord, Sealer};
use keyed::{Keyed, LEDGER, LOCK, LOCK_INDEX, LOCK_RECORDS};
pub use migrate::SCHEMA_VERSION;
use serde::{Deserialize, Serialize};
use staged::{Checkpoint, Found, Staged, Writes};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

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
    /// Agent profiles learnt from `//ping` and not renewed for a session's idle time.
    pub profiles_forgotten: usize,
}

/// The sled-backed store.
pub struct SledStore {
    db: sled::Db,
    /// The keyed records in sled, as [`keyed`] packs them, and the compile.lock index.
    keyed: Arc<Keyed>,
    sealer: Sealer,
    /// Serialises commits and sweeps: their reads and their batch form one atomic step.
    writer: Mutex<()>,
    /// Batches written, and the count covered by the last completed flush. A flush with
    /// nothing new to cover returns at once (sled's own asynchronous flush costs a thread hop
    /// even then); one that starts covers every batch written before it.
    written: AtomicU64,
    flushed: AtomicU64,
    /// One disk sync at a time; whoever waited for the turn usually finds its writes covered
    /// by the sync before it (group commit).
    flush_turn: tokio::sync::Mutex<()>,
    /// In a cluster the compile.lock chain is written only from the cluster's lock stream
    /// ([`replica`]); commits then leave new entries for the stream to decide.
    chain_follows_stream: AtomicBool,
    /// Opened without its key to read sessions and lock records: every write is refused.
    read_only: bool,
    /// Commits not yet in sled's keyed records.
    staged: Arc<Staged>,
    /// A checkpoint runs in the background; the next one is not started beside it.
    checkpointing: Arc<AtomicBool>,
    /// Taken around every write and sync this store hands sled. sled 0.34 has open reports of
    /// deadlocks under concurrent inserts, removals and flushes (spacejam/sled#1412); with the
    /// checkpoint on a thread of its own, this keeps sled's writers one at a time, as they were
    /// when one batch per flush was all it received. Reads stay concurrent.
    disk: Arc<Mutex<()>>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct LedgerEntry {
    state: LedgerState,
    at: Millis,
    /// The subject of the principal whose message it is, when one was known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    principal: Option<String>,
}

const HEAD_KEY: &[u8] = b"meta:lock_head";
const KEY_FINGERPRINT: &[u8] = b"meta:lock_key";
const SESSION: &[u8] = b"session:";
const PROFILE: &[u8] = b"profile:";

fn key(prefix: &[u8], rest: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(prefix.len() + rest.len());
    k.extend_from_slice(prefix);
    k.extend_from_slice(rest);
    k
}

fn lock_index_key(frontend: Frontend, ir_hash: &str) -> Vec<u8> {
    key(LOCK_INDEX, &keyed::lock_index_member(frontend.name(), ir_hash))
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

/// Opens the sled database, waiting briefly for a previous owner in this process (a store
/// just dropped) to let go of the file lock.
fn open_db(dir: &Path) -> Result<sled::Db, StoreError> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        match sled::Config::new().path(dir).open() {
            Ok(db) => return Ok(db),
            // sled reports a held lock as an I/O error wrapping EWOULDBLOCK.
            Err(sled::Error::Io(e))
                if e.to_string().contains("acquire lock") && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            Err(e) => return Err(unavailable(format!("cannot open {}: {e}", dir.display()))),
        }
    }
}

/// The store holds conversations and the compile.lock: its directory is the owner's alone,
/// whatever the umask it was created under.
fn owner_only(dir: &Path) -> Result<(), StoreError> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .map_err(|e| unavailable(format!("cannot make {} private: {e}", dir.display())))
}

impl SledStore {
    /// Opens (or creates) the store in `dir`. `key` makes the compile.lock chain keyed; it must
    /// be the key the store was created with (or none for an unkeyed store), and the chain's
    /// head must be sealed by it and match the last record. A store of the previous layout is
    /// migrated.
    ///
    /// # Errors
    /// [`StoreError::Key`] for a short key or another key than the store's;
    /// [`StoreError::Corrupt`] for a head that is not sealed or does not match the chain, or
    /// an unknown layout version.
    pub fn open(dir: &Path, key: Option<Vec<u8>>) -> Result<SledStore, StoreError> {
        let sealer = Sealer::new(key).map_err(|e| StoreError::Key(e.to_string()))?;
        let db = open_db(dir)?;
        owner_only(dir)?;
        migrate::to_current(&Keyed::new(db.clone()), &sealer)?;
        let keyed = Keyed::load(db.clone())?;
        journal::replay(&keyed)?;
        check_key(&db, &sealer)?;
        let store = SledStore::with(keyed, sealer, false);
        store.check_head()?;
        Ok(store)
    }

    /// Opens the store in `dir` to read sessions and lock records without the chain's key.
    /// Nothing can be written through it.
    ///
    /// # Errors
    /// [`StoreError::Corrupt`] for an unknown layout version.
    pub fn open_to_read(dir: &Path) -> Result<SledStore, StoreError> {
        let db = open_db(dir)?;
        // Packing records into chunks and replaying the journal change how the keyed records
        // say it, not the state they hold: they need no key.
        migrate::to_readable(&Keyed::new(db.clone()))?;
        let keyed = Keyed::load(db)?;
        journal::replay(&keyed)?;
        Ok(SledStore::with(keyed, Sealer::new(None).map_err(|e| StoreError::Key(e.to_string()))?, true))
    }

    fn with(keyed: Keyed, sealer: Sealer, read_only: bool) -> SledStore {
        SledStore {
            db: keyed.db().clone(),
            keyed: Arc::new(keyed),
            sealer,
            writer: Mutex::new(()),
            written: AtomicU64::new(0),
            flushed: AtomicU64::new(0),
            flush_turn: tokio::sync::Mutex::new(()),
            chain_follows_stream: AtomicBool::new(false),
            read_only,
            staged: Arc::default(),
            checkpointing: Arc::default(),
            disk: Arc::default(),
        }
    }

    /// The stored head is sealed by this store's key, names the last record, and no record
    /// follows it: a head rewritten without the key, or a chain cut short or extended behind
    /// the store's back, stops the open.
    fn check_head(&self) -> Result<(), StoreError> {
        let head = self.chain_head()?;
        if self.sealer.head(head.records, &head.last_hash).head_hash != head.head_hash {
            return Err(corrupt("the compile.lock head is not sealed by this store's key: it was rewritten"));
        }
        let last = self.keyed.last(&LOCK_RECORDS)?;
        let expected = head.records.checked_sub(1).map(|seq| key(LOCK, &seq.to_be_bytes()));
        if last.as_deref() != expected.as_deref() {
            return Err(corrupt(format!(
                "the compile.lock head seals {} records but the chain ends elsewhere: records were deleted or added",
                head.records
            )));
        }
        if let Some(seq) = head.records.checked_sub(1) {
            let record = self.lock_record(&seq.to_be_bytes())?;
            if record.record_hash != head.last_hash || self.sealer.record_hash(&record) != record.record_hash
            {
                return Err(corrupt(format!(
                    "compile.lock record {seq} is not the one the head seals: it was edited or replaced"
                )));
            }
        }
        Ok(())
    }

    fn writable(&self) -> Result<(), StoreError> {
        if self.read_only {
            return Err(StoreError::Key("the store was opened to read, without its key".into()));
        }
        Ok(())
    }

    /// The value of `key`: staged, or else in sled.
    fn get(&self, key: &[u8]) -> Result<Option<sled::IVec>, StoreError> {
        match self.staged.get(key) {
            Found::Staged(value) => Ok(value),
            Found::Sled => self.keyed.get(key),
        }
    }

    /// Stages one commit's writes (the caller holds the write lock). They go to the journal at
    /// the next flush, or now if too many are waiting.
    fn stage(&self, writes: Writes) -> Result<(), StoreError> {
        if writes.is_empty() {
            return Ok(());
        }
        let waiting = self.staged.stage(writes);
        self.written.fetch_add(1, Ordering::AcqRel);
        if waiting > staged::LIMIT {
            self.append()?;
            if self.staged.checkpoint_due() != Checkpoint::NotDue {
                checkpoint(&self.staged, &self.keyed, &self.disk)?;
            }
        }
        Ok(())
    }

    /// Appends everything staged to the journal as one record (not yet synced).
    fn append(&self) -> Result<(), StoreError> {
        self.staged.append(|key, record| {
            let _disk = one_at_a_time(&self.disk);
            self.db.insert(key, record).map(drop).map_err(unavailable)
        })
    }

    /// Makes everything handed to sled durable.
    fn sync(&self) -> Result<(), StoreError> {
        let _disk = one_at_a_time(&self.disk);
        self.db.flush().map(drop).map_err(unavailable)
    }

    /// Writes everything committed into sled's keyed records. Scans call it first: they read
    /// those records alone.
    fn settle(&self) -> Result<(), StoreError> {
        self.append()?;
        checkpoint(&self.staged, &self.keyed, &self.disk).map(drop)
    }

    /// Writes everything committed into the keyed records now and trims the journal; returns
    /// the number of keys written. The store does this by itself after flushes; this is for
    /// choosing the moment (the crash test checkpoints mid-run). It does not sync: the next
    /// flush does.
    ///
    /// # Errors
    /// [`StoreError::Unavailable`] when sled cannot write; the writes stay journaled.
    pub fn checkpoint(&self) -> Result<usize, StoreError> {
        self.writable()?;
        self.append()?;
        checkpoint(&self.staged, &self.keyed, &self.disk)
    }

    /// Starts a checkpoint in the background if one is due and none is running.
    fn start_checkpoint(
        &self,
        due: Checkpoint,
    ) -> Option<tokio::task::JoinHandle<Result<usize, StoreError>>> {
        if due == Checkpoint::NotDue || self.checkpointing.swap(true, Ordering::AcqRel) {
            return None;
        }
        let (staged, keyed, disk, running) =
            (self.staged.clone(), self.keyed.clone(), self.disk.clone(), self.checkpointing.clone());
        Some(tokio::task::spawn_blocking(move || {
            let written = checkpoint(&staged, &keyed, &disk);
            running.store(false, Ordering::Release);
            if let Err(e) = &written {
                tracing::warn!(error = %e, "A checkpoint of the store failed; its writes stay in the journal.");
            }
            written
        }))
    }

    fn write_lock(&self) -> Result<std::sync::MutexGuard<'_, ()>, StoreError> {
        self.writer.lock().map_err(|_| corrupt("a writer panicked mid-commit"))
    }

    /// Every compile.lock record, in chain order.
    pub fn lock_records(&self) -> impl Iterator<Item = Result<LockRecord, ChainError>> + '_ {
        let unsettled = self.settle().err().map(|e| Err(ChainError { position: 0, reason: e.to_string() }));
        unsettled.into_iter().chain(self.keyed.scan(&LOCK_RECORDS).enumerate().map(|(i, entry)| {
            let (_, bytes) =
                entry.map_err(|e| ChainError { position: i as u64, reason: format!("cannot read: {e}") })?;
            serde_json::from_slice(&bytes)
                .map_err(|e| ChainError { position: i as u64, reason: format!("not a lock record: {e}") })
        }))
    }

    /// The stored head sealing the current chain.
    pub fn lock_head(&self) -> Result<Head, StoreError> {
        self.chain_head()
    }

    /// Verifies the whole compile.lock chain against the sealed head kept in the store, and the
    /// index beside it: every record is indexed once, and every index entry points at the
    /// record of its own (frontend, IR hash).
    pub fn verify_lock(&self) -> Result<u64, ChainError> {
        let head = self.lock_head().map_err(|e| ChainError { position: 0, reason: e.to_string() })?;
        let count = chain::verify(self.lock_records(), Some(&head), &self.sealer)?;
        self.verify_index(count)?;
        Ok(count)
    }

    /// The index (rebuilt from the chain at open, kept since by every freeze) finds each record
    /// by its own (frontend, IR hash), and no two records freeze the same one.
    fn verify_index(&self, records: u64) -> Result<(), ChainError> {
        let mut indexed = 0u64;
        for record in self.lock_records() {
            let record = record?;
            let bad = |reason: String| ChainError { position: record.seq, reason };
            let entry = key(LOCK_INDEX, &keyed::lock_index_member(&record.frontend, &record.ir_hash));
            let found = self.get(&entry).map_err(|e| bad(format!("cannot read the index: {e}")))?;
            let found = found.and_then(|seq| <[u8; 8]>::try_from(seq.as_ref()).ok()).map(u64::from_be_bytes);
            if found != Some(record.seq) {
                return Err(bad(match found {
                    Some(first) => format!(
                        "record {} freezes ({}, {}) again, frozen first by record {first}",
                        record.seq, record.frontend, record.ir_hash
                    ),
                    None => format!("record {} is missing from the index", record.seq),
                }));
            }
            indexed += 1;
        }
        if indexed != records {
            return Err(ChainError {
                position: records,
                reason: format!("{indexed} records indexed for {records} in the chain"),
            });
        }
        Ok(())
    }

    /// The lock records of one IR (every frontend).
    pub(crate) fn lock_for(&self, ir_hash: &str) -> Result<Vec<LockRecord>, StoreError> {
        let mut out = Vec::new();
        for frontend in Frontend::ALL {
            if let Some(record) = self.indexed_record(frontend, ir_hash)? {
                out.push(record);
            }
        }
        Ok(out)
    }

    /// The record the index holds for (frontend, IR hash), checked to be that entry's: an
    /// index pointed at another record must not hand out that record's output.
    fn indexed_record(&self, frontend: Frontend, ir_hash: &str) -> Result<Option<LockRecord>, StoreError> {
        let Some(seq) = self.get(&lock_index_key(frontend, ir_hash))? else {
            return Ok(None);
        };
        let record = self.lock_record(&seq)?;
        if record.frontend != frontend.name() || record.ir_hash != ir_hash {
            return Err(corrupt(format!(
                "the compile.lock index entry for ({}, {ir_hash}) points at another record",
                frontend.name()
            )));
        }
        Ok(Some(record))
    }

    fn lock_record(&self, seq: &[u8]) -> Result<LockRecord, StoreError> {
        let bytes =
            self.get(&key(LOCK, seq))?.ok_or_else(|| corrupt("the lock index points at a missing record"))?;
        decode(&bytes, "lock record")
    }

    /// Every session, live or expired.
    pub fn sessions(&self) -> Result<Vec<SessionRecord>, StoreError> {
        self.settle()?;
        self.db.scan_prefix(SESSION).values().map(|v| decode(&v.map_err(unavailable)?, "session")).collect()
    }

    /// Number of ledger entries.
    pub fn ledger_len(&self) -> Result<usize, StoreError> {
        self.settle()?;
        Ok(self.keyed.ledger_len())
    }

    /// Writes a session and its id index into `batch`.
    fn put_session(batch: &mut Writes, s: &SessionRecord) {
        batch.insert(key(SESSION, s.token.as_bytes()), encode(s));
    }

    /// Writes a ledger entry into `batch`. An entry keeps the time it was first written: the
    /// ledger's age limit counts from the message's first handling, and the entry is filed
    /// under that time ([`keyed`]).
    /// The entry keeps its principal once it has one: a mark (published) names none.
    fn put_ledger(
        &self,
        batch: &mut Writes,
        id: &str,
        state: &LedgerState,
        (now, principal): (Millis, Option<&str>),
    ) -> Result<(), StoreError> {
        let (at, principal) = match self.get(&key(LEDGER, id.as_bytes()))? {
            Some(old) => {
                let old = decode::<LedgerEntry>(&old, "ledger entry")?;
                (old.at, principal.map(str::to_owned).or(old.principal))
            }
            None => (now, principal.map(str::to_owned)),
        };
        batch
            .insert(key(LEDGER, id.as_bytes()), encode(&LedgerEntry { state: state.clone(), at, principal }));
        Ok(())
    }

    /// The subject of the principal whose message `id` is, as its ledger entry names it.
    pub fn ledger_principal(&self, id: &str) -> Result<Option<String>, StoreError> {
        let entry = self.get(&key(LEDGER, id.as_bytes()))?;
        Ok(entry.map(|b| decode::<LedgerEntry>(&b, "ledger entry")).transpose()?.and_then(|e| e.principal))
    }

    /// Removes a ledger entry in `batch`'s writes.
    fn remove_ledger(batch: &mut Writes, id: &str) {
        batch.remove(key(LEDGER, id.as_bytes()));
    }

    /// Writes the next compile.lock record after `chain` into `batch`; returns the new head,
    /// sealed.
    fn put_lock_record(
        &self,
        batch: &mut Writes,
        chain: &Head,
        freeze: &crate::gateway::store::Freeze,
        at: Millis,
    ) -> Head {
        let record = self.sealer.next(
            chain.records,
            &chain.last_hash,
            &freeze.ir_hash,
            freeze.frontend.name(),
            &freeze.output,
            (crate::util::time::iso8601(at), freeze.principal.as_deref()),
        );
        let seq = chain.records.to_be_bytes();
        batch.insert(key(LOCK, &seq), encode(&record));
        batch.insert(lock_index_key(freeze.frontend, &freeze.ir_hash), &seq);
        self.sealer.head(chain.records + 1, &record.record_hash)
    }

    /// The stored head; every store of this layout has one (an empty chain's seals genesis).
    fn chain_head(&self) -> Result<Head, StoreError> {
        match self.get(HEAD_KEY)? {
            Some(bytes) => decode(&bytes, "compile.lock head"),
            None => Err(corrupt("the compile.lock head is missing: it was deleted")),
        }
    }

    /// Expires idle sessions, forgets old tombstones (freeing their ids) and idle profiles learnt
    /// from `//ping`, and trims the ledger to its age and size limits.
    pub fn sweep(&self, now: Millis, retention: &Retention) -> Result<Swept, StoreError> {
        self.writable()?;
        let _writer = self.write_lock()?;
        let mut swept = Swept::default();
        let mut batch = Writes::default();
        for record in self.sessions()? {
            let idle = now.saturating_sub(record.last_activity);
            if !record.expired && idle > retention.session_idle_ms {
                let expired = SessionRecord { expired: true, ..record };
                batch.insert(key(SESSION, expired.token.as_bytes()), encode(&expired));
                swept.sessions_expired += 1;
            } else if record.expired
                && idle > retention.session_idle_ms.saturating_add(retention.tombstone_ms)
            {
                batch.remove(key(SESSION, record.token.as_bytes()));
                swept.sessions_forgotten += 1;
            }
        }
        swept.profiles_forgotten = self.sweep_profiles(&mut batch, now, retention.session_idle_ms)?;
        let over = self.ledger_len()?.saturating_sub(retention.ledger_max_entries);
        for (i, entry) in self.keyed.ledger_by_time().enumerate() {
            let (at, id) = entry?;
            if i >= over && now.saturating_sub(at) <= retention.ledger_ttl_ms {
                break;
            }
            batch.remove(key(LEDGER, &id));
            swept.ledger_dropped += 1;
        }
        self.stage(batch)?;
        Ok(swept)
    }
}

impl Drop for SledStore {
    /// What was committed reaches the disk even if nobody flushed it (the last marks of a
    /// stopping relay, a command that commits and exits).
    fn drop(&mut self) {
        if self.read_only {
            return;
        }
        if let Err(e) = self.settle().and_then(|()| self.sync()) {
            tracing::warn!(error = %e, "Could not write the store's last changes.");
        }
    }
}

/// The key given is the key the chain was sealed with (or none for an unkeyed chain).
fn check_key(db: &sled::Db, sealer: &Sealer) -> Result<(), StoreError> {
    let stored = db.get(KEY_FINGERPRINT).map_err(unavailable)?;
    let stored = stored.as_deref().map(String::from_utf8_lossy);
    let given = sealer.fingerprint();
    match stored.as_deref() {
        Some(f) if f == given => Ok(()),
        Some("unkeyed") => Err(StoreError::Key(
            "this store's compile.lock is unkeyed, but a key was given; open it without store.hmac_key_env / --key-env".into(),
        )),
        Some(_) if !sealer.is_keyed() => Err(StoreError::Key(
            "this store's compile.lock is keyed, but no key was given; set store.hmac_key_env / --key-env to its key".into(),
        )),
        Some(_) => Err(StoreError::Key(
            "the key given is not the key this store's compile.lock was sealed with".into(),
        )),
        None => Err(corrupt("the compile.lock key fingerprint (meta:lock_key) is missing")),
    }
}

impl SledStore {
    /// Forgets profiles learnt from `//ping` that were not renewed within `idle_ms`, as idle
    /// sessions are: any client can leave one behind.
    fn sweep_profiles(&self, batch: &mut Writes, now: Millis, idle_ms: Millis) -> Result<usize, StoreError> {
        let mut forgotten = 0;
        for entry in self.db.scan_prefix(PROFILE) {
            let (profile_key, bytes) = entry.map_err(unavailable)?;
            let profile: AgentProfile = decode(&bytes, "profile")?;
            if profile.source == ProfileSource::Ping && now.saturating_sub(profile.updated) > idle_ms {
                batch.remove(profile_key);
                forgotten += 1;
            }
        }
        Ok(forgotten)
    }
}

impl Store for SledStore {
    fn session_by_token(&self, token: &str) -> Result<Option<SessionRecord>, StoreError> {
        self.get(&key(SESSION, token.as_bytes()))?.map(|b| decode(&b, "session")).transpose()
    }

    fn profile(&self, agent: &str) -> Result<Option<AgentProfile>, StoreError> {
        self.get(&key(PROFILE, agent.as_bytes()))?.map(|b| decode(&b, "profile")).transpose()
    }

    fn profile_count(&self) -> Result<usize, StoreError> {
        self.settle()?;
        Ok(self.db.scan_prefix(PROFILE).count())
    }

    fn frozen(&self, ir_hash: &str, frontend: Frontend) -> Result<Option<String>, StoreError> {
        Ok(self.indexed_record(frontend, ir_hash)?.map(|r| r.output))
    }

    fn ledger(&self, message_id: &str) -> Result<Option<LedgerState>, StoreError> {
        let entry = self.get(&key(LEDGER, message_id.as_bytes()))?;
        Ok(entry.map(|b| decode::<LedgerEntry>(&b, "ledger entry")).transpose()?.map(|e| e.state))
    }

    fn commit(&self, changes: &Changes, now: Millis) -> Result<Vec<Frozen>, StoreError> {
        if changes.is_empty() {
            return Ok(Vec::new());
        }
        self.writable()?;
        let _writer = self.write_lock()?;
        for (token, seen) in &changes.turns_seen {
            let now = self.session_by_token(token)?.map_or(0, |s| s.turns);
            if now != *seen {
                return Err(StoreError::Conflict(format!(
                    "the session of {token} moved from turn {seen} to {now}"
                )));
            }
        }
        let mut batch = Writes::default();
        for s in &changes.sessions {
            Self::put_session(&mut batch, s);
        }
        for (agent, profile) in &changes.profiles {
            batch.insert(key(PROFILE, agent.as_bytes()), encode(profile));
        }
        for (id, state) in &changes.ledger {
            self.put_ledger(&mut batch, id, state, (now, changes.principal.as_deref()))?;
        }
        for id in &changes.forgotten {
            Self::remove_ledger(&mut batch, id);
        }
        let follows_stream = self.chain_follows_stream.load(Ordering::Relaxed);
        let mut head: Option<Head> = None;
        let mut new_entries: Vec<(Vec<u8>, String)> = Vec::new();
        let mut frozen = Vec::with_capacity(changes.freezes.len());
        for f in &changes.freezes {
            let index_key = lock_index_key(f.frontend, &f.ir_hash);
            // Frozen earlier, or earlier in this same commit.
            let existing = match new_entries.iter().find(|(k, _)| *k == index_key) {
                Some((_, output)) => Some(output.clone()),
                None => self.indexed_record(f.frontend, &f.ir_hash)?.map(|r| r.output),
            };
            if let Some(output) = existing {
                let drift = output != f.output;
                frozen.push(Frozen { output, first: false, drift });
                continue;
            }
            if !follows_stream {
                let chain = match head.take() {
                    Some(h) => h,
                    None => self.chain_head()?,
                };
                head = Some(self.put_lock_record(&mut batch, &chain, f, now));
            }
            new_entries.push((index_key, f.output.clone()));
            frozen.push(Frozen { output: f.output.clone(), first: true, drift: false });
        }
        if let Some(head) = &head {
            batch.insert(HEAD_KEY, encode(head));
        }
        // A commit that only looked things up leaves nothing to write (or to flush).
        if !batch.is_empty() {
            self.stage(batch)?;
        }
        Ok(frozen)
    }

    fn flush(&self) -> Result<(), StoreError> {
        let target = self.written.load(Ordering::Acquire);
        if self.flushed.load(Ordering::Acquire) >= target {
            return Ok(());
        }
        self.append()?;
        self.sync()?;
        self.flushed.fetch_max(target, Ordering::AcqRel);
        if self.staged.checkpoint_due() != Checkpoint::NotDue {
            checkpoint(&self.staged, &self.keyed, &self.disk)?;
        }
        Ok(())
    }

    fn flush_async(&self) -> crate::gateway::store::FlushFuture<'_> {
        let target = self.written.load(Ordering::Acquire);
        if self.flushed.load(Ordering::Acquire) >= target {
            return Box::pin(std::future::ready(Ok(())));
        }
        // sled's own `flush_async` was seen to never complete under many concurrent callers;
        // a blocking flush on tokio's blocking pool, one at a time, does not.
        Box::pin(async move {
            let _turn = self.flush_turn.lock().await;
            if self.flushed.load(Ordering::Acquire) >= target {
                return Ok(());
            }
            let covers = self.written.load(Ordering::Acquire);
            self.append()?;
            let (db, disk) = (self.db.clone(), self.disk.clone());
            tokio::task::spawn_blocking(move || {
                let _disk = one_at_a_time(&disk);
                db.flush()
            })
            .await
            .map_err(unavailable)?
            .map_err(unavailable)?;
            self.flushed.fetch_max(covers, Ordering::AcqRel);
            // Behind, the flush waits for the checkpoint: memory must not keep growing.
            let due = self.staged.checkpoint_due();
            if let Some(checkpoint) = self.start_checkpoint(due)
                && due == Checkpoint::Behind
            {
                checkpoint.await.map_err(unavailable)??;
            }
            Ok(())
        })
    }
}

/// Writes what the journal holds into the keyed records and trims it ([`staged`]).
fn checkpoint(staged: &Staged, keyed: &Keyed, disk: &Mutex<()>) -> Result<usize, StoreError> {
    let put = |key: &[u8], value: Option<&[u8]>| {
        let _disk = one_at_a_time(disk);
        match value {
            Some(value) => keyed.db().insert(key, value).map(drop),
            None => keyed.db().remove(key).map(drop),
        }
        .map_err(unavailable)
    };
    staged.checkpoint(
        |writes| keyed.apply(writes.iter().map(|(k, v)| (k.as_ref(), v.as_deref())), put),
        |record| put(record, None),
    )
}

/// Records a door keeps beside the core's state (the A2A door's tasks), in a sled tree of
/// their own. They are written straight through, one insert and one flush each: each is one
/// client's request, not the relay's traffic, and it is read back by that client. The tree
/// is outside the journal, the layout's keys and the cluster changelog.
#[derive(Clone)]
pub struct KeptRecords {
    tree: sled::Tree,
    disk: Arc<Mutex<()>>,
}

impl KeptRecords {
    /// Stores `value` under `key`, durably before it returns.
    pub fn put(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        let _disk = one_at_a_time(&self.disk);
        self.tree.insert(key, value).map_err(unavailable)?;
        self.tree.flush().map(drop).map_err(unavailable)
    }

    pub fn remove(&self, key: &str) -> Result<(), StoreError> {
        let _disk = one_at_a_time(&self.disk);
        self.tree.remove(key).map(drop).map_err(unavailable)
    }

    /// Every record, in key order.
    pub fn all(&self) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        self.tree
            .iter()
            .map(|entry| {
                let (key, value) = entry.map_err(unavailable)?;
                Ok((String::from_utf8_lossy(&key).into_owned(), value.to_vec()))
            })
            .collect()
    }
}

impl SledStore {
    /// The kept records named `name` (a tree of their own).
    pub fn kept(&self, name: &str) -> Result<KeptRecords, StoreError> {
        let tree = self.db.open_tree(format!("kept:{name}")).map_err(unavailable)?;
        Ok(KeptRecords { tree, disk: self.disk.clone() })
    }
}

/// The turn of one writer to sled ([`SledStore`]'s `disk`).
fn one_at_a_time(disk: &Mutex<()>) -> std::sync::MutexGuard<'_, ()> {
    disk.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
