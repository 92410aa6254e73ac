//! The compile.lock as a hash chain: one record per (IR hash, frontend), each carrying the hash
//! of the record before it, so that editing, inserting, deleting, reordering or truncating
//! records breaks the chain. With a key, the hashes are HMAC-SHA256: whoever rewrites every
//! hash without the key is caught too.
//!
//! Export formats: `chain` (every field, one JSON line per record, then a head line that seals
//! the record count) and `reference` (the SILP reference CLI's `compile.lock` lines).

use crate::util::hash::sha256_hex;
use crate::util::json_text;
use hmac::{KeyInit, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use std::fmt;

/// The chain's HMAC key from the environment variable named by `store.hmac_key_env` (or a
/// command's `--key-env`), if one is named; the daemon and the commands read it alike. A key
/// shorter than [`MIN_KEY_BYTES`] is refused here, before any store is opened.
pub(crate) fn key_from_env(var: Option<&str>) -> Result<Option<Vec<u8>>, String> {
    let Some(var) = var else { return Ok(None) };
    match std::env::var_os(var) {
        Some(v) if !v.is_empty() => {
            let key = v.into_encoded_bytes();
            Sealer::new(Some(key.clone())).map_err(|e| format!("environment variable {var}: {e}"))?;
            Ok(Some(key))
        }
        _ => Err(format!("environment variable {var} (the lock key) is not set")),
    }
}

/// `prev_hash` of the first record.
pub const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// One compile.lock record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockRecord {
    pub seq: u64,
    /// `sha256:<hex>` of the canonical compact IR.
    pub ir_hash: String,
    pub frontend: String,
    pub output: String,
    /// `sha256:<hex>` of `output`.
    pub output_hash: String,
    pub timestamp: String,
    pub prev_hash: String,
    /// The subject of the principal whose message froze it; absent when none was known (no
    /// authentication, or a record older than principals), and then no part of the hash, so
    /// that older records verify as they always did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub principal: Option<String>,
    /// Hash (or HMAC) over every field above.
    pub record_hash: String,
}

/// The last line of a `chain` export: how many records there are and the last hash, sealed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Head {
    pub records: u64,
    pub last_hash: String,
    pub head_hash: String,
}

/// The shortest key a chain may be sealed with: an HMAC-SHA256 key shorter than its 32-byte
/// output is weaker than the hash it keys.
pub(crate) const MIN_KEY_BYTES: usize = 32;

/// A key refused before anything is sealed with it. The key itself is never part of the text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the compile.lock key is {len} bytes; a key must have at least {MIN_KEY_BYTES} (e.g. `openssl rand -base64 32`)"
)]
pub struct WeakKey {
    pub len: usize,
}

/// How record hashes are made.
#[derive(Clone)]
pub struct Sealer {
    key: Option<Vec<u8>>,
}

impl fmt::Debug for Sealer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never print the key.
        f.debug_struct("Sealer").field("keyed", &self.key.is_some()).finish()
    }
}

impl Sealer {
    /// A sealer keyed with `key`, or an unkeyed one (plain SHA-256).
    ///
    /// # Errors
    /// [`WeakKey`] when the key is shorter than [`MIN_KEY_BYTES`].
    pub fn new(key: Option<Vec<u8>>) -> Result<Self, WeakKey> {
        match key {
            Some(k) if k.len() < MIN_KEY_BYTES => Err(WeakKey { len: k.len() }),
            key => Ok(Sealer { key }),
        }
    }

    /// A fingerprint of the key (or of its absence) to store beside the chain, so that a store
    /// opened with another key is refused instead of appended to. It is an HMAC of a fixed
    /// text: with a key of 32 bytes or more it gives nothing away about the key.
    pub(crate) fn fingerprint(&self) -> String {
        match &self.key {
            None => "unkeyed".to_owned(),
            Some(_) => format!("hmac-sha256:{}", self.seal(b"silpgate compile.lock key fingerprint")),
        }
    }

    pub(crate) fn is_keyed(&self) -> bool {
        self.key.is_some()
    }

