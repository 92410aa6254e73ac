//! The relay's state step as the daemon runs it, in CPU time: 64,000 messages in 200
//! conversations, each a session turn, a new compile.lock record and a ledger entry, planned in
//! windows of 64 that share one `flush_async`, with the window's published marks committed
//! after it and the checkpoints running in the background, as the AMQP door does. It prints
//! the wall time and the process's CPU time (sled's threads and the checkpoints included) per
//! message, for three rounds on a fresh store.
//!
//! `cargo bench --bench store_cpu`; figures in docs/performance.md. `cargo test --all-targets`
//! runs it without `--bench`, as a smoke run of 1,000 messages a round. The file uses the store's
//! public interface only, so the same file builds against an earlier commit for a side-by-side
//! run.

#[path = "support/cpu.rs"]
mod cpu;

use silpgate::gateway::session::{Party, SessionPolicy, count_turn};
use silpgate::gateway::store::{Changes, Freeze, LedgerState, Store};
use silpgate::silp::Frontend;
use silpgate::store::SledStore;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

const MESSAGES: u64 = 64_000;
const WINDOW: usize = 64;
const CONVERSATIONS: u64 = 200;

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

async fn round(store: &SledStore, first: u64, messages: u64) {
    let policy = SessionPolicy { heartbeat: 10, idle_timeout_ms: u64::MAX / 4, partition: None };
    let mut window = Vec::with_capacity(WINDOW);
    for seq in first..first + messages {
        let id = format!("relay-{seq}");
        assert_eq!(store.ledger(&id).unwrap(), None);
        let conversation = format!("relay-conversation-{}", seq % CONVERSATIONS);
        let now = now_ms();
        let (_, session) = count_turn(store, &conversation, now, &policy, Party::Client(None)).unwrap();
        let freeze = Freeze {
            ir_hash: format!("sha256:{:064x}", u64::MAX - seq),
            frontend: Frontend::Json,
            output: format!("{{\"op\":\"cancel\",\"target\":\"relay-{seq}\"}}"),
            principal: None,
        };
        let changes = Changes {
            sessions: vec![session],
            freezes: vec![freeze],
            ledger: vec![(id.clone(), LedgerState::Pending { turn: None, session: None })],
            ..Changes::default()
        };
        store.commit(&changes, now).unwrap();
        window.push(id);
        if window.len() == WINDOW {
            store.flush_async().await.unwrap();
            let marks = window.drain(..).map(|id| (id, LedgerState::Published)).collect();
            store.commit(&Changes { ledger: marks, ..Changes::default() }, now_ms()).unwrap();
        }
    }
    store.flush_async().await.unwrap();
}

fn main() {
    let messages = if std::env::args().any(|a| a == "--bench") { MESSAGES } else { 1_000 };
    let dir = std::env::temp_dir().join(format!("silpgate-bench-store-cpu-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let store = SledStore::open(&dir, None).expect("store opens");
    println!(
        "relay state step: {messages} messages a round, windows of {WINDOW}, {CONVERSATIONS} conversations"
    );
    for r in 0..3u64 {
        let (cpu_before, started) = (cpu::cpu_time(std::process::id()), Instant::now());
        runtime.block_on(round(&store, r * messages, messages));
        let wall = started.elapsed();
        let cpu = cpu::cpu_time(std::process::id()).saturating_sub(cpu_before);
        println!(
            "round {}: wall {:.1} µs, CPU {:.1} µs per message",
            r + 1,
            wall.as_secs_f64() * 1e6 / messages as f64,
            cpu.as_secs_f64() * 1e6 / messages as f64
        );
    }
    drop(store);
    let _ = std::fs::remove_dir_all(&dir);
}
