//! The keyed records in sled, below the journal: what a checkpoint writes, what opening the
//! store replays into, and what a read finds when memory does not hold a key.
//!
//! Everything above this module speaks of logical keys (`session:<token>`, `lock:<seq>`,
//! `ledger:<message id>`, ...), and the journal holds those too. Most are stored as themselves.
//! What every message adds is not: stored one sled key each, it cost a checkpoint sled's
//! per-key tree work (6-11 µs) for every message. It is packed into chunks instead, so that a
//! checkpoint rewrites a few chunks where it wrote thousands of keys:
//!
//! - compile.lock records, `lock:<seq>`, [`LOCK_RECORDS_PER_CHUNK`] to a chunk, `lockc:<n>`;
//! - ledger entries, `ledger:<message id>`, by first-handling time (the `at` every entry
//!   carries), a chunk per [`LEDGER_MS_PER_CHUNK`], `ledgerc:<at / 100>`, each member
//!   `<at, 8 bytes BE><message id>`. Chunks in key order are the ledger in time order, which is
//!   how it is trimmed: no separate time index is kept.
//!
//! A chunk is `u32 BE count` and then its members in key order, each `u32 BE length | member |
//! u32 BE length | value`. Writing a chunk writes it whole, so applying the same journal twice
//! (a crash mid-checkpoint) gives the same chunk.
//!
//! Two maps in memory find what the chunks hold, and are rebuilt from them when the store
//! opens, so they can only ever say what the records say. Each holds a 16-byte digest and a
//! number per entry (about 30 bytes with the map's own):
//!
//! - the compile.lock index, `lockx:<frontend>\0<ir hash>` -> seq, which is not stored at all;
//! - the ledger's times, message id -> `at`, which name an entry's chunk. A message the map
//!   does not know has no entry: the ledger check of a new message never reaches sled.

use crate::gateway::store::StoreError;
use sha2::{Digest, Sha256};
use sled::IVec;
use std::collections::{BTreeMap, HashMap};
use std::sync::{PoisonError, RwLock};

/// Logical prefixes: compile.lock records, their index (kept in memory), ledger entries.
pub const LOCK: &[u8] = b"lock:";
pub const LOCK_INDEX: &[u8] = b"lockx:";
pub const LEDGER: &[u8] = b"ledger:";
/// Layout 6's time index of the ledger. A layout-6 journal may still write it; the entries'
/// own times replace it, so those writes are dropped.
pub const LEDGER_TIME: &[u8] = b"ledgert:";
/// The sled prefix of ledger chunks.
pub const LEDGER_CHUNKS: &[u8] = b"ledgerc:";

/// About 10 KiB of records: small enough to rewrite whole, large enough that a checkpoint
/// writes one key for a busy window's records.
pub const LOCK_RECORDS_PER_CHUNK: u64 = 32;
/// A tenth of a second of ledger entries: at 10,000 messages a second, a chunk of about 100 KiB.
pub const LEDGER_MS_PER_CHUNK: u64 = 100;

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

/// Takes one length-prefixed part off the front of `rest`.
fn take_part<'b>(rest: &mut &'b [u8]) -> Result<&'b [u8], String> {
    let (len, after) = rest.split_first_chunk::<4>().ok_or("a length is cut short")?;
    let (part, after) =
        after.split_at_checked(u32::from_be_bytes(*len) as usize).ok_or("a member is cut short")?;
    *rest = after;
    Ok(part)
}

/// The members of a chunk's bytes, or why they are not a chunk.
pub fn decode_chunk(bytes: &[u8]) -> Result<Chunk, String> {
    let mut chunk = Chunk::new();
    let (count, mut rest) = bytes.split_first_chunk::<4>().ok_or("the count is cut short")?;
    let count = u32::from_be_bytes(*count) as usize;
    while !rest.is_empty() {
        let member = take_part(&mut rest)?;
        let value = take_part(&mut rest)?;
        chunk.insert(member.to_vec(), value.to_vec());
    }
    if chunk.len() != count {
        return Err(format!("{} members where the chunk says {count}", chunk.len()));
    }
    Ok(chunk)
}

