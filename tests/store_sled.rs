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
use silpgate::store::{Retention, SledStore};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

fn temp_dir(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("store-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn freeze(hash: &str, frontend: Frontend, output: &str) -> Freeze {
    Freeze { ir_hash: format!("sha256:{hash}"), frontend, output: output.into() }
}

fn silpgate(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_silpgate")).args(args).output().expect("silpgate runs");
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
        let (_, session) = count_turn(&store, "conv-1", 10, &policy).unwrap();
        let profile = AgentProfile {
            frontends: vec![Frontend::Json, Frontend::Natural],
            source: ProfileSource::Ping,
            updated: 10,
        };
        let changes = Changes {
            sessions: vec![session],
            profiles: vec![("planner".into(), profile)],
            freezes: vec![freeze("aa", Frontend::Code, "cancel(x)")],
            ledger: vec![("m-1".into(), LedgerState::Pending { turn: None })],
            ..Changes::default()
        };
        let frozen = store.commit(&changes, 10).unwrap();
        assert!(frozen[0].first);
        store.flush().unwrap();
    }
    let store = SledStore::open(&dir, None).unwrap();
    let session = store.session_by_token("conv-1").unwrap().unwrap();
    assert_eq!((session.id.as_str(), session.turns), ("aa", 1));
    assert_eq!(store.profile("planner").unwrap().unwrap().frontends, vec![Frontend::Json, Frontend::Natural]);
    assert_eq!(store.frozen("sha256:aa", Frontend::Code).unwrap().as_deref(), Some("cancel(x)"));
    assert_eq!(store.ledger("m-1").unwrap(), Some(LedgerState::Pending { turn: None }));
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
    let (_, a) = count_turn(&store, "conv-a", 1, &policy).unwrap();
    store.commit(&Changes { sessions: vec![a.clone()], ..Changes::default() }, 1).unwrap();
    // A second conversation claiming the same id, together with a lock record and a ledger entry.
    let thief = silpgate::gateway::store::SessionRecord { token: "conv-b".into(), ..a };
    let changes = Changes {
        sessions: vec![thief],
        freezes: vec![freeze("cc", Frontend::Code, "x()")],
        ledger: vec![("m-9".into(), LedgerState::Pending { turn: None })],
        ..Changes::default()
    };
    assert!(matches!(store.commit(&changes, 2), Err(StoreError::Conflict(_))));
    assert_eq!(store.session_by_token("conv-b").unwrap(), None);
    assert_eq!(store.frozen("sha256:cc", Frontend::Code).unwrap(), None);
    assert_eq!(store.ledger("m-9").unwrap(), None);
    assert_eq!(store.verify_lock(), Ok(0));
}

