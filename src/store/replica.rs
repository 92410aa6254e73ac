//! The store as one replica of a cluster's state. A cluster keeps each partition's sessions in
//! a changelog (a RabbitMQ stream) and the compile.lock in one cluster-wide stream; this module
//! applies what those streams hold to the local sled view, and remembers the offset it has
//! applied so that the next replay starts there.
//!
//! Changes are idempotent upserts of whole records, so applying a change again, or applying
//! changes this replica made itself, leaves the same state: replay never needs to know which
//! records are already here. A record never replaces a later one of the same session (more
//! turns): a message handled again after later turns were appended sends the session as it
//! left it, which is older than what the replicas hold.

use super::staged::Writes;
use super::{PROFILE, SESSION, SledStore, encode, key};
use crate::gateway::session::Partition;
use crate::gateway::store::{AgentProfile, Freeze, LedgerState, Millis, SessionRecord, Store, StoreError};
use crate::silp::Frontend;
use serde::{Deserialize, Serialize};
use std::sync::atomic::Ordering;

const APPLIED: &[u8] = b"cluster:applied:";
const LOCK_APPLIED: &[u8] = b"cluster:lock_applied";
const SERVED: &[u8] = b"cluster:served:";

/// One entry of a partition's changelog.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PartitionChange {
    /// A conversation's session as it stands after a message, and that message's ledger
    /// state (which carries the turn it counted, for a redelivery).
    Session { session: SessionRecord, message: Option<(String, LedgerState)> },
    /// Every session of the partition: the state to reset to; with the ledger entries of the
    /// messages whose turns it holds and whose own entries come after it.
    Snapshot {
        sessions: Vec<SessionRecord>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        pending: Vec<(String, LedgerState)>,
    },
    /// Messages whose publishes were all confirmed after their own entries went out: a replica
    /// that serves the partition later acknowledges them, sent again, without publishing.
    Published { ids: Vec<String> },
    /// A message refused for good after it counted a turn: its conversation's session as it
    /// was put back, and its ledger entry dropped ([`crate::gateway::Gateway::take_back`]).
    TakenBack { session: SessionRecord, message_id: String },
}

/// A compile.lock entry proposed to the cluster; the first proposal of an (IR hash, frontend)
/// in the lock stream becomes the record, with the proposer's time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct LockProposal {
    pub ir_hash: String,
    pub frontend: String,
    pub output: String,
    pub at: Millis,
    /// The instance that proposed it.
    pub by: String,
    /// The subject of the principal whose message froze it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub principal: Option<String>,
}

impl LockProposal {
    pub(crate) fn new(freeze: &Freeze, at: Millis, by: &str) -> Self {
        LockProposal {
            ir_hash: freeze.ir_hash.clone(),
            frontend: freeze.frontend.name().to_owned(),
            output: freeze.output.clone(),
            at,
            by: by.to_owned(),
            principal: freeze.principal.clone(),
        }
    }
}

/// An agent profile learnt from a `//ping`, shared with the cluster: every instance writes it
/// whole over what it held for the agent, in the lock stream's order, so that the last one
/// learnt anywhere is the one every instance holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ProfileShare {
    pub agent: String,
    pub profile: AgentProfile,
    /// The instance that learnt it.
    pub by: String,
}

/// Whether `record` may replace `held`, the record of the same conversation: it belongs to a
/// later session (the held one expired and was forgotten where `record` was made), or it has
/// counted at least as many turns.
fn supersedes(record: &SessionRecord, held: &SessionRecord) -> bool {
    record.started != held.started || record.turns >= held.turns
}

fn applied_key(partition: u16) -> Vec<u8> {
    key(APPLIED, &partition.to_be_bytes())
}

fn read_offset(bytes: Option<sled::IVec>) -> Result<Option<u64>, StoreError> {
    bytes
        .map(|b| {
            <[u8; 8]>::try_from(b.as_ref())
                .map(u64::from_be_bytes)
                .map_err(|_| super::corrupt("a stream offset is not 8 bytes"))
        })
        .transpose()
}

impl SledStore {
    /// From now on the compile.lock chain grows only through [`SledStore::follow_lock`]:
    /// commits answer with what the chain holds and leave new entries to the lock stream.
    pub(crate) fn follow_cluster_lock(&self) {
        self.chain_follows_stream.store(true, Ordering::Relaxed);
    }

    /// The last offset of `partition`'s changelog applied here, if any.
    pub(crate) fn partition_offset(&self, partition: u16) -> Result<Option<u64>, StoreError> {
        read_offset(self.get(&applied_key(partition))?)
    }

