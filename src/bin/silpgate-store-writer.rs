//! Writes state to a silpgate store as fast as it can, one message's worth per step (a session
//! turn, a compile.lock record, a ledger entry, committed atomically and flushed), and prints
//! the step number once it is durable. Every 50 steps it checkpoints the journal into the keyed
//! records, so that a kill lands mid-checkpoint as well as mid-append. The crash test (tests/store_crash.rs) kills it with
//! SIGKILL at random moments and checks that every printed step survived.
//!
//! Usage: silpgate-store-writer DIR

use silpgate::gateway::session::{SessionPolicy, count_turn};
use silpgate::gateway::store::{Changes, Freeze, LedgerState, Store};
use silpgate::silp::Frontend;
use silpgate::store::SledStore;
use std::io::Write;

fn main() {
    let dir = std::env::args_os().nth(1).expect("usage: silpgate-store-writer DIR");
    let store = SledStore::open(std::path::Path::new(&dir), None).expect("store opens");
    let policy = SessionPolicy { heartbeat: 5, idle_timeout_ms: u64::MAX / 2, partition: None };
    let mut step = store.lock_head().expect("chain head").records;
    let mut out = std::io::stdout().lock();
    loop {
        let token = format!("conversation-{}", step % 1000);
        let (_, session) =
            count_turn(&store, &token, step, &policy, silpgate::gateway::session::Party::Client(None))
                .expect("session turn");
        let changes = Changes {
            sessions: vec![session],
            freezes: vec![Freeze {
                ir_hash: format!("sha256:{step:064x}"),
                frontend: Frontend::Code,
                output: format!("cancel(step{step})"),
                principal: None,
            }],
            ledger: vec![(format!("message-{step}"), LedgerState::Published)],
            ..Changes::default()
        };
        store.commit(&changes, step).expect("commit");
        store.flush().expect("flush");
        if step % 50 == 49 {
            store.checkpoint().expect("checkpoint");
        }
        writeln!(out, "{step}").expect("stdout");
        out.flush().expect("stdout");
        step += 1;
    }
}