#[test]
fn session_ids_are_never_shared_and_expiry_frees_them() {
    let store = SledStore::open(&temp_dir("pressure"), None).unwrap();
    let policy = SessionPolicy { heartbeat: 10, idle_timeout_ms: 1_000, partition: None };
    let turn = |token: &str, now: u64| -> Result<String, GatewayError> {
        let (turn, record) = count_turn(&store, token, now, &policy)?;
        store.commit(&Changes { sessions: vec![record], ..Changes::default() }, now)?;
        Ok(turn.id)
    };
    let mut ids = std::collections::HashSet::new();
    for i in 0..1296 {
        assert!(ids.insert(turn(&format!("c{i}"), 0).unwrap()), "id handed out twice");
    }
    assert!(matches!(turn("one-too-many", 0), Err(GatewayError::SessionsExhausted)));

    // Half the conversations stay active; the other half go idle, expire, then are forgotten.
    for i in (0..1296).step_by(2) {
        turn(&format!("c{i}"), 900).unwrap();
    }
    let retention = Retention {
        ledger_ttl_ms: u64::MAX,
        ledger_max_entries: usize::MAX,
        session_idle_ms: 1_000,
        tombstone_ms: 500,
    };
    let swept = store.sweep(1_500, &retention).unwrap();
    assert_eq!(swept.sessions_expired, 648);
    assert!(matches!(turn("c1", 1_600), Err(GatewayError::SessionExpired { .. })));
    assert!(
        matches!(turn("newcomer", 1_600), Err(GatewayError::SessionsExhausted)),
        "tombstones still hold their ids"
    );
    for i in (0..1296).step_by(2) {
        turn(&format!("c{i}"), 1_800).unwrap();
    }
    let swept = store.sweep(2_600, &retention).unwrap();
    assert_eq!(swept.sessions_forgotten, 648);

    let mut live: std::collections::HashMap<String, String> = std::collections::HashMap::new();
    for s in store.sessions().unwrap().into_iter().filter(|s| !s.expired) {
        assert!(
            live.insert(s.id.clone(), s.token.clone()).is_none(),
            "two live conversations share {}",
            s.id
        );
    }
    for i in 0..648 {
        let id = turn(&format!("new{i}"), 2_600).unwrap();
        assert!(!live.contains_key(&id), "{id} handed to a new conversation while live");
        live.insert(id, format!("new{i}"));
    }
    assert_eq!(live.len(), 1296);
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
    assert_eq!(store.ledger_len(), 30);
    assert_eq!(store.ledger("m69").unwrap(), None);
    assert_eq!(store.ledger("m70").unwrap(), Some(LedgerState::Published));
}

#[test]
fn a_store_of_another_schema_version_is_refused() {
    let dir = temp_dir("schema");
    {
        let db = sled::open(&dir).unwrap();
        db.insert("meta:schema_version", "0").unwrap();
        db.flush().unwrap();
    }
    let err = SledStore::open(&dir, None).err().expect("refused");
    assert!(matches!(err, StoreError::Corrupt(ref m) if m.contains("schema version 0")), "{err}");
}

fn export(dir: &Path, key_env: Option<&str>) -> Vec<String> {
    let mut args = vec!["lock", "export", "--store", dir.to_str().unwrap()];
    if let Some(var) = key_env {
        args.extend(["--key-env", var]);
    }
    let (code, out, err) = silpgate(&args);
    assert_eq!(code, 0, "{err}");
    out.lines().map(str::to_owned).collect()
}

fn verify_file(lines: &[String], key_env: Option<&str>) -> (i32, String) {
    let file = temp_dir("export").with_extension("jsonl");
    std::fs::write(&file, lines.join("\n") + "\n").unwrap();
    let mut args = vec!["lock", "verify", "--file", file.to_str().unwrap()];
    if let Some(var) = key_env {
        args.extend(["--key-env", var]);
    }
    let (code, out, _) = silpgate(&args);
    (code, out)
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
    // SAFETY: tests in this binary do not read this variable concurrently with the write.
    unsafe { std::env::set_var("SILPGATE_TEST_LOCK_KEY", "correct horse battery staple") };
    let dir = filled_store("keyed", Some(b"correct horse battery staple"));
    let good = export(&dir, Some("SILPGATE_TEST_LOCK_KEY"));
    assert_eq!(verify_file(&good, Some("SILPGATE_TEST_LOCK_KEY")).0, 0);
    // Without the key the hashes are plain SHA-256: an attacker can rewrite the chain
    // consistently, and only the key tells.
    let (code, out) = verify_file(&good, None);
    assert_eq!(code, 1, "{out}");
    let (code, out, _) = silpgate(&[
        "lock",
        "verify",
        "--store",
        dir.to_str().unwrap(),
        "--key-env",
        "SILPGATE_TEST_LOCK_KEY",
    ]);
    assert_eq!(code, 0, "{out}");
    let (code, _, err) =
        silpgate(&["lock", "verify", "--store", dir.to_str().unwrap(), "--key-env", "SILPGATE_UNSET_KEY"]);
    assert!(code == 2 && err.contains("SILPGATE_UNSET_KEY"), "{err}");
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
