//! The keyed records in sled, below the journal: what a checkpoint writes, what opening the
//! store replays into, and what a read finds when memory does not hold a key.
//!
//! Everything above this module speaks of logical keys (`session:<token>`, `lock:<seq>`, ...),
//! and the journal holds those too. Most are stored as themselves. Two families grow with every
//! message and are only appended to or trimmed from the old end; stored one sled key each, they
//! cost a checkpoint sled's per-key tree work (6-11 µs) for every message. They are packed into
//! chunks instead, so that a checkpoint rewrites a few chunks where it wrote thousands of keys:
//!
//! - compile.lock records, `lock:<seq>`, [`LOCK_RECORDS_PER_CHUNK`] to a chunk, `lockc:<n>`;
//! - the ledger's time index, `ledgert:<time><message id>`, a chunk per
//!   [`LEDGER_TIME_PER_CHUNK_MS`] of first-handling time, `ledgertc:<n>`.
//!
//! A chunk is `u32 BE count` and then its members in key order, each `u32 BE length | member |
//! u32 BE length | value`, where a member is its logical key without the family's prefix. Writing a chunk writes it
//! whole, so applying the same journal twice (a crash mid-checkpoint) gives the same chunk.
//!
//! The compile.lock index, `lockx:<frontend>\0<ir hash>` -> seq, is not stored: it is rebuilt
//! from the chain when the store opens and kept in memory (a 16-byte digest and a seq per
//! record), so it can only ever say what the chain says.

use crate::gateway::store::StoreError;
use sha2::{Digest, Sha256};
use sled::IVec;
use std::collections::{BTreeMap, HashMap};
use std::sync::{PoisonError, RwLock};

/// Logical prefixes of the families below, and of the index kept in memory.
pub const LOCK: &[u8] = b"lock:";
pub const LEDGER_TIME: &[u8] = b"ledgert:";
pub const LOCK_INDEX: &[u8] = b"lockx:";

/// About 10 KiB of records: small enough to rewrite whole, large enough that a checkpoint
/// writes one key for a busy window's records.
pub const LOCK_RECORDS_PER_CHUNK: u64 = 32;
/// A tenth of a second of ledger entries: at 10,000 messages a second, a chunk of about 40 KiB.
pub const LEDGER_TIME_PER_CHUNK_MS: u64 = 100;

/// A family of logical keys stored in chunks.
pub struct Family {
    pub logical: &'static [u8],
    pub physical: &'static [u8],
    /// The chunk a member belongs to, from the 8-byte big-endian number it starts with (a seq
    /// or a time), divided by this.
    per_chunk: u64,
}

pub const LOCK_RECORDS: Family =
    Family { logical: LOCK, physical: b"lockc:", per_chunk: LOCK_RECORDS_PER_CHUNK };
pub const LEDGER_TIMES: Family =
    Family { logical: LEDGER_TIME, physical: b"ledgertc:", per_chunk: LEDGER_TIME_PER_CHUNK_MS };

const FAMILIES: [&Family; 2] = [&LOCK_RECORDS, &LEDGER_TIMES];

impl Family {
    /// The sled key of chunk `n`.
    pub fn chunk_key(&self, n: u64) -> Vec<u8> {
        [self.physical, &n.to_be_bytes()].concat()
    }

    fn chunk_of(&self, member: &[u8]) -> Result<u64, StoreError> {
        let number = member.get(..8).and_then(|b| <[u8; 8]>::try_from(b).ok()).ok_or_else(|| {
            StoreError::Corrupt(format!(
                "a {} key is shorter than its number",
                String::from_utf8_lossy(self.logical)
            ))
        })?;
        Ok(u64::from_be_bytes(number) / self.per_chunk)
    }

    fn logical_key(&self, member: &[u8]) -> Vec<u8> {
        [self.logical, member].concat()
    }
}

fn family_of(key: &[u8]) -> Option<(&'static Family, &[u8])> {
    FAMILIES.into_iter().find_map(|f| key.strip_prefix(f.logical).map(|member| (f, member)))
}

/// A chunk's members, in key order.
pub type Chunk = BTreeMap<Vec<u8>, Vec<u8>>;