    /// The last offset of the lock stream applied here, if any.
    pub(crate) fn lock_offset(&self) -> Result<Option<u64>, StoreError> {
        read_offset(self.get(LOCK_APPLIED)?)
    }

    /// The sessions of one partition: those that name it (a session of the layout before
    /// sessions named their partition: those whose id lies in the partition's slice, the rule
    /// ids were handed out by then).
    pub(crate) fn partition_sessions(&self, partition: Partition) -> Result<Vec<SessionRecord>, StoreError> {
        let of_partition =
            |s: &SessionRecord| s.partition.map_or_else(|| partition.holds(&s.id), |p| p == partition.index);
        Ok(self.sessions()?.into_iter().filter(of_partition).collect())
    }

    /// Applies one changelog entry of `partition` and, when given, records `offset` as applied.
    pub fn apply_change(
        &self,
        partition: Partition,
        change: &PartitionChange,
        offset: Option<u64>,
        now: Millis,
    ) -> Result<(), StoreError> {
        self.writable()?;
        let _writer = self.write_lock()?;
        let mut batch = Writes::default();
        match change {
            PartitionChange::Session { session, message } => {
                self.replace_session(&mut batch, session)?;
                // The ledger entry applies either way: the message's turn is in the newer
                // record as in its own.
                if let Some((id, state)) = message {
                    self.put_ledger(&mut batch, id, state, (now, None))?;
                }
            }
            PartitionChange::Snapshot { sessions, pending } => {
                for (id, state) in pending {
                    self.put_ledger(&mut batch, id, state, (now, None))?;
                }
                for stale in self.partition_sessions(partition)? {
                    if !sessions.iter().any(|s| s.token == stale.token) {
                        batch.remove(key(SESSION, stale.token.as_bytes()));
                    }
                }
                for session in sessions {
                    self.replace_session(&mut batch, session)?;
                }
            }
            PartitionChange::Published { ids } => {
                for id in ids {
                    self.put_ledger(&mut batch, id, &LedgerState::Published, (now, None))?;
                }
            }
            PartitionChange::TakenBack { session, message_id } => {
                // Only over the turn taken back: a replica that never had it has nothing to undo.
                let held = self.session_by_token(&session.token)?;
                if held.is_some_and(|held| held.id == session.id && held.turns == session.turns + 1) {
                    Self::put_session(&mut batch, session);
                }
                Self::remove_ledger(&mut batch, message_id);
            }
        }
        if let Some(offset) = offset {
            batch.insert(applied_key(partition.index), &offset.to_be_bytes());
        }
        self.stage(batch)
    }

    /// Records whether the instance on this store serves `partition` now: what
    /// `silpgate sessions list` tells apart, the sessions served here from replicas.
    pub(crate) fn set_served(&self, partition: u16, served: bool) -> Result<(), StoreError> {
        self.writable()?;
        let _writer = self.write_lock()?;
        let mut batch = Writes::default();
        let key = key(SERVED, &partition.to_be_bytes());
        if served {
            batch.insert(key, &[]);
        } else {
            batch.remove(key);
        }
        self.stage(batch)
    }

    /// The partitions the instance on this store served when it last wrote to it.
    pub(crate) fn served(&self) -> Result<Vec<u16>, StoreError> {
        self.settle()?;
        self.db
            .scan_prefix(SERVED)
            .keys()
            .map(|k| {
                let k = k.map_err(super::unavailable)?;
                <[u8; 2]>::try_from(&k[SERVED.len()..])
                    .map(u16::from_be_bytes)
                    .map_err(|_| super::corrupt("a served partition is not 2 bytes"))
            })
            .collect()
    }

    /// Records `offset` of `partition`'s changelog as applied.
    pub(crate) fn set_partition_offset(&self, partition: u16, offset: u64) -> Result<(), StoreError> {
        self.writable()?;
        let _writer = self.write_lock()?;
        let mut batch = Writes::default();
        batch.insert(applied_key(partition), &offset.to_be_bytes());
        self.stage(batch)
    }

    /// Writes `session` over what this replica holds for its conversation, unless that is a
    /// later record of the same session: the changelog is the truth, in the order of turns.
    fn replace_session(&self, batch: &mut Writes, session: &SessionRecord) -> Result<(), StoreError> {
        let held = self.session_by_token(&session.token)?;
        if held.is_none_or(|held| supersedes(session, &held)) {
            Self::put_session(batch, session);
        }
        Ok(())
    }

