//! The sled store: every record kind survives a reopen, commits are atomic, the compile.lock
//! chain catches tampering (through the command line, on an exported file), session ids are
//! never shared, and the ledger stays bounded.

use silpgate::config::Config;
use silpgate::gateway::session::{SessionPolicy, count_turn};
use silpgate::gateway::store::{
    AgentProfile, Changes, Freeze, LedgerState, ProfileSource, Store, StoreError,
};
use silpgate::gateway::{Gateway, GatewayError, Inbound, Origin, Status, Transport};
use silpgate::nlip::{self, Encoding, Limits};
use silpgate::silp::Frontend;
use silpgate::store::chain::{GENESIS, Sealer};
use silpgate::store::{Retention, SCHEMA_VERSION, SledStore, keyed};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

fn temp_dir(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("store-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// The store's sled database opened directly, to plant or inspect raw records. sled lets go
/// of its file lock a moment after a store is dropped (its I/O threads finish first), so an
/// open right after a drop waits for it, as `SledStore::open` does.
fn raw_db(dir: &Path) -> sled::Db {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        match sled::open(dir) {
            Ok(db) => return db,
            Err(e) if e.to_string().contains("acquire lock") && std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            Err(e) => panic!("cannot open {}: {e}", dir.display()),
        }
    }
}

fn freeze(hash: &str, frontend: Frontend, output: &str) -> Freeze {
    Freeze { ir_hash: format!("sha256:{hash}"), frontend, output: output.into(), principal: None }
}

fn silpgate(args: &[&str]) -> (i32, String, String) {
    silpgate_with(args, &[])
}

/// Runs the command line with `vars` set in its own environment only: tests run in parallel,
/// so none changes the environment of the test process.
fn silpgate_with(args: &[&str], vars: &[(&str, &[u8])]) -> (i32, String, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_silpgate"));
    for (name, value) in vars {
        command.env(name, std::ffi::OsStr::from_bytes(value));
    }
    let out = command.args(args).output().expect("silpgate runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn every_record_kind_survives_a_reopen() {
    let dir = temp_dir("reopen");
    {
        let store = SledStore::open(&dir, None).unwrap();
        let policy = SessionPolicy { heartbeat: 5, idle_timeout_ms: 60_000, partition: None };
        let (_, session) =
            count_turn(&store, "conv-1", 10, &policy, silpgate::gateway::session::Party::Client(None))
                .unwrap();
        let profile = AgentProfile {
            frontends: vec![Frontend::Json, Frontend::Natural],
            source: ProfileSource::Ping,
            updated: 10,
            tokenizer: Some(silpgate::silp::tokens::Tokenizer::Cl100kBase),
        };
        let changes = Changes {
            sessions: vec![session],
            profiles: vec![("planner".into(), profile)],
            freezes: vec![freeze("aa", Frontend::Code, "cancel(x)")],
            ledger: vec![("m-1".into(), LedgerState::Pending { turn: None, session: None })],
            ..Changes::default()
        };
        let frozen = store.commit(&changes, 10).unwrap();
        assert!(frozen[0].first);
        store.flush().unwrap();
    }
    let store = SledStore::open(&dir, None).unwrap();
    let session = store.session_by_token("conv-1").unwrap().unwrap();
    assert_eq!((session.id, session.turns), (silpgate::gateway::session::id_for("conv-1"), 1));
    assert_eq!(store.profile("planner").unwrap().unwrap().frontends, vec![Frontend::Json, Frontend::Natural]);
    assert_eq!(store.frozen("sha256:aa", Frontend::Code).unwrap().as_deref(), Some("cancel(x)"));
    assert_eq!(store.ledger("m-1").unwrap(), Some(LedgerState::Pending { turn: None, session: None }));
    assert_eq!(store.verify_lock(), Ok(1));
}

#[test]
fn the_first_compile_is_frozen_and_drift_is_reported() {
    let store = SledStore::open(&temp_dir("freeze"), None).unwrap();
    let first = store
        .commit(&Changes { freezes: vec![freeze("bb", Frontend::Code, "a(1)")], ..Changes::default() }, 1)
        .unwrap();
    assert!(first[0].first && !first[0].drift);
    let again = store
        .commit(&Changes { freezes: vec![freeze("bb", Frontend::Code, "a(1)")], ..Changes::default() }, 2)
        .unwrap();
    assert!(!again[0].first && !again[0].drift);
    let drifted = store
        .commit(&Changes { freezes: vec![freeze("bb", Frontend::Code, "a(2)")], ..Changes::default() }, 3)
        .unwrap();
    assert_eq!((drifted[0].output.as_str(), drifted[0].drift), ("a(1)", true));
    // Another frontend of the same IR is its own entry.
    let json = store
        .commit(&Changes { freezes: vec![freeze("bb", Frontend::Json, "{}")], ..Changes::default() }, 4)
        .unwrap();
    assert!(json[0].first);
    assert_eq!(store.verify_lock(), Ok(2));
}

#[test]
fn a_commit_is_all_or_nothing() {
    let store = SledStore::open(&temp_dir("atomic"), None).unwrap();
    let policy = SessionPolicy { heartbeat: 5, idle_timeout_ms: 60_000, partition: None };
    let (_, first) =
        count_turn(&store, "conv-a", 1, &policy, silpgate::gateway::session::Party::Client(None)).unwrap();
    let (_, stale) =
        count_turn(&store, "conv-a", 1, &policy, silpgate::gateway::session::Party::Client(None)).unwrap();
    store
        .commit(
            &Changes { sessions: vec![first], turns_seen: vec![("conv-a".into(), 0)], ..Changes::default() },
            1,
        )
        .unwrap();
    // A turn planned on the state before, together with a lock record and a ledger entry.
    let changes = Changes {
        sessions: vec![stale],
        turns_seen: vec![("conv-a".into(), 0)],
        freezes: vec![freeze("cc", Frontend::Code, "x()")],
        ledger: vec![("m-9".into(), LedgerState::Pending { turn: None, session: None })],
        ..Changes::default()
    };
    assert!(matches!(store.commit(&changes, 2), Err(StoreError::Conflict(_))));
    assert_eq!(
        store.session_by_token("conv-a").unwrap().unwrap().turns,
        1,
        "the refused turn is not counted"
    );
    assert_eq!(store.frozen("sha256:cc", Frontend::Code).unwrap(), None);
    assert_eq!(store.ledger("m-9").unwrap(), None);
    assert_eq!(store.verify_lock(), Ok(0));
}

#[test]
fn live_sessions_are_not_capped_and_idle_ones_expire_then_are_forgotten() {
    let store = SledStore::open(&temp_dir("pressure"), None).unwrap();
    let policy = SessionPolicy { heartbeat: 10, idle_timeout_ms: 1_000, partition: None };
    let turn = |token: &str, now: u64| -> Result<(String, u64), GatewayError> {
        let (turn, record) =
            count_turn(&store, token, now, &policy, silpgate::gateway::session::Party::Client(None))?;
        let seen = vec![(record.token.clone(), record.turns - 1)];
        store.commit(&Changes { sessions: vec![record], turns_seen: seen, ..Changes::default() }, now)?;
        Ok((turn.id, turn.turn))
    };
    // More live conversations than there are two-character ids: none is refused.
    const N: usize = 3_000;
    for i in 0..N {
        let (id, first) = turn(&format!("c{i}"), 0).unwrap();
        assert_eq!((id.len(), first), (2, 1));
    }
    assert_eq!(store.sessions().unwrap().len(), N);

    // Half the conversations stay active; the other half go idle, expire, then are forgotten.
    for i in (0..N).step_by(2) {
        turn(&format!("c{i}"), 900).unwrap();
    }
    let retention = Retention {
        ledger_ttl_ms: u64::MAX,
        ledger_max_entries: usize::MAX,
        session_idle_ms: 1_000,
        tombstone_ms: 500,
    };
    let swept = store.sweep(1_500, &retention).unwrap();
    assert_eq!(swept.sessions_expired, N / 2);
    assert!(matches!(turn("c1", 1_600), Err(GatewayError::SessionExpired { .. })), "a tombstone answers");
    for i in (0..N).step_by(2) {
        turn(&format!("c{i}"), 1_800).unwrap();
    }
    let swept = store.sweep(2_600, &retention).unwrap();
    assert_eq!(swept.sessions_forgotten, N / 2);
    assert_eq!(turn("c1", 2_600).unwrap().1, 1, "a forgotten conversation starts a new session");
    assert_eq!(turn("c0", 2_600).unwrap().1, 4, "a live one keeps counting");
}

#[test]
fn the_ledger_is_bounded_by_age_and_size() {
    let store = SledStore::open(&temp_dir("ledger"), None).unwrap();
    for i in 0..100u64 {
        store
            .commit(
                &Changes { ledger: vec![(format!("m{i}"), LedgerState::Published)], ..Changes::default() },
                i,
            )
            .unwrap();
    }
    let retention = Retention {
        ledger_ttl_ms: 50,
        ledger_max_entries: 30,
        session_idle_ms: u64::MAX / 4,
        tombstone_ms: 0,
    };
    let swept = store.sweep(100, &retention).unwrap();
    // Older than 50 ms: m0..m49 go; then the cap of 30 takes the next oldest 20.
    assert_eq!(swept.ledger_dropped, 70);
    assert_eq!(store.ledger_len().unwrap(), 30);
    assert_eq!(store.ledger("m69").unwrap(), None);
    assert_eq!(store.ledger("m70").unwrap(), Some(LedgerState::Published));
}

#[test]
fn a_ledger_entry_names_its_principal_and_keeps_it_when_marked_published() {
    let dir = temp_dir("ledger-principal");
    let store = SledStore::open(&dir, None).unwrap();
    let pending = LedgerState::Pending { turn: None, session: None };
    let by = |principal: Option<&str>, id: &str, state: LedgerState| Changes {
        ledger: vec![(id.to_owned(), state)],
        principal: principal.map(str::to_owned),
        ..Changes::default()
    };
    store.commit(&by(Some("alice"), "m1", pending.clone()), 1).unwrap();
    store.commit(&by(None, "m2", pending), 1).unwrap();
    // The batched mark names nobody: the entry keeps its principal.
    store.commit(&by(None, "m1", LedgerState::Published), 2).unwrap();
    assert_eq!(store.ledger("m1").unwrap(), Some(LedgerState::Published));
    assert_eq!(store.ledger_principal("m1").unwrap().as_deref(), Some("alice"));
    assert_eq!(store.ledger_principal("m2").unwrap(), None);
    drop(store);
    let reopened = SledStore::open(&dir, None).unwrap();
    assert_eq!(reopened.ledger_principal("m1").unwrap().as_deref(), Some("alice"), "after a reopen");
}

#[test]
fn a_store_of_another_schema_version_is_refused() {
    let dir = temp_dir("schema");
    {
        let db = raw_db(&dir);
        db.insert("meta:schema_version", "0").unwrap();
        db.flush().unwrap();
    }
    let err = SledStore::open(&dir, None).err().expect("refused");
    assert!(matches!(err, StoreError::Corrupt(ref m) if m.contains("schema version 0")), "{err}");
}

/// The variable the keyed tests hand their key to the command line in.
const KEY_VAR: &str = "SILPGATE_TEST_LOCK_KEY";
const KEY: &[u8] = b"correct horse battery staple, 32+";

fn key_args(args: &mut Vec<&str>, key: Option<&[u8]>) {
    if key.is_some() {
        args.extend(["--key-env", KEY_VAR]);
    }
}

fn key_vars(key: Option<&[u8]>) -> Vec<(&'static str, &[u8])> {
    key.map(|k| vec![(KEY_VAR, k)]).unwrap_or_default()
}

fn export(dir: &Path, key: Option<&[u8]>) -> Vec<String> {
    let mut args = vec!["lock", "export", "--store", dir.to_str().unwrap()];
    key_args(&mut args, key);
    let (code, out, err) = silpgate_with(&args, &key_vars(key));
    assert_eq!(code, 0, "{err}");
    out.lines().map(str::to_owned).collect()
}

/// Verifies `lines` as an export file of its own, named after `name` (tests run in parallel).
fn verify_file(name: &str, lines: &[String], key: Option<&[u8]>) -> (i32, String) {
    let file = temp_dir(name).with_extension("jsonl");
    std::fs::write(&file, lines.join("\n") + "\n").unwrap();
    let mut args = vec!["lock", "verify", "--file", file.to_str().unwrap()];
    key_args(&mut args, key);
    let (code, out, _) = silpgate_with(&args, &key_vars(key));
    (code, out)
}

fn verify_store(dir: &Path, key: Option<&[u8]>) -> (i32, String, String) {
    let mut args = vec!["lock", "verify", "--store", dir.to_str().unwrap()];
    key_args(&mut args, key);
    silpgate_with(&args, &key_vars(key))
}

fn filled_store(name: &str, key: Option<&[u8]>) -> PathBuf {
    let dir = temp_dir(name);
    let store = SledStore::open(&dir, key.map(<[u8]>::to_vec)).unwrap();
    for i in 0..5 {
        store
            .commit(
                &Changes {
                    freezes: vec![freeze(&format!("{i:064}"), Frontend::Code, &format!("cancel(x{i})"))],
                    ..Changes::default()
                },
                i,
            )
            .unwrap();
    }
    store.flush().unwrap();
    dir
}

#[test]
fn lock_verify_names_the_first_bad_record_of_a_tampered_export() {
    let dir = filled_store("tamper", None);
    let (code, out, _) = silpgate(&["lock", "verify", "--store", dir.to_str().unwrap()]);
    assert_eq!((code, out.trim()), (0, "ok: 5 records, chain intact (unkeyed)"));
    let good = export(&dir, None);
    assert_eq!(good.len(), 6, "5 records and the head line");
    let verify_file = |lines: &[String], key: Option<&[u8]>| verify_file("tamper-export", lines, key);
    assert_eq!(verify_file(&good, None).0, 0);

    let mut edited = good.clone();
    edited[2] = edited[2].replace("cancel(x2)", "cancel(evil)");
    let (code, out) = verify_file(&edited, None);
    assert_eq!(code, 1);
    assert!(out.contains("record 2: output does not match output_hash"), "{out}");

    let mut hash_edited = good.clone();
    let v: serde_json::Value = serde_json::from_str(&hash_edited[1]).unwrap();
    let old = v["record_hash"].as_str().unwrap().to_owned();
    hash_edited[1] = hash_edited[1].replace(&old, &"0".repeat(64));
    let (code, out) = verify_file(&hash_edited, None);
    assert!(code == 1 && out.contains("record 1: record_hash does not match"), "{out}");

    let mut deleted = good.clone();
    deleted.remove(3);
    let (code, out) = verify_file(&deleted, None);
    assert!(code == 1 && out.contains("record 3: seq is 4 where 3 was expected"), "{out}");

    let mut inserted = good.clone();
    inserted.insert(1, good[0].clone());
    let (code, out) = verify_file(&inserted, None);
    assert!(code == 1 && out.contains("record 1:"), "{out}");

    let mut reordered = good.clone();
    reordered.swap(1, 2);
    let (code, out) = verify_file(&reordered, None);
    assert!(code == 1 && out.contains("record 1:"), "{out}");

    let mut truncated = good.clone();
    truncated.remove(4);
    let (code, out) = verify_file(&truncated, None);
    assert!(code == 1 && out.contains("truncated"), "{out}");
    let (code, out) = verify_file(&good[..4], None);
    assert!(code == 1 && out.contains("no head line"), "{out}");
}

#[test]
fn a_keyed_chain_catches_a_rewrite_without_the_key() {
    let dir = filled_store("keyed", Some(KEY));
    let good = export(&dir, Some(KEY));
    assert_eq!(verify_file("keyed-export", &good, Some(KEY)).0, 0);
    // Without the key the hashes are plain SHA-256: an attacker can rewrite the chain
    // consistently, and only the key tells.
    let (code, out) = verify_file("keyed-export-unkeyed", &good, None);
    assert_eq!(code, 1, "{out}");
    let (code, out, _) = verify_store(&dir, Some(KEY));
    assert_eq!(code, 0, "{out}");
    let (code, _, err) =
        silpgate(&["lock", "verify", "--store", dir.to_str().unwrap(), "--key-env", "SILPGATE_UNSET_KEY"]);
    assert!(code == 2 && err.contains("SILPGATE_UNSET_KEY"), "{err}");
}

/// The chunks under `prefix` in `db`, by sled key (the store must be closed).
fn raw_chunks(db: &sled::Db, prefix: &[u8]) -> Vec<(Vec<u8>, keyed::Chunk)> {
    db.scan_prefix(prefix)
        .map(|entry| {
            let (key, bytes) = entry.unwrap();
            (key.to_vec(), keyed::decode_chunk(&bytes).unwrap())
        })
        .collect()
}

/// The records of a closed store's chain, read directly from sled.
fn raw_records(db: &sled::Db) -> Vec<serde_json::Value> {
    raw_chunks(db, keyed::LOCK_RECORDS.physical)
        .into_iter()
        .flat_map(|(_, chunk)| chunk.into_values())
        .map(|v| serde_json::from_slice(&v).unwrap())
        .collect()
}

/// Replaces the records of a closed store's chain (all in its first chunk) with `records`.
fn write_raw_records(db: &sled::Db, records: &[serde_json::Value]) {
    let chunk: keyed::Chunk = records
        .iter()
        .map(|r| (r["seq"].as_u64().unwrap().to_be_bytes().to_vec(), serde_json::to_vec(r).unwrap()))
        .collect();
    db.insert(keyed::LOCK_RECORDS.chunk_key(0), keyed::encode_chunk(&chunk)).unwrap();
}

/// The head anyone without a key can write for an unkeyed chain, or a keyed one rewritten
/// without its key.
fn plain_head(records: u64, last: &str) -> Vec<u8> {
    let head_hash =
        silpgate::util::hash::sha256_hex(format!("silpgate-lock-head:{records}:{last}").as_bytes());
    serde_json::to_vec(&serde_json::json!({"records": records, "last_hash": last, "head_hash": head_hash}))
        .unwrap()
}

#[test]
fn deleting_the_last_records_and_rewriting_the_head_without_the_key_is_caught() {
    let dir = filled_store("head", Some(KEY));
    {
        let db = raw_db(&dir);
        let records = raw_records(&db);
        // Drop the last record, and write a head for the shorter chain the way anyone without
        // the key can: with plain SHA-256.
        write_raw_records(&db, &records[..4]);
        db.insert("meta:lock_head", plain_head(4, records[3]["record_hash"].as_str().unwrap())).unwrap();
        db.flush().unwrap();
    }
    let (code, out, err) = verify_store(&dir, Some(KEY));
    assert_eq!(code, 1, "the shortened chain must not verify: {out}{err}");
    assert!(err.contains("head is not sealed by this store's key"), "{err}");
    // The daemon's way in refuses the store too, before anything is appended.
    assert!(matches!(SledStore::open(&dir, Some(KEY.to_vec())), Err(StoreError::Corrupt(_))));
}

/// The index is rebuilt from the chain, so it cannot be pointed elsewhere; what is left to
/// catch is a chain that freezes one entry twice. Unkeyed, anyone can write one whose hashes
/// all hold.
#[test]
fn a_chain_rewritten_to_freeze_one_entry_twice_is_caught_and_the_first_freeze_is_served() {
    let dir = filled_store("index", None);
    {
        let db = raw_db(&dir);
        let mut records = raw_records(&db);
        let sealer = Sealer::new(None).unwrap();
        let mut prev = records[1]["record_hash"].as_str().unwrap().to_owned();
        for seq in 2..5u64 {
            let i = seq as usize;
            let ir_hash =
                if seq == 2 { records[1]["ir_hash"].clone() } else { records[i]["ir_hash"].clone() };
            let record = sealer.next(
                seq,
                &prev,
                ir_hash.as_str().unwrap(),
                "code",
                records[i]["output"].as_str().unwrap(),
                (records[i]["timestamp"].as_str().unwrap().to_owned(), None),
            );
            prev = record.record_hash.clone();
            records[i] = serde_json::to_value(record).unwrap();
        }
        write_raw_records(&db, &records);
        db.insert("meta:lock_head", plain_head(5, &prev)).unwrap();
        db.flush().unwrap();
    }
    let (code, out, _) = verify_store(&dir, None);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("record 2 freezes (code, sha256:") && out.contains("frozen first by record 1"),
        "{out}"
    );
    let (code, out, err) =
        silpgate(&["lock", "show", "--store", dir.to_str().unwrap(), &format!("{:064}", 1)]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("cancel(x1)") && !out.contains("cancel(x2)"), "the first freeze is served: {out}");
}

fn compile_into(dir: &Path, key: Option<&[u8]>, text: &str) -> (i32, String, String) {
    let ir = format!(
        r#"{{"silp":"v1","version":"ir-v0.1","intent":"!CANCEL","entities":[{{"id":"x","value":"{text}","action":"!CANCEL"}}],"constraints":[],"alternatives":[],"meta":{{"priority":0,"confidence":1.0,"seq":[],"out":"code","req_id":"0000"}}}}"#
    );
    let ir_file = temp_dir(&format!("ir-{text}")).with_extension("json");
    std::fs::write(&ir_file, ir).unwrap();
    let mut args = vec!["silp", "compile", "--frontend", "code", "--lock", dir.to_str().unwrap()];
    key_args(&mut args, key);
    args.push(ir_file.to_str().unwrap());
    silpgate_with(&args, &key_vars(key))
}

#[test]
fn a_store_is_never_appended_to_under_another_key_or_none() {
    let dir = filled_store("wrong-key", Some(KEY));
    let other: &[u8] = b"another key, also 32 bytes or more";
    let (code, out, err) = compile_into(&dir, Some(other), "one");
    assert_eq!(code, 1, "appended under another key: {out}");
    assert!(err.contains("not the key this store's compile.lock was sealed with"), "{err}");
    assert!(!err.contains("another key, also"), "the key is never shown: {err}");
    let (code, out, err) = compile_into(&dir, None, "two");
    assert_eq!(code, 1, "appended without a key: {out}");
    assert!(err.contains("is keyed, but no key was given"), "{err}");
    let (code, out, err) = verify_store(&dir, Some(KEY));
    assert_eq!((code, out.trim()), (0, "ok: 5 records, chain intact (keyed)"), "{err}");
    // An unkeyed store is not sealed with a key after the fact either.
    let plain = filled_store("wrong-key-plain", None);
    let (code, _, err) = compile_into(&plain, Some(KEY), "three");
    assert!(code == 1 && err.contains("is unkeyed, but a key was given"), "{err}");
}

#[test]
fn a_key_shorter_than_32_bytes_is_refused_and_never_shown() {
    let dir = filled_store("short-key", None);
    let (code, _, err) = verify_store(&dir, Some(b"k"));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("1 bytes; a key must have at least 32"), "{err}");
    let (code, _, err) = compile_into(&temp_dir("short-key-new"), Some(b"s3cr3t-short-key"), "x");
    assert!(code == 1 && err.contains("at least 32") && !err.contains("s3cr3t"), "{err}");
    assert!(matches!(
        SledStore::open(&temp_dir("short-key-open"), Some(vec![1; 31])),
        Err(StoreError::Key(_))
    ));
}

