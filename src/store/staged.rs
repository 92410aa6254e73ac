//! The store's state in memory above sled's keyed records: commits not yet in the journal, and
//! journaled ones not yet checkpointed.
//!
//! A message is acknowledged only after its state is durable, and making it durable is the
//! flush's job. So a commit lands here, where reads look before they look in sled (a message
//! sees the turn of the one before it in the same window). A flush appends everything staged
//! since the last one to the journal as one record ([`super::journal`]) and syncs: sled takes
//! one key per window. A checkpoint, in the background, writes what the journal holds into the
//! keyed records, each key once however many messages wrote it, and then trims the journal.
//!
//! Writes move down the layers and stay readable in each until the next one holds them:
//! staged, appending (a flush in progress), journaled, checkpointing, sled.
//!
//! A checkpoint writes its keys, and then removes the journal records, one at a time rather than
//! as one sled batch: a batch holds sled's global write lock for as long as it takes (tens of
//! milliseconds for a busy second), and every journal append would wait behind it. A crash
//! mid-checkpoint loses nothing: the journal records are removed only after every key is
//! written, oldest first, and replaying the ones left writes every key they touched to the
//! value it already has.

use super::journal::{self, WriteMap};
use sled::IVec;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// One commit's writes, shaped like `sled::Batch`: a value, or `None` for a removal. The last
/// write of a key wins.
#[derive(Default)]
pub(super) struct Writes(WriteMap);

impl Writes {
    pub(super) fn insert(&mut self, key: impl Into<IVec>, value: impl Into<IVec>) {
        self.0.insert(key.into(), Some(value.into()));
    }

    pub(super) fn remove(&mut self, key: impl Into<IVec>) {
        self.0.insert(key.into(), None);
    }

    pub(super) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Staged keys beyond which a commit appends them to the journal at once, so that a writer
/// that never flushes (the marks writer between windows) cannot grow them without bound.
pub(super) const LIMIT: usize = 8192;

/// A checkpoint is due when the journal holds this many distinct keys...
const CHECKPOINT_KEYS: usize = 65_536;
/// ...or its oldest record is this old. Longer saves the writes of keys touched again (a busy
/// conversation's session), but lengthens the replay after a crash and the memory held.
const CHECKPOINT_EVERY: Duration = Duration::from_secs(2);
/// Journaled keys beyond which a flush waits for a checkpoint instead of leaving it to the
/// background: the bound on what a checkpoint that cannot keep up lets memory hold.
const CHECKPOINT_BEHIND: usize = 4 * CHECKPOINT_KEYS;

/// The journal records whose writes are journaled, not yet checkpointed.
#[derive(Clone, Copy)]
struct Records {
    first: u64,
    last: u64,
    oldest_at: Instant,
}

#[derive(Default)]
struct Maps {
    staged: WriteMap,
    /// Taken out of `staged` by an append in progress.
    appending: Option<Arc<WriteMap>>,
    journaled: WriteMap,
    records: Option<Records>,
    /// Taken out of `journaled` by a checkpoint in progress.
    checkpointing: Option<Arc<WriteMap>>,
}

/// Writes committed but not yet in sled's keyed records.
#[derive(Default)]
pub(super) struct Staged {
    maps: Mutex<Maps>,
    /// One append at a time, so that journal records follow commit order; holds the next
    /// record's sequence number.
    appends: Mutex<u64>,
    /// One checkpoint at a time.
    checkpoints: Mutex<()>,
}

/// What a read found in memory.
pub(super) enum Found {
    /// In memory: this value, or `None` if the key was removed.
    Staged(Option<IVec>),
    /// Not in memory: sled's keyed records hold the answer.
    Sled,
}

/// Whether a checkpoint should run now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Checkpoint {
    NotDue,
    /// Due: run it in the background.
    Due,
    /// So far behind that the caller should wait for it.
    Behind,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // The maps are only ever extended or swapped whole, so a panic elsewhere cannot leave them
    // half-changed.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Puts writes taken for a step that failed back under the newer ones made since.
fn restore(into: &mut WriteMap, taken: Arc<WriteMap>) {
    let newer = std::mem::take(into);
    *into = Arc::unwrap_or_clone(taken);
    into.extend(newer);
}

impl Staged {
    /// The value of `key` in memory, newest first.
    pub(super) fn get(&self, key: &[u8]) -> Found {
        let maps = lock(&self.maps);
        let layers = [
            Some(&maps.staged),
            maps.appending.as_deref(),
            Some(&maps.journaled),
            maps.checkpointing.as_deref(),
        ];
        for layer in layers.into_iter().flatten() {
            if let Some(value) = layer.get(key) {
                return Found::Staged(value.clone());
            }
        }
        Found::Sled
    }