    fn seal(&self, bytes: &[u8]) -> String {
        match &self.key {
            None => sha256_hex(bytes),
            Some(key) => {
                let mut mac = hmac::Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes any key length");
                mac.update(bytes);
                let tag = mac.finalize().into_bytes();
                tag.iter().map(|b| format!("{b:02x}")).collect()
            }
        }
    }

    /// The record hash of `record` (its own `record_hash` is not part of it).
    pub(crate) fn record_hash(&self, record: &LockRecord) -> String {
        let mut canonical = String::with_capacity(256 + record.output.len());
        canonical.push_str("{\"seq\":");
        canonical.push_str(&record.seq.to_string());
        for (key, value) in [
            ("ir_hash", &record.ir_hash),
            ("frontend", &record.frontend),
            ("output", &record.output),
            ("output_hash", &record.output_hash),
            ("timestamp", &record.timestamp),
            ("prev_hash", &record.prev_hash),
        ]
        .into_iter()
        .chain(record.principal.as_ref().map(|subject| ("principal", subject)))
        {
            canonical.push_str(",\"");
            canonical.push_str(key);
            canonical.push_str("\":");
            json_text::write_str(&mut canonical, value);
        }
        canonical.push('}');
        self.seal(canonical.as_bytes())
    }

    /// Builds the next record of a chain whose last record hash is `prev_hash`.
    pub fn next(
        &self,
        seq: u64,
        prev_hash: &str,
        ir_hash: &str,
        frontend: &str,
        output: &str,
        (timestamp, principal): (String, Option<&str>),
    ) -> LockRecord {
        let mut record = LockRecord {
            seq,
            ir_hash: ir_hash.to_owned(),
            frontend: frontend.to_owned(),
            output: output.to_owned(),
            output_hash: format!("sha256:{}", sha256_hex(output.as_bytes())),
            timestamp,
            prev_hash: prev_hash.to_owned(),
            principal: principal.map(str::to_owned),
            record_hash: String::new(),
        };
        record.record_hash = self.record_hash(&record);
        record
    }

    /// The head that seals a chain of `records` records ending in `last_hash`.
    pub(crate) fn head(&self, records: u64, last_hash: &str) -> Head {
        let head_hash = self.seal(format!("silpgate-lock-head:{records}:{last_hash}").as_bytes());
        Head { records, last_hash: last_hash.to_owned(), head_hash }
    }
}

/// Why a chain does not verify: the first bad record and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("record {position}: {reason}")]
pub struct ChainError {
    /// 0-based position of the record in the chain or file (the head line counts as one).
    pub position: u64,
    pub reason: String,
}

/// Verifies records in chain order, and the head when there is one. Returns the record count.
pub(crate) fn verify<I>(records: I, head: Option<&Head>, sealer: &Sealer) -> Result<u64, ChainError>
where
    I: IntoIterator<Item = Result<LockRecord, ChainError>>,
{
    let mut prev_hash = GENESIS.to_owned();
    let mut count = 0u64;
    for record in records {
        let record = record?;
        let at = |reason: String| ChainError { position: count, reason };
        if record.seq != count {
            return Err(at(format!(
                "seq is {} where {count} was expected: a record was inserted, deleted or moved",
                record.seq
            )));
        }
        if record.prev_hash != prev_hash {
            return Err(at(
                "prev_hash does not match the record before it: a record was inserted, deleted or moved"
                    .into(),
            ));
        }
        if record.output_hash != format!("sha256:{}", sha256_hex(record.output.as_bytes())) {
            return Err(at("output does not match output_hash: the output was edited".into()));
        }
        if sealer.record_hash(&record) != record.record_hash {
            let why = if sealer.is_keyed() { "edited, or sealed with another key" } else { "edited" };
            return Err(at(format!("record_hash does not match the record: the record was {why}")));
        }
        prev_hash = record.record_hash;
        count += 1;
    }
    if let Some(head) = head {
        let expected = sealer.head(head.records, &head.last_hash);
        if expected.head_hash != head.head_hash {
            return Err(ChainError { position: count, reason: "the head line was edited".into() });
        }
        if head.records != count || head.last_hash != prev_hash {
            return Err(ChainError {
                position: count,
                reason: format!(
                    "the head seals {} records but {count} are present: the chain was truncated or extended",
                    head.records
                ),
            });
        }
    }
    Ok(count)
}