/// The value of `member` in a chunk's bytes, found without decoding the others.
fn find_member<'b>(bytes: &'b [u8], member: &[u8]) -> Result<Option<&'b [u8]>, String> {
    let (_, mut rest) = bytes.split_first_chunk::<4>().ok_or("the count is cut short")?;
    while !rest.is_empty() {
        let found = take_part(&mut rest)?;
        let value = take_part(&mut rest)?;
        if found == member {
            return Ok(Some(value));
        }
    }
    Ok(None)
}

/// The map key of an entry held in memory (a compile.lock index entry, a message id): a
/// digest, so that a million entries cost tens of megabytes whatever their length. What it
/// finds is checked (a lock record's entry) or names a chunk to look in (a message's time).
fn digest(bytes: &[u8]) -> [u8; 16] {
    let digest = Sha256::digest(bytes);
    let mut out = [0; 16];
    out.copy_from_slice(&digest[..16]);
    out
}

/// The member of a ledger entry in its chunk: `<at, 8 bytes BE><message id>`.
fn ledger_member(at: u64, id: &[u8]) -> Vec<u8> {
    [&at.to_be_bytes(), id].concat()
}

fn ledger_chunk_key(at: u64) -> Vec<u8> {
    [LEDGER_CHUNKS, &(at / LEDGER_MS_PER_CHUNK).to_be_bytes()].concat()
}

/// The first-handling time a ledger entry carries.
fn entry_time(entry: &[u8]) -> Result<u64, StoreError> {
    #[derive(serde::Deserialize)]
    struct Timed {
        at: u64,
    }
    serde_json::from_slice::<Timed>(entry)
        .map(|t| t.at)
        .map_err(|e| StoreError::Corrupt(format!("ledger entry: {e}")))
}

/// The keyed records of one sled database, and the maps in memory that find them.
pub struct Keyed {
    db: sled::Db,
    /// Digest of `<frontend>\0<ir hash>` -> the seq of its compile.lock record.
    lock_index: RwLock<HashMap<[u8; 16], u64>>,
    /// Digest of a message id -> the time its ledger entry is filed under.
    ledger_times: RwLock<HashMap<[u8; 16], u64>>,
}

fn unavailable(e: sled::Error) -> StoreError {
    StoreError::Unavailable(e.to_string())
}

fn damaged(key: &[u8], why: &str) -> StoreError {
    StoreError::Corrupt(format!("chunk {} is damaged: {why}", String::from_utf8_lossy(key).escape_debug()))
}

fn read<T>(lock: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(PoisonError::into_inner)
}

fn write<T>(lock: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(PoisonError::into_inner)
}

/// One chunk's edits, in the order they were made: a member's value, or `None` to remove it.
type Edits<'a> = Vec<(Vec<u8>, Option<&'a [u8]>)>;

impl Keyed {
    /// The records of `db` with empty maps, for moving records (a migration) rather than
    /// reading them.
    pub fn new(db: sled::Db) -> Keyed {
        Keyed { db, lock_index: RwLock::default(), ledger_times: RwLock::default() }
    }