/// The bytes of a chunk.
pub fn encode_chunk(chunk: &Chunk) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + chunk.iter().map(|(m, v)| 8 + m.len() + v.len()).sum::<usize>());
    out.extend_from_slice(&u32::try_from(chunk.len()).expect("chunks are small").to_be_bytes());
    for (member, value) in chunk {
        for part in [member, value] {
            out.extend_from_slice(&u32::try_from(part.len()).expect("chunk parts are small").to_be_bytes());
            out.extend_from_slice(part);
        }
    }
    out
}

/// The members of a chunk's bytes, or why they are not a chunk.
pub fn decode_chunk(bytes: &[u8]) -> Result<Chunk, String> {
    let mut chunk = Chunk::new();
    let (count, mut rest) = bytes.split_first_chunk::<4>().ok_or("the count is cut short")?;
    let count = u32::from_be_bytes(*count) as usize;
    let part = |rest: &mut &[u8]| -> Result<Vec<u8>, String> {
        let (len, after) = rest.split_first_chunk::<4>().ok_or("a length is cut short")?;
        let len = u32::from_be_bytes(*len) as usize;
        let (part, after) = after.split_at_checked(len).ok_or("a member is cut short")?;
        *rest = after;
        Ok(part.to_vec())
    };
    while !rest.is_empty() {
        let member = part(&mut rest)?;
        let value = part(&mut rest)?;
        chunk.insert(member, value);
    }
    if chunk.len() != count {
        return Err(format!("{} members where the chunk says {count}", chunk.len()));
    }
    Ok(chunk)
}

/// The memory index's key for a `lockx:` member: a digest, so that a million records cost tens
/// of megabytes, not the length of their hashes. A lookup checks the record it reaches.
fn index_digest(member: &[u8]) -> [u8; 16] {
    let digest = Sha256::digest(member);
    let mut out = [0; 16];
    out.copy_from_slice(&digest[..16]);
    out
}

/// The keyed records of one sled database, and the compile.lock index beside them.
pub struct Keyed {
    db: sled::Db,
    lock_index: RwLock<HashMap<[u8; 16], u64>>,
}

fn unavailable(e: sled::Error) -> StoreError {
    StoreError::Unavailable(e.to_string())
}

fn damaged(key: &[u8], why: &str) -> StoreError {
    StoreError::Corrupt(format!("chunk {} is damaged: {why}", String::from_utf8_lossy(key).escape_debug()))
}

impl Keyed {
    /// The records of `db`, with an empty index ([`Keyed::rebuild_lock_index`] fills it).
    pub fn new(db: sled::Db) -> Keyed {
        Keyed { db, lock_index: RwLock::default() }
    }

    pub fn db(&self) -> &sled::Db {
        &self.db
    }

    fn chunk(&self, key: &[u8]) -> Result<Chunk, StoreError> {
        match self.db.get(key).map_err(unavailable)? {
            Some(bytes) => decode_chunk(&bytes).map_err(|why| damaged(key, &why)),
            None => Ok(Chunk::new()),
        }
    }

    /// The value of a logical key.
    pub fn get(&self, key: &[u8]) -> Result<Option<IVec>, StoreError> {
        if let Some(member) = key.strip_prefix(LOCK_INDEX) {
            let index = self.lock_index.read().unwrap_or_else(PoisonError::into_inner);
            return Ok(index.get(&index_digest(member)).map(|seq| IVec::from(&seq.to_be_bytes())));
        }
        match family_of(key) {
            Some((family, member)) => {
                let chunk = self.chunk(&family.chunk_key(family.chunk_of(member)?))?;
                Ok(chunk.get(member).map(|v| IVec::from(v.as_slice())))
            }
            None => self.db.get(key).map_err(unavailable),
        }
    }

