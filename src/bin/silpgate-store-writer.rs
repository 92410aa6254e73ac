//! Writes state to a silpgate store as fast as it can, in windows of 1 to 8 messages, each
//! window one atomic commit (per message: a session turn, a compile.lock record, a ledger
//! entry), as the AMQP door commits what it took together. Before committing it prints
//! `window FIRST LAST`, and once the window is flushed `durable LAST`. Every 50 messages it
//! checkpoints the journal into the keyed records, so that a kill lands mid-checkpoint as well
//! as mid-append. The crash test (tests/store_crash.rs) kills it with SIGKILL at random moments
//! and checks that every message reported durable survived and that the window in flight is
//! there whole or not at all.
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
    let mut next = store.lock_head().expect("chain head").records;
    let mut out = std::io::stdout().lock();
    loop {
        // Windows of every size from 1 to 8, in a fixed order.
        let last = next + next * 5 % 8;
        writeln!(out, "window {next} {last}").expect("stdout");
        out.flush().expect("stdout");
        let mut changes = Changes::default();
        for message in next..=last {
            let token = format!("conversation-{}", message % 1000);
            let (_, session) =
                count_turn(&store, &token, message, &policy, silpgate::gateway::session::Party::Client(None))
                    .expect("session turn");
            changes.sessions.push(session);
            changes.freezes.push(Freeze {
                ir_hash: format!("sha256:{message:064x}"),
                frontend: Frontend::Code,
                output: format!("cancel(step{message})"),
                principal: None,
            });
            changes.ledger.push((format!("message-{message}"), LedgerState::Published));
        }
        store.commit(&changes, next).expect("commit");
        store.flush().expect("flush");
        if (next..=last).any(|message| message % 50 == 49) {
            store.checkpoint().expect("checkpoint");
        }
        writeln!(out, "durable {last}").expect("stdout");
        out.flush().expect("stdout");
        next = last + 1;
    }
}