    /// Stages one commit's writes; returns the number of keys now staged.
    pub(super) fn stage(&self, writes: Writes) -> usize {
        let mut maps = lock(&self.maps);
        maps.staged.extend(writes.0);
        maps.staged.len()
    }

    /// Appends everything staged as one journal record, which `write` puts in sled (key, record).
    /// Reads keep finding the writes throughout; if `write` fails they are staged again, under
    /// newer ones.
    pub(super) fn append<E>(&self, write: impl FnOnce(Vec<u8>, Vec<u8>) -> Result<(), E>) -> Result<(), E> {
        let mut next = lock(&self.appends);
        let taken = {
            let mut maps = lock(&self.maps);
            if maps.staged.is_empty() {
                return Ok(());
            }
            let taken = Arc::new(std::mem::take(&mut maps.staged));
            maps.appending = Some(taken.clone());
            taken
        };
        let result = write(journal::key(*next), journal::encode(&taken));
        let mut maps = lock(&self.maps);
        maps.appending = None;
        match result {
            Ok(()) => {
                maps.journaled.extend(Arc::unwrap_or_clone(taken));
                let seq = *next;
                maps.records = Some(match maps.records {
                    Some(records) => Records { last: seq, ..records },
                    None => Records { first: seq, last: seq, oldest_at: Instant::now() },
                });
                *next += 1;
                Ok(())
            }
            Err(e) => {
                restore(&mut maps.staged, taken);
                Err(e)
            }
        }
    }

    /// Whether the journaled writes call for a checkpoint.
    pub(super) fn checkpoint_due(&self) -> Checkpoint {
        let maps = lock(&self.maps);
        let Some(records) = maps.records else { return Checkpoint::NotDue };
        let keys = maps.journaled.len();
        if keys >= CHECKPOINT_BEHIND {
            Checkpoint::Behind
        } else if keys >= CHECKPOINT_KEYS || records.oldest_at.elapsed() >= CHECKPOINT_EVERY {
            Checkpoint::Due
        } else {
            Checkpoint::NotDue
        }
    }

