//! The store's journal: the writes of each flush as one checksummed record, so that making a
//! window of messages durable costs sled one key and one sync, however many records the
//! window touched.
//!
//! A record is `journal:<seq, 8 bytes BE>` -> `crc32 (4 bytes BE) | body`, and the body is the
//! writes in key order: `key length (u32 BE) | key | 1 | value length (u32 BE) | value` for a
//! value, `key length | key | 0` for a removal. A checkpoint applies the records to the keyed
//! state and removes them in one atomic batch; opening the store replays what is left.
//!
//! sled's own log already makes each insert all-or-nothing. The checksum guards what sled
//! cannot: a record damaged on disk after it was written. A damaged last record is a torn tail
//! and is dropped (its messages were never acknowledged); a damaged record with good ones
//! after it would lose acknowledged state silently, so the store refuses to open instead.

use super::keyed::Keyed;
use crate::gateway::store::StoreError;
use sled::IVec;
use std::collections::BTreeMap;

/// The key prefix of journal records.
pub(super) const PREFIX: &[u8] = b"journal:";

/// Writes as staged: a value, or `None` for a removal; the last write of a key wins.
pub(super) type WriteMap = BTreeMap<IVec, Option<IVec>>;

pub(super) fn key(seq: u64) -> Vec<u8> {
    let mut k = PREFIX.to_vec();
    k.extend_from_slice(&seq.to_be_bytes());
    k
}

/// One record holding `writes`.
pub(super) fn encode(writes: &WriteMap) -> Vec<u8> {
    let size: usize = writes.iter().map(|(k, v)| 9 + k.len() + v.as_ref().map_or(0, |v| 4 + v.len())).sum();
    let mut out = Vec::with_capacity(4 + size);
    out.extend_from_slice(&[0; 4]);
    for (key, value) in writes {
        push_bytes(&mut out, key);
        match value {
            Some(value) => {
                out.push(1);
                push_bytes(&mut out, value);
            }
            None => out.push(0),
        }
    }
    let crc = crc32fast::hash(&out[4..]);
    out[..4].copy_from_slice(&crc.to_be_bytes());
    out
}

fn push_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    let len = u32::try_from(bytes.len()).expect("a store key or value under 4 GiB");
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(bytes);
}

/// Why a record cannot be read back.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(super) enum Damaged {
    #[error("its checksum does not match its contents")]
    Checksum,
    #[error("it ends inside a write at byte {0}")]
    Truncated(usize),
}

/// The writes of one record, in the order they were encoded.
pub(super) fn decode(record: &[u8]) -> Result<Vec<(IVec, Option<IVec>)>, Damaged> {
    let (crc, body) = record.split_first_chunk::<4>().ok_or(Damaged::Truncated(0))?;
    if u32::from_be_bytes(*crc) != crc32fast::hash(body) {
        return Err(Damaged::Checksum);
    }
    let mut reader = Reader { body, at: 0 };
    let mut writes = Vec::new();
    while reader.at < body.len() {
        let key = reader.bytes()?;
        let value = match reader.byte()? {
            1 => Some(reader.bytes()?),
            _ => None,
        };
        writes.push((key, value));
    }
    Ok(writes)
}

struct Reader<'a> {
    body: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], Damaged> {
        let end = self.at.checked_add(n).filter(|end| *end <= self.body.len());
        let end = end.ok_or(Damaged::Truncated(self.at))?;
        let taken = &self.body[self.at..end];
        self.at = end;
        Ok(taken)
    }

    fn byte(&mut self) -> Result<u8, Damaged> {
        Ok(self.take(1)?[0])
    }

    fn bytes(&mut self) -> Result<IVec, Damaged> {
        let len = u32::from_be_bytes(self.take(4)?.try_into().expect("4 bytes"));
        Ok(IVec::from(self.take(len as usize)?))
    }
}

/// What opening the store found in the journal.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Replayed {
    /// Records applied to the keyed state.
    pub records: usize,
    /// The sequence number of a damaged last record that was dropped.
    pub torn_tail: Option<u64>,
}

