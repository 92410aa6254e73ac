//! Commits staged in memory until the next flush, so that sled takes one batch per flush
//! instead of one per message.
//!
//! sled's cost is per batch as well as per key, and a message is acknowledged only after a
//! flush anyway: handing sled each message's writes the moment they are committed buys no
//! durability. So a commit lands here, reads look here before they look in sled (a message
//! sees the uncommitted turn of the one before it in the same window), and a flush hands
//! everything staged to sled as one batch right before it syncs. Keys written by several
//! messages between two flushes (a conversation's session record, the compile.lock head) reach
//! sled once.
//!
//! What is staged is handed over while readers keep seeing it: it moves to an `applying` map
//! that reads consult until sled holds it.

use sled::IVec;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

/// One commit's writes, shaped like `sled::Batch`: a value, or `None` for a removal. The last
/// write of a key wins.
#[derive(Default)]
pub(super) struct Writes(BTreeMap<IVec, Option<IVec>>);

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

/// Staged keys beyond which a commit hands them to sled at once, so that a writer that never
/// flushes (the marks writer between windows) cannot grow them without bound.
pub(super) const LIMIT: usize = 8192;

#[derive(Default)]
struct Maps {
    staged: BTreeMap<IVec, Option<IVec>>,
    /// Taken out of `staged` by a settle in progress; gone once sled holds it.
    applying: Option<Arc<BTreeMap<IVec, Option<IVec>>>>,
}

/// Writes committed but not yet in sled.
#[derive(Default)]
pub(super) struct Staged {
    maps: Mutex<Maps>,
    /// One settle at a time, so that sled receives the staged batches in commit order.
    settling: Mutex<()>,
}

/// What a read found among the staged writes.
pub(super) enum Found {
    /// Staged: this value, or `None` if the key was removed.
    Staged(Option<IVec>),
    /// Not staged: sled holds the answer.
    Sled,
}

impl Staged {
    fn maps(&self) -> MutexGuard<'_, Maps> {
        // The maps are only ever extended or swapped whole, so a panic elsewhere cannot leave
        // them half-changed.
        self.maps.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The staged value of `key`, newest first.
    pub(super) fn get(&self, key: &[u8]) -> Found {
        let maps = self.maps();
        if let Some(value) = maps.staged.get(key) {
            return Found::Staged(value.clone());
        }
        if let Some(value) = maps.applying.as_ref().and_then(|a| a.get(key)) {
            return Found::Staged(value.clone());
        }
        Found::Sled
    }

    /// Stages one commit's writes; returns the number of keys now staged.
    pub(super) fn stage(&self, writes: Writes) -> usize {
        let mut maps = self.maps();
        maps.staged.extend(writes.0);
        maps.staged.len()
    }

    /// Hands every staged write to `apply` (sled) as one batch. Reads keep finding the writes
    /// until `apply` has returned; if it fails they are staged again, under newer ones.
    pub(super) fn settle<E>(&self, apply: impl FnOnce(sled::Batch) -> Result<(), E>) -> Result<(), E> {
        let _turn = self.settling.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let taken = {
            let mut maps = self.maps();
            if maps.staged.is_empty() {
                return Ok(());
            }
            let taken = Arc::new(std::mem::take(&mut maps.staged));
            maps.applying = Some(taken.clone());
            taken
        };
        let mut batch = sled::Batch::default();
        for (key, value) in taken.iter() {
            match value {
                Some(value) => batch.insert(key.clone(), value.clone()),
                None => batch.remove(key.clone()),
            }
        }
        let result = apply(batch);
        let mut maps = self.maps();
        maps.applying = None;
        if result.is_err() {
            let newer = std::mem::take(&mut maps.staged);
            maps.staged = Arc::unwrap_or_clone(taken);
            maps.staged.extend(newer);
        }
        result
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

    fn staged_value(staged: &Staged, key: &str) -> Option<Option<String>> {
        match staged.get(key.as_bytes()) {
            Found::Staged(v) => Some(v.map(|v| String::from_utf8_lossy(&v).into_owned())),
            Found::Sled => None,
        }
    }

    #[test]
    fn the_newest_write_of_a_key_is_read_and_settled_once() {
        let staged = Staged::default();
        staged.stage(writes(&[("a", Some("1")), ("b", Some("x"))]));
        staged.stage(writes(&[("a", Some("2")), ("b", None)]));
        assert_eq!(staged_value(&staged, "a"), Some(Some("2".into())));
        assert_eq!(staged_value(&staged, "b"), Some(None));
        assert_eq!(staged_value(&staged, "c"), None);

        let db = sled::Config::new().temporary(true).open().unwrap();
        staged.settle(|batch| db.apply_batch(batch)).unwrap();
        assert_eq!(db.get("a").unwrap().as_deref(), Some(&b"2"[..]));
        assert_eq!(db.get("b").unwrap(), None);
        assert_eq!(staged_value(&staged, "a"), None, "settled writes are read from sled");
    }

    #[test]
    fn writes_stay_readable_while_sled_takes_them_and_come_back_if_it_fails() {
        let staged = Staged::default();
        staged.stage(writes(&[("a", Some("1"))]));
        let failed = staged.settle(|_| {
            assert_eq!(staged_value(&staged, "a"), Some(Some("1".into())), "readable while applying");
            staged.stage(writes(&[("a", Some("2"))]));
            Err("disk full")
        });
        assert_eq!(failed, Err("disk full"));
        assert_eq!(staged_value(&staged, "a"), Some(Some("2".into())), "newer writes stay on top");
    }
}