    /// Writes everything journaled into sled's keyed records through `apply` (which is handed
    /// the writes, a value or `None` for a removal, each key once), then removes the journal
    /// records that held it through `trim`, oldest first. Returns the number of keys written.
    /// If a step fails, the writes stay journaled for the next one.
    pub(super) fn checkpoint<E>(
        &self,
        apply: impl FnOnce(&WriteMap) -> Result<(), E>,
        mut trim: impl FnMut(&[u8]) -> Result<(), E>,
    ) -> Result<usize, E> {
        let _turn = lock(&self.checkpoints);
        let (taken, records) = {
            let mut maps = lock(&self.maps);
            let Some(records) = maps.records.take() else { return Ok(0) };
            let taken = Arc::new(std::mem::take(&mut maps.journaled));
            maps.checkpointing = Some(taken.clone());
            (taken, records)
        };
        // Removed one by one, oldest first: a crash part-way leaves the newer records, and
        // replaying those over this checkpoint writes the same values again.
        let written = apply(&taken)
            .and_then(|()| (records.first..=records.last).try_for_each(|seq| trim(&journal::key(seq))));
        let mut maps = lock(&self.maps);
        maps.checkpointing = None;
        match written {
            Ok(()) => Ok(taken.len()),
            Err(e) => {
                restore(&mut maps.journaled, taken);
                maps.records = Some(match maps.records {
                    Some(newer) => Records { last: newer.last, ..records },
                    None => records,
                });
                Err(e)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn writes(pairs: &[(&str, Option<&str>)]) -> Writes {
        let mut writes = Writes::default();
        for (key, value) in pairs {
            match value {
                Some(value) => writes.insert(key.as_bytes(), value.as_bytes()),
                None => writes.remove(key.as_bytes()),
            }
        }
        writes
    }

    fn in_memory(staged: &Staged, key: &str) -> Option<Option<String>> {
        match staged.get(key.as_bytes()) {
            Found::Staged(v) => Some(v.map(|v| String::from_utf8_lossy(&v).into_owned())),
            Found::Sled => None,
        }
    }

    fn append(staged: &Staged, db: &sled::Db) {
        staged.append(|key, record| db.insert(key, record).map(drop)).unwrap();
    }

    fn checkpoint(staged: &Staged, db: &sled::Db) -> usize {
        staged
            .checkpoint(
                |writes| {
                    writes.iter().try_for_each(|(key, value)| match value {
                        Some(value) => db.insert(key, value).map(drop),
                        None => db.remove(key).map(drop),
                    })
                },
                |record| db.remove(record).map(drop),
            )
            .unwrap()
    }

    #[test]
    fn the_newest_write_of_a_key_is_read_and_checkpointed_once() {
        let staged = Staged::default();
        let db = sled::Config::new().temporary(true).open().unwrap();
        staged.stage(writes(&[("a", Some("1")), ("b", Some("x"))]));
        append(&staged, &db);
        staged.stage(writes(&[("a", Some("2")), ("b", None)]));
        assert_eq!(in_memory(&staged, "a"), Some(Some("2".into())), "staged over journaled");
        append(&staged, &db);
        assert_eq!(in_memory(&staged, "a"), Some(Some("2".into())));
        assert_eq!(in_memory(&staged, "b"), Some(None));
        assert_eq!(in_memory(&staged, "c"), None);
        assert_eq!(db.scan_prefix(journal::PREFIX).count(), 2, "one journal record per append");
        assert_eq!(db.get("a").unwrap(), None, "the keyed records wait for the checkpoint");

        assert_eq!(checkpoint(&staged, &db), 2, "each key once");
        assert_eq!(db.get("a").unwrap().as_deref(), Some(&b"2"[..]));
        assert_eq!(db.get("b").unwrap(), None);
        assert_eq!(db.scan_prefix(journal::PREFIX).count(), 0, "the journal is trimmed behind it");
        assert_eq!(in_memory(&staged, "a"), None, "checkpointed writes are read from sled");
        assert_eq!(checkpoint(&staged, &db), 0, "nothing left to checkpoint");
    }

    #[test]
    fn writes_stay_readable_through_each_step_and_come_back_if_it_fails() {
        let staged = Staged::default();
        staged.stage(writes(&[("a", Some("1"))]));
        let failed = staged.append(|_, _| {
            assert_eq!(in_memory(&staged, "a"), Some(Some("1".into())), "readable while appending");
            staged.stage(writes(&[("a", Some("2"))]));
            Err("disk full")
        });
        assert_eq!(failed, Err("disk full"));
        assert_eq!(in_memory(&staged, "a"), Some(Some("2".into())), "newer writes stay on top");

        staged.append(|_, _| Ok::<_, &str>(())).unwrap();
        let failed = staged.checkpoint(
            |_| {
                assert_eq!(in_memory(&staged, "a"), Some(Some("2".into())), "readable while checkpointing");
                Err("disk full")
            },
            |_| Ok(()),
        );
        assert_eq!(failed, Err("disk full"));
        assert_eq!(in_memory(&staged, "a"), Some(Some("2".into())));
        assert_eq!(staged.checkpoint(|_| Ok::<_, &str>(()), |_| Ok(())), Ok(1), "still journaled");
    }
}