/// A compile.lock record's own key, as layouts 3 to 6 stored it.
fn lock_key(seq: u64) -> Vec<u8> {
    [b"lock:".as_slice(), &seq.to_be_bytes()].concat()
}

#[test]
fn a_store_of_the_previous_layout_is_migrated_with_its_key_and_refused_with_another() {
    let write_v3 = |name: &str| {
        let dir = temp_dir(name);
        let db = raw_db(&dir);
        let sealer = Sealer::new(Some(KEY.to_vec())).unwrap();
        let mut prev = GENESIS.to_owned();
        for seq in 0..3u64 {
            let ir_hash = format!("sha256:{seq:064}");
            let r = sealer.next(seq, &prev, &ir_hash, "code", &format!("cancel(x{seq})"), ("t".into(), None));
            db.insert(lock_key(seq), serde_json::to_vec(&r).unwrap()).unwrap();
            db.insert([b"lockx:code\0".as_slice(), ir_hash.as_bytes()].concat(), &seq.to_be_bytes()).unwrap();
            prev = r.record_hash;
        }
        let head = serde_json::json!({"records": 3, "last_hash": prev});
        db.insert("meta:lock_head", serde_json::to_vec(&head).unwrap()).unwrap();
        db.insert("meta:schema_version", "3").unwrap();
        db.flush().unwrap();
        dir
    };
    let dir = write_v3("v3-wrong-key");
    let err = SledStore::open(&dir, Some(b"another key, also 32 bytes or more".to_vec())).err().unwrap();
    assert!(matches!(err, StoreError::Key(ref m) if m.contains("cannot migrate")), "{err}");
    let err = SledStore::open(&dir, None).err().unwrap();
    assert!(matches!(err, StoreError::Key(ref m) if m.contains("open it with its key")), "{err}");

    let dir = write_v3("v3");
    {
        let store = SledStore::open(&dir, Some(KEY.to_vec())).unwrap();
        assert_eq!(store.verify_lock(), Ok(3));
    }
    let db = raw_db(&dir);
    assert_eq!(db.get("meta:schema_version").unwrap().unwrap().as_ref(), SCHEMA_VERSION.as_bytes());
    drop(db);
    let (code, out, err) = verify_store(&dir, Some(KEY));
    assert_eq!((code, out.trim()), (0, "ok: 3 records, chain intact (keyed)"), "{err}");
}