    /// The records of `db`, with the maps rebuilt from them.
    pub fn load(db: sled::Db) -> Result<Keyed, StoreError> {
        let keyed = Keyed::new(db);
        keyed.rebuild()?;
        Ok(keyed)
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

    fn member(&self, chunk_key: &[u8], member: &[u8]) -> Result<Option<IVec>, StoreError> {
        let Some(bytes) = self.db.get(chunk_key).map_err(unavailable)? else { return Ok(None) };
        let found = find_member(&bytes, member).map_err(|why| damaged(chunk_key, &why))?;
        Ok(found.map(IVec::from))
    }

    /// The value of a logical key.
    pub fn get(&self, key: &[u8]) -> Result<Option<IVec>, StoreError> {
        if let Some(member) = key.strip_prefix(LOCK_INDEX) {
            return Ok(read(&self.lock_index).get(&digest(member)).map(|seq| IVec::from(&seq.to_be_bytes())));
        }
        if let Some(id) = key.strip_prefix(LEDGER) {
            let Some(at) = read(&self.ledger_times).get(&digest(id)).copied() else { return Ok(None) };
            return self.member(&ledger_chunk_key(at), &ledger_member(at, id));
        }
        if let Some(member) = key.strip_prefix(LOCK) {
            return self.member(&LOCK_RECORDS.chunk_key(LOCK_RECORDS.chunk_of(member)?), member);
        }
        self.db.get(key).map_err(unavailable)
    }

    /// Applies logical writes (a value, or `None` to remove) through `put`, which writes one
    /// sled key as given: keys stored as themselves are handed on, members are merged into
    /// their chunks (each chunk read once and written once), and the maps follow.
    pub fn apply<'a>(
        &self,
        writes: impl IntoIterator<Item = (&'a [u8], Option<&'a [u8]>)>,
        mut put: impl FnMut(&[u8], Option<&[u8]>) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        let mut chunks: BTreeMap<Vec<u8>, Edits<'a>> = BTreeMap::new();
        for (key, value) in writes {
            if let Some(member) = key.strip_prefix(LOCK_INDEX) {
                self.index_write(member, value)?;
            } else if key.starts_with(LEDGER_TIME) {
                // Layout 6's time index, from a journal it left: the entry carries its time.
            } else if let Some(id) = key.strip_prefix(LEDGER) {
                self.ledger_write(id, value, &mut chunks)?;
            } else if let Some(member) = key.strip_prefix(LOCK) {
                let chunk_key = LOCK_RECORDS.chunk_key(LOCK_RECORDS.chunk_of(member)?);
                chunks.entry(chunk_key).or_default().push((member.to_vec(), value));
            } else {
                put(key, value)?;
            }
        }
        for (chunk_key, edits) in chunks {
            let mut chunk = self.chunk(&chunk_key)?;
            for (member, value) in edits {
                match value {
                    Some(value) => chunk.insert(member, value.to_vec()),
                    None => chunk.remove(&member),
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
        let mut index = write(&self.lock_index);
        match value {
            Some(seq) => {
                let seq = <[u8; 8]>::try_from(seq)
                    .map_err(|_| StoreError::Corrupt("a compile.lock index entry is not a seq".into()))?;
                index.insert(digest(member), u64::from_be_bytes(seq));
            }
            None => {
                index.remove(&digest(member));
            }
        }
        Ok(())
    }

    /// Files a ledger entry under its time (moving it, should its time have changed), or takes
    /// it out of the chunk it is filed in.
    fn ledger_write<'a>(
        &self,
        id: &[u8],
        value: Option<&'a [u8]>,
        chunks: &mut BTreeMap<Vec<u8>, Edits<'a>>,
    ) -> Result<(), StoreError> {
        let mut times = write(&self.ledger_times);
        let filed = times.get(&digest(id)).copied();
        let at = value.map(entry_time).transpose()?;
        if let Some(old) = filed
            && Some(old) != at
        {
            chunks.entry(ledger_chunk_key(old)).or_default().push((ledger_member(old, id), None));
            times.remove(&digest(id));
        }
        if let (Some(at), Some(entry)) = (at, value) {
            chunks.entry(ledger_chunk_key(at)).or_default().push((ledger_member(at, id), Some(entry)));
            times.insert(digest(id), at);
        }
        Ok(())
    }

    /// Every member of `family`, as (logical key, value), in key order.
    pub fn scan<'a>(
        &'a self,
        family: &'a Family,
    ) -> impl Iterator<Item = Result<(Vec<u8>, Vec<u8>), StoreError>> + 'a {
        chunks(&self.db, family.physical)
            .map(move |m| m.map(|(member, value)| (family.logical_key(&member), value)))
    }

