//! Disk and memory used by 1,000,000 live sessions, 1,000,000 compile.lock records and
//! 1,000,000 ledger entries, against the live data they hold; and the time to open that store,
//! closed cleanly and with a full journal left by a writer that stopped without closing it.
//! `cargo bench --bench store_size`; figures in docs/performance.md.

use silpgate::gateway::session::{SessionPolicy, count_turn};
use silpgate::gateway::store::{Changes, Freeze, LedgerState, Store};
use silpgate::silp::Frontend;
use silpgate::store::SledStore;
use std::path::Path;
use std::time::Instant;

const BATCH: u64 = 1_000;

fn dir_size(path: &Path) -> u64 {
    std::fs::read_dir(path)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .map(|e| match e.metadata() {
                    Ok(m) if m.is_dir() => dir_size(&e.path()),
                    Ok(m) => m.len(),
                    Err(_) => 0,
                })
                .sum()
        })
        .unwrap_or(0)
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

/// Journal messages (5 distinct keys each: a new conversation's session, a lock record and its
/// index, a ledger entry and its time index; in windows of 64, each flushed) just short of the
/// 65,536 keys that make a checkpoint due: the most a crash leaves to replay while checkpoints
/// keep up.
const JOURNALED: u64 = 13_000;

/// The writer that leaves a full journal: it commits and flushes, then exits without closing
/// the store (no destructor runs), as a crash after the last flush would.
fn fill_journal(dir: &Path) -> ! {
    let store = SledStore::open(dir, None).expect("store opens");
    let policy = SessionPolicy { heartbeat: 10, idle_timeout_ms: u64::MAX / 4, partition: None };
    for i in 0..JOURNALED {
        let (_, s) = count_turn(
            &store,
            &format!("journaled-{i:09}"),
            0,
            &policy,
            silpgate::gateway::session::Party::Client(None),
        )
        .unwrap();
        let changes = Changes {
            sessions: vec![s],
            freezes: vec![Freeze {
                ir_hash: format!("sha256:{:064x}", u64::MAX - i),
                frontend: Frontend::Code,
                output: format!("cancel(journaled{i})"),
                principal: None,
            }],
            ledger: vec![(format!("journaled-{i:012}"), LedgerState::Published)],
            ..Changes::default()
        };
        store.commit(&changes, i).unwrap();
        if i % 64 == 63 {
            store.flush().unwrap();
        }
    }
    store.flush().unwrap();
    std::process::exit(0)
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    if let Some(dir) = std::env::args().skip_while(|a| a != "--fill-journal").nth(1) {
        fill_journal(Path::new(&dir));
    }
    // `cargo bench` passes --bench; `cargo test --all-targets` runs this as a quick smoke test.
    let n: u64 = if std::env::args().any(|a| a == "--bench") { 1_000_000 } else { 2_000 };
    let dir = std::env::temp_dir().join(format!("silpgate-store-size-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let store = SledStore::open(&dir, None).expect("store opens");
    let policy = SessionPolicy { heartbeat: 10, idle_timeout_ms: u64::MAX / 4, partition: None };
    let rss_before = rss_kib();
    let start = Instant::now();
    let mut live = 0u64;
    for batch in 0..n / BATCH {
        let mut changes = Changes::default();
        for j in 0..BATCH {
            let i = batch * BATCH + j;
            // One conversation per message: every session stays live (no idle timeout here).
            let (_, s) = count_turn(
                &store,
                &format!("conversation-{i:09}"),
                0,
                &policy,
                silpgate::gateway::session::Party::Client(None),
            )
            .unwrap();
            live +=
                serde_json::to_vec(&s).unwrap().len() as u64 + "session:".len() as u64 + s.token.len() as u64;
            changes.sessions.push(s);
            let output = format!("if budget<=500: book(hotel{i},city=Shanghai)");
            changes.freezes.push(Freeze {
                ir_hash: format!("sha256:{i:064x}"),
                frontend: Frontend::Code,
                output,
                principal: None,
            });
            changes.ledger.push((format!("message-{i:012}"), LedgerState::Published));
        }
        store.commit(&changes, batch).unwrap();
    }
    store.flush().unwrap();
    let elapsed = start.elapsed();
    // Live data: each lock record as stored plus its index entry, each ledger entry and its
    // time-index key.
    for record in store.lock_records().take(1) {
        let r = record.unwrap();
        let record_bytes = serde_json::to_vec(&r).unwrap().len() as u64 + 8;
        let index_bytes = 5 + r.ir_hash.len() as u64 + 8;
        live += n * (record_bytes + index_bytes);
    }
    let ledger_entry = br#"{"state":"Published","at":999}"#.len() as u64 + 20;
    live += n * (ledger_entry + 8 + 20);
    let rss_after = rss_kib();
    let sessions = store.sessions().unwrap().len() as u64;
    assert_eq!(sessions, n, "every conversation keeps its session: no cap, nothing evicted");
    // A conversation's lookup at this size: what each message of a live conversation pays.
    let lookups = 10_000u64;
    let started = Instant::now();
    for k in 0..lookups {
        let token = format!("conversation-{:09}", (k * 7919) % n);
        assert!(store.session_by_token(&token).unwrap().is_some());
    }
    let lookup_us = started.elapsed().as_secs_f64() * 1e6 / lookups as f64;
    drop(store);
    let disk = dir_size(&dir);
    let started = Instant::now();
    let store = SledStore::open(&dir, None).expect("store reopens");
    let clean_open = started.elapsed();
    drop(store);
    let status = std::process::Command::new(std::env::current_exe().unwrap())
        .arg("--fill-journal")
        .arg(&dir)
        .status()
        .expect("the journal writer runs");
    assert!(status.success(), "the journal writer failed");
    let started = Instant::now();
    let store = SledStore::open(&dir, None).expect("store opens, replaying its journal");
    let replay_open = started.elapsed();
    let last = format!("journaled-{:09}", JOURNALED - 1);
    assert_eq!(store.session_by_token(&last).unwrap().map(|s| s.turns), Some(1), "the journal was replayed");
    assert_eq!(store.sessions().unwrap().len() as u64, n + JOURNALED);
    drop(store);
    println!("wrote {n} sessions, {n} lock records, {n} ledger entries in {:.1} s", elapsed.as_secs_f64());
    println!("live data  {:>8.1} MiB", live as f64 / 1048576.0);
    println!("disk       {:>8.1} MiB  ({:.2}x live)", disk as f64 / 1048576.0, disk as f64 / live as f64);
    println!("lookup     {lookup_us:>8.1} µs per session, mean of {lookups}");
    println!("RSS growth {:>8.1} MiB", (rss_after.saturating_sub(rss_before)) as f64 / 1024.0);
    println!("open       {:>8.2} s closed cleanly", clean_open.as_secs_f64());
    println!(
        "open       {:>8.2} s with {JOURNALED} messages journaled (a crash after the last flush)",
        replay_open.as_secs_f64()
    );
    let _ = std::fs::remove_dir_all(&dir);
}