    /// Applies the lock stream's entry at `offset`: the first proposal of an (IR hash,
    /// frontend) becomes the next chain record; later ones are dropped. Returns whether the
    /// chain grew.
    pub(crate) fn follow_lock(&self, offset: u64, proposal: &LockProposal) -> Result<bool, StoreError> {
        let frontend: Frontend =
            proposal.frontend.parse().map_err(|_| super::corrupt("a lock proposal names no frontend"))?;
        self.writable()?;
        let _writer = self.write_lock()?;
        let mut batch = Writes::default();
        let index = super::lock_index_key(frontend, &proposal.ir_hash);
        let fresh = self.get(&index)?.is_none();
        if fresh {
            let chain = self.chain_head()?;
            let freeze = Freeze {
                ir_hash: proposal.ir_hash.clone(),
                frontend,
                output: proposal.output.clone(),
                principal: proposal.principal.clone(),
            };
            let head = self.put_lock_record(&mut batch, &chain, &freeze, proposal.at);
            batch.insert(super::HEAD_KEY, encode(&head));
        }
        batch.insert(LOCK_APPLIED, &offset.to_be_bytes());
        self.stage(batch)?;
        Ok(fresh)
    }

    /// Applies the lock stream's entry at `offset` that shares an agent profile: the profile
    /// replaces whatever this replica held for the agent.
    pub(crate) fn follow_profile(&self, offset: u64, share: &ProfileShare) -> Result<(), StoreError> {
        self.writable()?;
        let _writer = self.write_lock()?;
        let mut batch = Writes::default();
        batch.insert(key(PROFILE, share.agent.as_bytes()), encode(&share.profile));
        batch.insert(LOCK_APPLIED, &offset.to_be_bytes());
        self.stage(batch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A store in a directory of its own, removed when the store is dropped.
    struct Scratch {
        store: Option<SledStore>,
        dir: std::path::PathBuf,
    }

    impl std::ops::Deref for Scratch {
        type Target = SledStore;
        fn deref(&self) -> &SledStore {
            self.store.as_ref().expect("open until dropped")
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            drop(self.store.take());
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    fn store(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("silpgate-replica-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        Scratch { store: Some(SledStore::open(&dir, None).unwrap()), dir }
    }

    fn session(id: &str, token: &str, turns: u64) -> SessionRecord {
        SessionRecord { turns, ..SessionRecord::begin(id.into(), token, 10, 1, None) }
    }

    /// A session that names its partition (the current layout).
    fn session_of(partition: u16, id: &str, token: &str, turns: u64) -> SessionRecord {
        SessionRecord { partition: Some(partition), ..session(id, token, turns) }
    }

    const P0: Partition = Partition { index: 0, count: 2 };

    #[test]
    fn a_change_replaces_what_the_replica_held_for_its_conversation() {
        let store = store("change");
        let stale = PartitionChange::Session { session: session_of(0, "aa", "conv", 3), message: None };
        store.apply_change(P0, &stale, Some(0), 1).unwrap();
        // Another conversation with the same id is another session: ids are scoped by token.
        let other = PartitionChange::Session { session: session_of(0, "aa", "other", 1), message: None };
        store.apply_change(P0, &other, Some(1), 1).unwrap();
        let pending = LedgerState::Pending { turn: None, session: None };
        let change = PartitionChange::Session {
            session: session_of(0, "aa", "conv", 7),
            message: Some(("m-1".into(), pending.clone())),
        };
        store.apply_change(P0, &change, Some(2), 1).unwrap();
        assert_eq!(store.session_by_token("conv").unwrap().unwrap().turns, 7);
        assert_eq!(store.session_by_token("other").unwrap().unwrap().turns, 1);
        assert_eq!(store.ledger("m-1").unwrap(), Some(pending));
        assert_eq!(store.partition_offset(0).unwrap(), Some(2));
        // Applying the same entry again changes nothing.
        store.apply_change(P0, &change, Some(2), 1).unwrap();
        assert_eq!(store.sessions().unwrap().len(), 2);
    }

    #[test]
    fn an_older_record_of_the_same_session_never_replaces_a_later_one() {
        let store = store("older");
        let change = |session: SessionRecord, id: &str| PartitionChange::Session {
            session,
            message: Some((id.into(), LedgerState::Pending { turn: None, session: None })),
        };
        store.apply_change(P0, &change(session_of(0, "aa", "conv", 5), "m-5"), Some(0), 1).unwrap();
        // m-4 handled again after turn 5 was appended: it sends the session as it left it.
        store.apply_change(P0, &change(session_of(0, "aa", "conv", 4), "m-4"), Some(1), 1).unwrap();
        assert_eq!(store.session_by_token("conv").unwrap().unwrap().turns, 5);
        assert!(store.ledger("m-4").unwrap().is_some(), "its ledger entry still applies");
        // A later session of the conversation (the first expired and was forgotten) replaces it.
        let later = SessionRecord { started: 9, ..session_of(0, "aa", "conv", 1) };
        store.apply_change(P0, &change(later.clone(), "m-6"), Some(2), 1).unwrap();
        assert_eq!(store.session_by_token("conv").unwrap(), Some(later));
    }

    #[test]
    fn a_snapshot_resets_its_partition_and_leaves_the_others_alone() {
        let store = store("snapshot");
        let p1 = Partition { index: 1, count: 2 };
        for (id, token) in [("aa", "t0"), ("ac", "t2")] {
            let change = PartitionChange::Session { session: session(id, token, 1), message: None };
            store.apply_change(P0, &change, None, 1).unwrap();
        }
        let other = PartitionChange::Session { session: session("ab", "t1", 1), message: None };
        store.apply_change(p1, &other, None, 1).unwrap();
        // Sessions that name their partition belong to it whatever their id.
        let named = PartitionChange::Session { session: session_of(0, "ab", "t3", 1), message: None };
        store.apply_change(P0, &named, None, 1).unwrap();
        let elsewhere = PartitionChange::Session { session: session_of(1, "aa", "t4", 1), message: None };
        store.apply_change(p1, &elsewhere, None, 1).unwrap();
        let pending = LedgerState::Pending { turn: None, session: None };
        let snapshot = PartitionChange::Snapshot {
            sessions: vec![session("ac", "t2", 5)],
            pending: vec![("m-5".into(), pending.clone())],
        };
        store.apply_change(P0, &snapshot, Some(9), 1).unwrap();
        assert_eq!(
            store.ledger("m-5").unwrap(),
            Some(pending),
            "a turn it holds comes with its ledger entry"
        );
        assert_eq!(store.session_by_token("t0").unwrap(), None, "not in the snapshot: gone");
        assert_eq!(
            store.session_by_token("t3").unwrap(),
            None,
            "named partition 0, not in the snapshot: gone"
        );
        assert_eq!(store.session_by_token("t2").unwrap().unwrap().turns, 5);
        assert!(store.session_by_token("t1").unwrap().is_some(), "partition 1 untouched");
        assert!(store.session_by_token("t4").unwrap().is_some(), "partition 1 untouched, whatever its id");
        assert_eq!(store.partition_sessions(P0).unwrap().len(), 1);
    }

    #[test]
    fn the_first_proposal_of_an_entry_becomes_the_record_and_the_chain_verifies() {
        let store = store("lock");
        store.follow_cluster_lock();
        let proposal = |output: &str, by: &str| LockProposal {
            ir_hash: "sha256:00".into(),
            frontend: "code".into(),
            output: output.into(),
            at: 1_700_000_000_000,
            by: by.into(),
            principal: None,
        };
        assert!(store.follow_lock(0, &proposal("first", "a")).unwrap());
        assert!(!store.follow_lock(1, &proposal("second", "b")).unwrap());
        assert_eq!(store.frozen("sha256:00", Frontend::Code).unwrap().as_deref(), Some("first"));
        assert_eq!(store.lock_offset().unwrap(), Some(1));
        assert_eq!(store.verify_lock().unwrap(), 1);
    }

    #[test]
    fn a_shared_profile_replaces_what_the_replica_held_and_advances_the_lock_offset() {
        use crate::gateway::store::ProfileSource;
        let store = store("profile");
        store.follow_cluster_lock();
        let share = |frontends: Vec<Frontend>, updated: Millis| ProfileShare {
            agent: "planner".into(),
            profile: AgentProfile { frontends, source: ProfileSource::Ping, updated, tokenizer: None },
            by: "a".into(),
        };
        store.follow_profile(3, &share(vec![Frontend::Json], 1)).unwrap();
        store.follow_profile(4, &share(vec![Frontend::Code, Frontend::Json], 2)).unwrap();
        let held = store.profile("planner").unwrap().unwrap();
        assert_eq!((held.frontends, held.updated), (vec![Frontend::Code, Frontend::Json], 2));
        assert_eq!(store.lock_offset().unwrap(), Some(4));
        assert_eq!(store.verify_lock().unwrap(), 0, "a profile is no chain record");
    }
}