    /// Applies logical writes (a value, or `None` to remove) through `put`, which writes one
    /// sled key as given: keys stored as themselves are handed on, members are merged into
    /// their chunks (each chunk read once and written once), and index entries go to memory.
    pub fn apply<'a>(
        &self,
        writes: impl IntoIterator<Item = (&'a [u8], Option<&'a [u8]>)>,
        mut put: impl FnMut(&[u8], Option<&[u8]>) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        let mut chunks: BTreeMap<Vec<u8>, Vec<(&'a [u8], Option<&'a [u8]>)>> = BTreeMap::new();
        for (key, value) in writes {
            if let Some(member) = key.strip_prefix(LOCK_INDEX) {
                self.index_write(member, value)?;
            } else if let Some((family, member)) = family_of(key) {
                chunks.entry(family.chunk_key(family.chunk_of(member)?)).or_default().push((member, value));
            } else {
                put(key, value)?;
            }
        }
        for (chunk_key, members) in chunks {
            let mut chunk = self.chunk(&chunk_key)?;
            for (member, value) in members {
                match value {
                    Some(value) => chunk.insert(member.to_vec(), value.to_vec()),
                    None => chunk.remove(member),
                };
            }
            if chunk.is_empty() {
                put(&chunk_key, None)?;
            } else {
                put(&chunk_key, Some(&encode_chunk(&chunk)))?;
            }
        }
        Ok(())
    }

    fn index_write(&self, member: &[u8], value: Option<&[u8]>) -> Result<(), StoreError> {
        let mut index = self.lock_index.write().unwrap_or_else(PoisonError::into_inner);
        match value {
            Some(seq) => {
                let seq = <[u8; 8]>::try_from(seq)
                    .map_err(|_| StoreError::Corrupt("a compile.lock index entry is not a seq".into()))?;
                index.insert(index_digest(member), u64::from_be_bytes(seq));
            }
            None => {
                index.remove(&index_digest(member));
            }
        }
        Ok(())
    }

    /// Every member of `family`, as (logical key, value), in key order.
    pub fn scan<'a>(
        &'a self,
        family: &'a Family,
    ) -> impl Iterator<Item = Result<(Vec<u8>, Vec<u8>), StoreError>> + 'a {
        self.db.scan_prefix(family.physical).flat_map(move |entry| {
            let members = entry
                .map_err(unavailable)
                .and_then(|(key, bytes)| decode_chunk(&bytes).map_err(|why| damaged(&key, &why)));
            let (members, failed) = match members {
                Ok(chunk) => (Some(chunk), None),
                Err(e) => (None, Some(Err(e))),
            };
            let members = members.into_iter().flatten().map(|(m, v)| Ok((family.logical_key(&m), v)));
            failed.into_iter().chain(members)
        })
    }

    /// The last logical key of `family`, if it holds any.
    pub fn last(&self, family: &Family) -> Result<Option<Vec<u8>>, StoreError> {
        let Some((key, bytes)) =
            self.db.scan_prefix(family.physical).next_back().transpose().map_err(unavailable)?
        else {
            return Ok(None);
        };
        let chunk = decode_chunk(&bytes).map_err(|why| damaged(&key, &why))?;
        Ok(chunk.keys().next_back().map(|m| family.logical_key(m)))
    }

    /// Builds the compile.lock index from the chain's records: (frontend, IR hash) -> seq. A
    /// record naming an entry already indexed (a chain that froze it twice) leaves the first:
    /// the first freeze wins, and `lock verify` names the second.
    pub fn rebuild_lock_index(&self) -> Result<(), StoreError> {
        #[derive(serde::Deserialize)]
        struct Entry {
            seq: u64,
            ir_hash: String,
            frontend: String,
        }
        let mut index = HashMap::new();
        for member in self.scan(&LOCK_RECORDS) {
            let (_, record) = member?;
            let entry: Entry = serde_json::from_slice(&record)
                .map_err(|e| StoreError::Corrupt(format!("lock record: {e}")))?;
            index
                .entry(index_digest(&lock_index_member(&entry.frontend, &entry.ir_hash)))
                .or_insert(entry.seq);
        }
        *self.lock_index.write().unwrap_or_else(PoisonError::into_inner) = index;
        Ok(())
    }

    /// Records the index holds.
    pub fn lock_index_len(&self) -> usize {
        self.lock_index.read().unwrap_or_else(PoisonError::into_inner).len()
    }
}