/// Applies every journal record left in `db` (a crash came before their checkpoint) to the
/// keyed state, in order, and removes them, in one atomic batch made durable before the store
/// is used.
pub(super) fn replay(keyed: &Keyed) -> Result<Replayed, StoreError> {
    let db = keyed.db();
    let unavailable = |e: sled::Error| StoreError::Unavailable(e.to_string());
    let mut writes = WriteMap::new();
    let mut trim = sled::Batch::default();
    let mut replayed = Replayed::default();
    let mut damaged: Option<(u64, Damaged)> = None;
    for entry in db.scan_prefix(PREFIX) {
        let (record_key, record) = entry.map_err(unavailable)?;
        let seq =
            <[u8; 8]>::try_from(&record_key[PREFIX.len()..]).map(u64::from_be_bytes).unwrap_or(u64::MAX);
        if let Some((bad, why)) = damaged {
            return Err(StoreError::Corrupt(format!(
                "journal record {bad} is damaged ({why}) and record {seq} follows it: state acknowledged after it would be lost"
            )));
        }
        match decode(&record) {
            Ok(record_writes) => {
                writes.extend(record_writes);
                replayed.records += 1;
            }
            Err(why) => damaged = Some((seq, why)),
        }
        trim.remove(record_key);
    }
    if let Some((seq, why)) = damaged {
        tracing::warn!(record = seq, reason = %why, "The store's last journal record is damaged (a torn write) and was dropped.");
        replayed.torn_tail = Some(seq);
    }
    if replayed.records == 0 && replayed.torn_tail.is_none() {
        return Ok(replayed);
    }
    let mut batch = trim;
    keyed.apply(writes.iter().map(|(k, v)| (k.as_ref(), v.as_deref())), |key, value| {
        match value {
            Some(value) => batch.insert(key, value),
            None => batch.remove(key),
        }
        Ok(())
    })?;
    db.apply_batch(batch).map_err(unavailable)?;
    db.flush().map_err(unavailable)?;
    Ok(replayed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn writes(pairs: &[(&str, Option<&str>)]) -> WriteMap {
        pairs.iter().map(|(k, v)| (IVec::from(k.as_bytes()), v.map(|v| IVec::from(v.as_bytes())))).collect()
    }

    #[test]
    fn a_record_reads_back_as_its_writes() {
        let map = writes(&[("a", Some("1")), ("b", None), ("c", Some(""))]);
        let read: WriteMap = decode(&encode(&map)).unwrap().into_iter().collect();
        assert_eq!(read, map);
        assert_eq!(decode(&encode(&WriteMap::new())).unwrap(), vec![]);
    }

    #[test]
    fn a_damaged_record_is_refused_never_half_read() {
        let record = encode(&writes(&[("session:a", Some("turn 3")), ("ledger:m", Some("done"))]));
        let mut flipped = record.clone();
        flipped[10] ^= 1;
        assert_eq!(decode(&flipped), Err(Damaged::Checksum));
        for cut in 0..record.len() {
            assert!(decode(&record[..cut]).is_err(), "cut at {cut} reads as whole");
        }
    }

    fn db() -> Keyed {
        Keyed::new(sled::Config::new().temporary(true).open().unwrap())
    }

    #[test]
    fn replay_applies_records_in_order_and_empties_the_journal() {
        let keyed = db();
        let db = keyed.db();
        db.insert(key(0), encode(&writes(&[("a", Some("1")), ("b", Some("x"))]))).unwrap();
        db.insert(key(1), encode(&writes(&[("a", Some("2")), ("b", None)]))).unwrap();
        assert_eq!(replay(&keyed).unwrap(), Replayed { records: 2, torn_tail: None });
        assert_eq!(db.get("a").unwrap().as_deref(), Some(&b"2"[..]));
        assert_eq!(db.get("b").unwrap(), None);
        assert_eq!(db.scan_prefix(PREFIX).count(), 0);
    }

    #[test]
    fn a_torn_tail_is_dropped_and_a_damaged_middle_refuses_to_open() {
        let keyed = db();
        let db = keyed.db();
        db.insert(key(0), encode(&writes(&[("a", Some("1"))]))).unwrap();
        let torn = encode(&writes(&[("a", Some("2"))]));
        db.insert(key(1), &torn[..torn.len() - 1]).unwrap();
        assert_eq!(replay(&keyed).unwrap(), Replayed { records: 1, torn_tail: Some(1) });
        assert_eq!(db.get("a").unwrap().as_deref(), Some(&b"1"[..]), "nothing of the torn record applied");

        let keyed = self::db();
        let db = keyed.db();
        db.insert(key(0), b"damaged").unwrap();
        db.insert(key(1), encode(&writes(&[("a", Some("2"))]))).unwrap();
        let refused = replay(&keyed).unwrap_err().to_string();
        assert!(refused.contains("journal record 0 is damaged"), "{refused}");
        assert_eq!(db.scan_prefix(PREFIX).count(), 2, "nothing removed");
        assert_eq!(db.get("a").unwrap(), None, "nothing applied");
    }
}