    /// Every ledger entry, oldest first, as (time, message id).
    pub fn ledger_by_time(&self) -> impl Iterator<Item = Result<(u64, Vec<u8>), StoreError>> + '_ {
        chunks(&self.db, LEDGER_CHUNKS).map(|m| {
            let (member, _) = m?;
            let (at, id) = member
                .split_first_chunk::<8>()
                .ok_or_else(|| StoreError::Corrupt("a ledger chunk member has no time".into()))?;
            Ok((u64::from_be_bytes(*at), id.to_vec()))
        })
    }

    /// How many ledger entries the chunks hold.
    pub fn ledger_len(&self) -> usize {
        read(&self.ledger_times).len()
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

    /// Builds both maps from the records. A compile.lock record naming an entry already
    /// indexed (a chain that froze it twice) leaves the first: the first freeze wins, and `lock
    /// verify` names the second.
    fn rebuild(&self) -> Result<(), StoreError> {
        // Borrowed where the record allows: a million records are read at every open.
        #[derive(serde::Deserialize)]
        struct Entry<'r> {
            seq: u64,
            #[serde(borrow)]
            ir_hash: std::borrow::Cow<'r, str>,
            #[serde(borrow)]
            frontend: std::borrow::Cow<'r, str>,
        }
        let mut index = HashMap::new();
        for_each_member(&self.db, LOCK_RECORDS.physical, |_, record| {
            let entry: Entry = serde_json::from_slice(record)
                .map_err(|e| StoreError::Corrupt(format!("lock record: {e}")))?;
            index.entry(digest(&lock_index_member(&entry.frontend, &entry.ir_hash))).or_insert(entry.seq);
            Ok(())
        })?;
        let mut times = HashMap::new();
        for_each_member(&self.db, LEDGER_CHUNKS, |member, _| {
            let (at, id) = member
                .split_first_chunk::<8>()
                .ok_or_else(|| StoreError::Corrupt("a ledger chunk member has no time".into()))?;
            times.insert(digest(id), u64::from_be_bytes(*at));
            Ok(())
        })?;
        *write(&self.lock_index) = index;
        *write(&self.ledger_times) = times;
        Ok(())
    }
}

/// Hands `each` every member of the chunks under `prefix` as it lies in the chunk's bytes,
/// copying nothing: what opening the store reads, a million members at a time.
fn for_each_member(
    db: &sled::Db,
    prefix: &[u8],
    mut each: impl FnMut(&[u8], &[u8]) -> Result<(), StoreError>,
) -> Result<(), StoreError> {
    for entry in db.scan_prefix(prefix) {
        let (key, bytes) = entry.map_err(unavailable)?;
        let (_, mut rest) =
            bytes.split_first_chunk::<4>().ok_or_else(|| damaged(&key, "the count is cut short"))?;
        while !rest.is_empty() {
            let member = take_part(&mut rest).map_err(|why| damaged(&key, &why))?;
            let value = take_part(&mut rest).map_err(|why| damaged(&key, &why))?;
            each(member, value)?;
        }
    }
    Ok(())
}