/// One line of the reference CLI's `.silp/compile.lock`: Python `json.dumps` with its default
/// separators, non-ASCII raw.
pub(crate) fn reference_line(record: &LockRecord) -> String {
    let short = record.ir_hash.strip_prefix("sha256:").unwrap_or(&record.ir_hash);
    let short = &short[..short.len().min(16)];
    let mut out = String::with_capacity(128 + record.output.len());
    for (i, (key, value)) in [
        ("ir_hash", short),
        ("frontend", record.frontend.as_str()),
        ("output", record.output.as_str()),
        ("timestamp", record.timestamp.as_str()),
        ("git_commit", ""),
    ]
    .into_iter()
    .enumerate()
    {
        out.push_str(if i == 0 { "{" } else { ", " });
        json_text::write_str(&mut out, key);
        out.push_str(": ");
        json_text::write_str(&mut out, value);
    }
    out.push('}');
    out
}

/// Reads a `chain` export: records, then the head line.
pub(crate) fn read_export(text: &str) -> (Vec<Result<LockRecord, ChainError>>, Option<Head>) {
    let mut records = Vec::new();
    let mut head = None;
    for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        if head.is_some() {
            records
                .push(Err(ChainError { position: i as u64, reason: "a line follows the head line".into() }));
            break;
        }
        if let Ok(h) = serde_json::from_str::<HeadLine>(line) {
            head = Some(h.head);
            continue;
        }
        records.push(
            serde_json::from_str::<LockRecord>(line)
                .map_err(|e| ChainError { position: i as u64, reason: format!("not a lock record: {e}") }),
        );
    }
    (records, head)
}