#[test]
fn reference_export_and_show_and_sessions_list() {
    let dir = filled_store("formats", None);
    let (code, out, _) =
        silpgate(&["lock", "export", "--store", dir.to_str().unwrap(), "--format", "reference"]);
    assert_eq!(code, 0);
    let first = out.lines().next().unwrap();
    assert!(
        first.starts_with(
            r#"{"ir_hash": "0000000000000000", "frontend": "code", "output": "cancel(x0)", "timestamp": ""#
        ),
        "{first}"
    );
    assert!(first.ends_with(r#""git_commit": ""}"#), "{first}");
    let (code, out, _) = silpgate(&["lock", "show", "--store", dir.to_str().unwrap(), &format!("{:064}", 3)]);
    assert_eq!(code, 0);
    assert!(out.contains("\"output\":\"cancel(x3)\""), "{out}");
    let (code, out, _) = silpgate(&["sessions", "list", "--store", dir.to_str().unwrap()]);
    assert_eq!((code, out.as_str()), (0, ""));
}

#[test]
fn the_gateway_runs_on_the_sled_store_and_its_state_persists() {
    let dir = temp_dir("gateway");
    let config = Arc::new(Config::parse("[[agents]]\nname = \"a\"\nfrontends = [\"code\"]\n[[routes]]\nname = \"r\"\ndestination = \"a\"\nmode = \"encode\"\n").unwrap());
    let envelope = r#"{"format":"structured","subformat":"silp-code","content":"cancel(flight)","submessages":[{"format":"token","subformat":"conversation","content":"c"}]}"#;
    let send = |store: Arc<dyn Store>, id: &str| {
        let g = Gateway::new(config.clone(), store);
        let mut origin = Origin::new(Transport::Amqp, "in");
        origin.message_id = Some(id.into());
        let message = nlip::decode(envelope.as_bytes(), Encoding::Json, &Limits::default()).unwrap();
        let o = g.handle(Inbound { envelope: message, origin, received_at: 5 });
        g.store().flush().unwrap();
        o
    };
    {
        let store = Arc::new(SledStore::open(&dir, None).unwrap());
        assert!(matches!(send(store.clone(), "m1").status, Status::Delivered));
        store
            .commit(&Changes { ledger: vec![("m1".into(), LedgerState::Published)], ..Changes::default() }, 6)
            .unwrap();
        store.flush().unwrap();
    }
    let store = Arc::new(SledStore::open(&dir, None).unwrap());
    assert!(
        matches!(send(store.clone(), "m1").status, Status::Duplicate),
        "the redelivery is recognised after a restart"
    );
    assert!(matches!(send(store.clone(), "m2").status, Status::Delivered));
    assert_eq!(store.session_by_token("c").unwrap().unwrap().turns, 2);
    assert_eq!(store.verify_lock(), Ok(1));
}

#[test]
fn profiles_learnt_from_ping_are_swept_when_idle() {
    let store = SledStore::open(&temp_dir("profiles"), None).unwrap();
    let profile = |updated| AgentProfile {
        frontends: vec![Frontend::Json],
        source: ProfileSource::Ping,
        updated,
        tokenizer: None,
    };
    let changes = Changes {
        profiles: vec![("idle".into(), profile(0)), ("active".into(), profile(900))],
        ..Changes::default()
    };
    store.commit(&changes, 900).unwrap();
    let retention = Retention {
        ledger_ttl_ms: u64::MAX,
        ledger_max_entries: usize::MAX,
        session_idle_ms: 1_000,
        tombstone_ms: 500,
    };
    let swept = store.sweep(1_500, &retention).unwrap();
    assert_eq!(swept.profiles_forgotten, 1);
    assert_eq!(store.profile("idle").unwrap(), None);
    assert_eq!(store.profile("active").unwrap(), Some(profile(900)));
    assert_eq!(store.profile_count().unwrap(), 1);
}

#[test]
fn a_store_of_layout_4_drops_its_session_id_index_and_keeps_its_sessions() {
    let dir = temp_dir("v4");
    {
        // A layout-5 store written, then turned back into layout 4: version 4 and the
        // `sid:<id>` allocation index of that layout.
        let store = SledStore::open(&dir, None).unwrap();
        let policy = SessionPolicy { heartbeat: 5, idle_timeout_ms: 60_000, partition: None };
        let (_, session) =
            count_turn(&store, "conv-old", 10, &policy, silpgate::gateway::session::Party::Client(None))
                .unwrap();
        store.commit(&Changes { sessions: vec![session], ..Changes::default() }, 10).unwrap();
        store.flush().unwrap();
    }
    {
        let db = raw_db(&dir);
        db.insert("meta:schema_version", "4").unwrap();
        db.insert("sid:aa", "conv-old").unwrap();
        db.flush().unwrap();
    }
    let store = SledStore::open(&dir, None).expect("a layout-4 store opens, migrated");
    let session = store.session_by_token("conv-old").unwrap().expect("its sessions are kept");
    assert_eq!(session.turns, 1);
    drop(store);
    let db = raw_db(&dir);
    assert_eq!(db.get("meta:schema_version").unwrap().unwrap().as_ref(), SCHEMA_VERSION.as_bytes());
    assert_eq!(db.scan_prefix("sid:").count(), 0, "the allocation index is gone");
}

/// Turns a closed store of the current layout back into layout 6: every compile.lock record,
/// index entry, ledger entry and ledger time key under its own sled key.
fn unpack_to_layout_6(db: &sled::Db) {
    for (chunk_key, chunk) in raw_chunks(db, keyed::LOCK_RECORDS.physical) {
        for (seq, record) in chunk {
            let r: serde_json::Value = serde_json::from_slice(&record).unwrap();
            let index = [
                b"lockx:".as_slice(),
                &keyed::lock_index_member(r["frontend"].as_str().unwrap(), r["ir_hash"].as_str().unwrap()),
            ]
            .concat();
            db.insert(index, seq.as_slice()).unwrap();
            db.insert([b"lock:".as_slice(), &seq].concat(), record).unwrap();
        }
        db.remove(chunk_key).unwrap();
    }
    for (chunk_key, chunk) in raw_chunks(db, keyed::LEDGER_CHUNKS) {
        for (member, entry) in chunk {
            db.insert([b"ledgert:".as_slice(), &member].concat(), b"").unwrap();
            db.insert([b"ledger:".as_slice(), &member[8..]].concat(), entry).unwrap();
        }
        db.remove(chunk_key).unwrap();
    }
    db.insert("meta:schema_version", "6").unwrap();
    db.flush().unwrap();
}

#[test]
fn a_store_of_layout_6_is_packed_into_chunks_with_everything_it_held() {
    let dir = temp_dir("v6");
    let records = 70u64;
    {
        let store = SledStore::open(&dir, None).unwrap();
        let policy = SessionPolicy { heartbeat: 5, idle_timeout_ms: 60_000, partition: None };
        let (_, session) =
            count_turn(&store, "conv-6", 10, &policy, silpgate::gateway::session::Party::Client(None))
                .unwrap();
        let freezes =
            (0..records).map(|i| freeze(&format!("{i:064}"), Frontend::Code, &format!("cancel(x{i})")));
        let changes = Changes {
            sessions: vec![session],
            freezes: freezes.collect(),
            ledger: (0..5).map(|i| (format!("m-{i}"), LedgerState::Published)).collect(),
            ..Changes::default()
        };
        store.commit(&changes, 10).unwrap();
        store.flush().unwrap();
    }
    {
        let db = raw_db(&dir);
        assert_eq!(db.scan_prefix("journal:").count(), 0, "a closed store leaves no journal");
        assert_eq!(raw_chunks(&db, keyed::LOCK_RECORDS.physical).len(), 3, "70 records in chunks of 32");
        unpack_to_layout_6(&db);
        assert_eq!(db.scan_prefix("lock:").count(), 70);
        assert_eq!(db.scan_prefix("ledger:").count(), 5);
    }
    let (code, out, err) = silpgate(&["sessions", "list", "--store", dir.to_str().unwrap()]);
    assert_eq!(code, 0, "a layout-6 store is readable without its key: {err}");
    assert!(out.contains("conv-6"), "{out}");
    let store = SledStore::open(&dir, None).expect("a layout-6 store opens, migrated");
    assert_eq!(store.session_by_token("conv-6").unwrap().expect("its sessions are kept").turns, 1);
    assert_eq!(store.ledger("m-4").unwrap(), Some(LedgerState::Published));
    assert_eq!(store.verify_lock(), Ok(records));
    assert_eq!(
        store.frozen(&format!("sha256:{:064}", 41), Frontend::Code).unwrap().as_deref(),
        Some("cancel(x41)")
    );
    // The ledger's time index moved with it: an age limit still finds every entry.
    let retention = Retention {
        ledger_ttl_ms: 0,
        ledger_max_entries: 100,
        session_idle_ms: 60_000,
        tombstone_ms: 60_000,
    };
    assert_eq!(store.sweep(1_000, &retention).unwrap().ledger_dropped, 5);
    assert_eq!(store.ledger("m-4").unwrap(), None);
    drop(store);
    let db = raw_db(&dir);
    assert_eq!(db.get("meta:schema_version").unwrap().unwrap().as_ref(), SCHEMA_VERSION.as_bytes());
    assert_eq!(SCHEMA_VERSION, "7");
    for gone in ["lock:", "lockx:", "ledger:", "ledgert:"] {
        assert_eq!(db.scan_prefix(gone).count(), 0, "no {gone} key is left");
    }
    assert_eq!(raw_chunks(&db, keyed::LOCK_RECORDS.physical).len(), 3);
    assert_eq!(raw_chunks(&db, keyed::LEDGER_CHUNKS).len(), 0, "the swept entries took their chunk");
}

/// Commits wait in memory until a flush hands them to sled as one batch; readers see them
/// before that, and none is lost or counted twice when many threads commit, read and flush at
/// once. Checked after a reopen, against sled itself.
#[test]
fn concurrent_commits_and_flushes_count_every_turn_once_and_survive_a_reopen() {
    const THREADS: usize = 4;
    const TURNS: u64 = 300;
    let dir = temp_dir("staged-concurrent");
    {
        let store = Arc::new(SledStore::open(&dir, None).unwrap());
        let policy = SessionPolicy { heartbeat: 1_000, idle_timeout_ms: u64::MAX / 4, partition: None };
        let workers: Vec<_> = (0..THREADS)
            .map(|t| {
                let store = store.clone();
                std::thread::spawn(move || {
                    for turn in 1..=TURNS {
                        // Two conversations per thread, so that a thread's commits interleave
                        // with its own earlier, still unflushed, ones.
                        let token = format!("conv-{t}-{}", turn % 2);
                        let (_, session) = count_turn(
                            &*store,
                            &token,
                            turn,
                            &policy,
                            silpgate::gateway::session::Party::Client(None),
                        )
                        .unwrap();
                        let changes = Changes {
                            turns_seen: vec![(token.clone(), session.turns - 1)],
                            sessions: vec![session],
                            freezes: vec![freeze(&format!("{t:04}{turn:060}"), Frontend::Code, "x()")],
                            ledger: vec![(format!("m-{t}-{turn}"), LedgerState::Published)],
                            ..Changes::default()
                        };
                        store.commit(&changes, turn).unwrap();
                        assert_eq!(
                            store.ledger(&format!("m-{t}-{turn}")).unwrap(),
                            Some(LedgerState::Published),
                            "a commit is read back before any flush"
                        );
                        if turn % 7 == 0 {
                            store.flush().unwrap();
                        }
                    }
                })
            })
            .collect();
        for worker in workers {
            worker.join().unwrap();
        }
        // What was committed after the last flush is written when the store closes.
    }
    let store = SledStore::open(&dir, None).unwrap();
    for t in 0..THREADS {
        for parity in 0..2 {
            let session = store.session_by_token(&format!("conv-{t}-{parity}")).unwrap().expect("kept");
            assert_eq!(session.turns, TURNS / 2, "conv-{t}-{parity}: every turn counted once");
        }
    }
    assert_eq!(store.ledger_len().unwrap(), THREADS * TURNS as usize);
    assert_eq!(store.verify_lock().unwrap(), (THREADS as u64) * TURNS, "one chain, every record in it");
}