/// The member of a `lockx:` key: `<frontend>\0<ir hash>`.
pub fn lock_index_member(frontend: &str, ir_hash: &str) -> Vec<u8> {
    [frontend.as_bytes(), b"\0", ir_hash.as_bytes()].concat()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keyed() -> Keyed {
        Keyed::new(sled::Config::new().temporary(true).open().unwrap())
    }

    fn lock_key(seq: u64) -> Vec<u8> {
        [LOCK, &seq.to_be_bytes()].concat()
    }

    fn write(keyed: &Keyed, writes: &[(Vec<u8>, Option<Vec<u8>>)]) -> Vec<Vec<u8>> {
        let mut written = Vec::new();
        keyed
            .apply(writes.iter().map(|(k, v)| (k.as_slice(), v.as_deref())), |key, value| {
                written.push(key.to_vec());
                match value {
                    Some(v) => keyed.db.insert(key, v).map(drop),
                    None => keyed.db.remove(key).map(drop),
                }
                .map_err(unavailable)
            })
            .unwrap();
        written
    }

    #[test]
    fn a_chunk_reads_back_as_its_members_and_a_cut_one_is_refused() {
        let chunk: Chunk = [(b"a".to_vec(), b"1".to_vec()), (b"bb".to_vec(), Vec::new())].into();
        let bytes = encode_chunk(&chunk);
        assert_eq!(decode_chunk(&bytes).unwrap(), chunk);
        for cut in 0..bytes.len() {
            assert!(decode_chunk(&bytes[..cut]).is_err(), "cut at {cut} reads as whole");
        }
    }

    #[test]
    fn records_of_a_window_are_one_chunk_write_and_read_back_by_their_own_keys() {
        let keyed = keyed();
        let records: Vec<_> =
            (0..40).map(|seq| (lock_key(seq), Some(format!("record {seq}").into_bytes()))).collect();
        let written = write(&keyed, &records[..35]);
        assert_eq!(
            written,
            vec![LOCK_RECORDS.chunk_key(0), LOCK_RECORDS.chunk_key(1)],
            "two chunks, not 35 keys"
        );
        write(&keyed, &records[35..]);
        assert_eq!(keyed.get(&lock_key(3)).unwrap().as_deref(), Some(&b"record 3"[..]));
        assert_eq!(keyed.get(&lock_key(39)).unwrap().as_deref(), Some(&b"record 39"[..]));
        assert_eq!(keyed.get(&lock_key(40)).unwrap(), None);
        let scanned: Vec<_> = keyed.scan(&LOCK_RECORDS).map(|m| m.unwrap().0).collect();
        assert_eq!(scanned, (0..40).map(lock_key).collect::<Vec<_>>(), "every record, in chain order");
        assert_eq!(keyed.last(&LOCK_RECORDS).unwrap(), Some(lock_key(39)));
    }

    #[test]
    fn removing_every_member_of_a_chunk_removes_the_chunk() {
        let keyed = keyed();
        let time_key = |at: u64, id: &str| [LEDGER_TIME, &at.to_be_bytes(), id.as_bytes()].concat();
        write(
            &keyed,
            &[(time_key(1_000, "m1"), Some(Vec::new())), (time_key(1_050, "m2"), Some(Vec::new()))],
        );
        write(&keyed, &[(time_key(1_000, "m1"), None)]);
        assert_eq!(keyed.get(&time_key(1_050, "m2")).unwrap().as_deref(), Some(&b""[..]));
        write(&keyed, &[(time_key(1_050, "m2"), None)]);
        assert_eq!(keyed.db.scan_prefix(LEDGER_TIMES.physical).count(), 0);
        assert_eq!(keyed.last(&LEDGER_TIMES).unwrap(), None);
    }

    #[test]
    fn the_index_lives_in_memory_and_is_rebuilt_from_the_records() {
        let keyed = keyed();
        let record = |seq: u64, hash: &str| {
            serde_json::to_vec(&serde_json::json!({"seq": seq, "ir_hash": hash, "frontend": "code"})).unwrap()
        };
        let index_key = |hash: &str| [LOCK_INDEX, &lock_index_member("code", hash)].concat();
        let written = write(
            &keyed,
            &[
                (lock_key(0), Some(record(0, "h0"))),
                (index_key("h0"), Some(0u64.to_be_bytes().to_vec())),
                (lock_key(1), Some(record(1, "h1"))),
                (index_key("h1"), Some(1u64.to_be_bytes().to_vec())),
            ],
        );
        assert_eq!(written, vec![LOCK_RECORDS.chunk_key(0)], "no index key reaches sled");
        assert_eq!(keyed.get(&index_key("h1")).unwrap().as_deref(), Some(&1u64.to_be_bytes()[..]));

        let reopened = Keyed::new(keyed.db.clone());
        assert_eq!(reopened.get(&index_key("h1")).unwrap(), None, "empty until rebuilt");
        reopened.rebuild_lock_index().unwrap();
        assert_eq!(reopened.get(&index_key("h0")).unwrap().as_deref(), Some(&0u64.to_be_bytes()[..]));
        assert_eq!(reopened.lock_index_len(), 2);
    }
}