/// Every member of the chunks under `prefix`, in key order.
fn chunks<'a>(
    db: &'a sled::Db,
    prefix: &'a [u8],
) -> impl Iterator<Item = Result<(Vec<u8>, Vec<u8>), StoreError>> + 'a {
    db.scan_prefix(prefix).flat_map(|entry| {
        let members = entry
            .map_err(unavailable)
            .and_then(|(key, bytes)| decode_chunk(&bytes).map_err(|why| damaged(&key, &why)));
        let (members, failed) = match members {
            Ok(chunk) => (Some(chunk), None),
            Err(e) => (None, Some(Err(e))),
        };
        failed.into_iter().chain(members.into_iter().flatten().map(Ok))
    })
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

    /// Layout 7 on disk, pinned byte for byte: a store written by this build must read the
    /// same in every later one. Members in key order (`a` before `bb` whatever order they were
    /// given in), each part length-prefixed, every number a big-endian u32; chunk keys are the
    /// family's prefix and the chunk number as a big-endian u64.
    #[test]
    fn layout_7_chunks_and_their_keys_are_the_bytes_the_format_says() {
        let chunk: Chunk = [(b"bb".to_vec(), Vec::new()), (b"a".to_vec(), b"1".to_vec())].into();
        let golden: &[u8] = &[
            0, 0, 0, 2, // two members
            0, 0, 0, 1, b'a', 0, 0, 0, 1, b'1', // a = 1
            0, 0, 0, 2, b'b', b'b', 0, 0, 0, 0, // bb = (empty)
        ];
        assert_eq!(encode_chunk(&chunk), golden);
        assert_eq!(decode_chunk(golden).unwrap(), chunk);
        assert_eq!(LOCK_RECORDS.chunk_key(3), b"lockc:\0\0\0\0\0\0\0\x03");
        // Lock record 70 is in chunk 2 (32 records a chunk); a ledger entry first handled at
        // 12,345 ms is in chunk 123 (a tenth of a second a chunk), its member time then id.
        assert_eq!(LOCK_RECORDS.chunk_of(&70u64.to_be_bytes()).unwrap(), 2);
        assert_eq!(ledger_chunk_key(12_345), b"ledgerc:\0\0\0\0\0\0\0\x7b");
        assert_eq!(ledger_member(12_345, b"m-1"), b"\0\0\0\0\0\0\x30\x39m-1");
    }

    #[test]
    fn a_chunk_reads_back_as_its_members_and_a_cut_one_is_refused() {
        let chunk: Chunk = [(b"a".to_vec(), b"1".to_vec()), (b"bb".to_vec(), Vec::new())].into();
        let bytes = encode_chunk(&chunk);
        assert_eq!(decode_chunk(&bytes).unwrap(), chunk);
        assert_eq!(find_member(&bytes, b"bb").unwrap(), Some(&b""[..]));
        assert_eq!(find_member(&bytes, b"c").unwrap(), None);
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

    fn entry(at: u64, state: &str) -> Option<Vec<u8>> {
        Some(format!(r#"{{"state":"{state}","at":{at}}}"#).into_bytes())
    }

    fn ledger_key(id: &str) -> Vec<u8> {
        [LEDGER, id.as_bytes()].concat()
    }

    #[test]
    fn ledger_entries_are_filed_by_time_found_by_id_and_leave_an_empty_chunk_behind_them() {
        let keyed = keyed();
        let written = write(
            &keyed,
            &[(ledger_key("m1"), entry(1_000, "pending")), (ledger_key("m2"), entry(1_050, "pending"))],
        );
        assert_eq!(written, vec![ledger_chunk_key(1_000)], "one chunk for the tenth of a second");
        write(
            &keyed,
            &[(ledger_key("m1"), entry(1_000, "published")), (ledger_key("m3"), entry(1_200, "pending"))],
        );
        assert_eq!(keyed.get(&ledger_key("m1")).unwrap().as_deref(), entry(1_000, "published").as_deref());
        assert_eq!(keyed.get(&ledger_key("m9")).unwrap(), None);
        let by_time: Vec<_> = keyed.ledger_by_time().map(Result::unwrap).collect();
        assert_eq!(by_time, vec![(1_000, b"m1".to_vec()), (1_050, b"m2".to_vec()), (1_200, b"m3".to_vec())]);

        let reopened = Keyed::load(keyed.db.clone()).unwrap();
        assert_eq!(reopened.ledger_len(), 3);
        assert_eq!(reopened.get(&ledger_key("m2")).unwrap().as_deref(), entry(1_050, "pending").as_deref());
        write(&reopened, &[(ledger_key("m1"), None), (ledger_key("m2"), None)]);
        assert_eq!(reopened.get(&ledger_key("m1")).unwrap(), None);
        assert_eq!(reopened.db.get(ledger_chunk_key(1_000)).unwrap(), None, "the emptied chunk is gone");
        assert_eq!(reopened.ledger_len(), 1);
        write(&reopened, &[([LEDGER_TIME, b"anything"].concat(), Some(Vec::new()))]);
        assert_eq!(reopened.db.scan_prefix(LEDGER_TIME).count(), 0, "layout 6's time index is dropped");
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
        assert_eq!(reopened.get(&index_key("h1")).unwrap(), None, "empty until loaded");
        let reopened = Keyed::load(keyed.db.clone()).unwrap();
        assert_eq!(reopened.get(&index_key("h0")).unwrap().as_deref(), Some(&0u64.to_be_bytes()[..]));
    }
}