/// The head line as written: `{"head": {...}}`.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct HeadLine {
    pub head: Head,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chain(sealer: &Sealer, n: u64) -> Vec<LockRecord> {
        let mut prev = GENESIS.to_owned();
        (0..n)
            .map(|seq| {
                let r = sealer.next(
                    seq,
                    &prev,
                    &format!("sha256:{seq:064}"),
                    "code",
                    &format!("cancel(x{seq})"),
                    ("t".into(), None),
                );
                prev = r.record_hash.clone();
                r
            })
            .collect()
    }

    fn check(records: &[LockRecord], head: Option<&Head>, sealer: &Sealer) -> Result<u64, ChainError> {
        verify(records.iter().cloned().map(Ok), head, sealer)
    }

    const KEY: &[u8] = b"a compile.lock key of 32 bytes..";

    #[test]
    fn a_records_principal_is_sealed_with_it_and_one_without_hashes_as_before() {
        let sealer = Sealer::new(Some(KEY.to_vec())).unwrap();
        let plain = sealer.next(0, GENESIS, "sha256:00", "code", "cancel(x)", ("t".into(), None));
        let alices = sealer.next(0, GENESIS, "sha256:00", "code", "cancel(x)", ("t".into(), Some("alice")));
        assert_ne!(plain.record_hash, alices.record_hash, "the principal is part of the hash");
        assert_eq!(check(std::slice::from_ref(&alices), None, &sealer), Ok(1));
        let claimed = LockRecord { principal: Some("mallory".into()), ..alices.clone() };
        assert!(check(&[claimed], None, &sealer).is_err(), "another principal breaks the seal");
        let dropped = LockRecord { principal: None, ..alices };
        assert!(check(&[dropped], None, &sealer).is_err(), "so does removing it");
        assert!(!serde_json::to_string(&plain).unwrap().contains("principal"), "absent, not null");
    }

    #[test]
    fn an_intact_chain_verifies() {
        let sealer = Sealer::new(None).unwrap();
        let records = chain(&sealer, 5);
        let head = sealer.head(5, &records[4].record_hash);
        assert_eq!(check(&records, Some(&head), &sealer), Ok(5));
    }

    #[test]
    fn every_kind_of_tampering_is_caught_at_the_first_bad_record() {
        let sealer = Sealer::new(None).unwrap();
        let good = chain(&sealer, 5);
        let head = sealer.head(5, &good[4].record_hash);

        let mut edited = good.clone();
        edited[2].output = "cancel(evil)".into();
        assert_eq!(check(&edited, Some(&head), &sealer).unwrap_err().position, 2);

        let mut hash_edited = good.clone();
        hash_edited[1].record_hash = "f".repeat(64);
        assert_eq!(check(&hash_edited, Some(&head), &sealer).unwrap_err().position, 1);

        let mut deleted = good.clone();
        deleted.remove(3);
        assert_eq!(check(&deleted, Some(&head), &sealer).unwrap_err().position, 3);

        let mut inserted = good.clone();
        inserted.insert(1, good[0].clone());
        assert_eq!(check(&inserted, Some(&head), &sealer).unwrap_err().position, 1);

        let mut reordered = good.clone();
        reordered.swap(1, 2);
        assert_eq!(check(&reordered, Some(&head), &sealer).unwrap_err().position, 1);

        let truncated = &good[..4];
        let err = check(truncated, Some(&head), &sealer).unwrap_err();
        assert!(err.reason.contains("truncated"), "{err}");
    }

    #[test]
    fn a_keyed_chain_catches_a_full_rewrite_without_the_key() {
        let keyed = Sealer::new(Some(KEY.to_vec())).unwrap();
        let records = chain(&keyed, 3);
        let head = keyed.head(3, &records[2].record_hash);
        assert_eq!(check(&records, Some(&head), &keyed), Ok(3));

        // The attacker edits a record and recomputes every hash, without the key.
        let attacker = Sealer::new(None).unwrap();
        let mut rewritten = records.clone();
        rewritten[1].output = "cancel(evil)".into();
        let mut prev = GENESIS.to_owned();
        for r in &mut rewritten {
            r.prev_hash = prev.clone();
            r.output_hash = format!("sha256:{}", sha256_hex(r.output.as_bytes()));
            r.record_hash = attacker.record_hash(r);
            prev = r.record_hash.clone();
        }
        let forged_head = attacker.head(3, &prev);
        assert_eq!(
            check(&rewritten, Some(&forged_head), &attacker),
            Ok(3),
            "unkeyed, a rewrite is consistent"
        );
        let err = check(&rewritten, Some(&forged_head), &keyed).unwrap_err();
        assert_eq!(err.position, 0);
        assert!(err.reason.contains("another key"), "{err}");
    }

    #[test]
    fn short_keys_are_refused_and_fingerprints_tell_keys_apart() {
        assert_eq!(Sealer::new(Some(b"k".to_vec())).unwrap_err(), WeakKey { len: 1 });
        assert!(Sealer::new(Some(vec![7; MIN_KEY_BYTES - 1])).is_err());
        let one = Sealer::new(Some(KEY.to_vec())).unwrap();
        let other = Sealer::new(Some(vec![7; MIN_KEY_BYTES])).unwrap();
        assert_ne!(one.fingerprint(), other.fingerprint());
        assert_eq!(Sealer::new(None).unwrap().fingerprint(), "unkeyed");
    }

    #[test]
    fn reference_lines_look_like_the_reference_cli() {
        let sealer = Sealer::new(None).unwrap();
        let r = sealer.next(
            0,
            GENESIS,
            "sha256:824ed0a61e576ad3aaaa",
            "code",
            "if !rain(t+1): start(hike)",
            ("2026-11-29T20:40:46.072353+00:00".into(), None),
        );
        assert_eq!(
            reference_line(&r),
            r#"{"ir_hash": "824ed0a61e576ad3", "frontend": "code", "output": "if !rain(t+1): start(hike)", "timestamp": "2026-11-29T20:40:46.072353+00:00", "git_commit": ""}"#
        );
    }
}
