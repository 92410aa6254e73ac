//! kill -9 at random moments: every write the writer reported as durable is still there after
//! a reopen, the store opens every time, and the compile.lock chain verifies.

use silpgate::gateway::store::{LedgerState, Store};
use silpgate::silp::Frontend;
use silpgate::store::SledStore;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

#[test]
fn every_reported_write_survives_sigkill() {
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("store-crash-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut reported: Option<u64> = None;
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let kills = 25;
    for round in 0..kills {
        let mut child = Command::new(env!("CARGO_BIN_EXE_silpgate-store-writer"))
            .arg(&dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("writer starts");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = mpsc::channel();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line.parse::<u64>().expect("step numbers")).is_err() {
                    break;
                }
            }
        });
        // Let it write for a random 20..220 ms, then kill it without warning.
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let run_for = Duration::from_millis(20 + seed % 200);
        let start = Instant::now();
        while start.elapsed() < run_for {
            if let Ok(step) = rx.recv_timeout(Duration::from_millis(5)) {
                reported = Some(step);
            }
        }
        child.kill().expect("SIGKILL");
        let status = child.wait().expect("reaped");
        assert!(!status.success(), "round {round}: the writer must have been killed");
        reader.join().expect("reader thread");
        while let Ok(step) = rx.try_recv() {
            reported = Some(step);
        }

        let store = SledStore::open(&dir, None)
            .unwrap_or_else(|e| panic!("round {round}: the store does not open: {e}"));
        let records =
            store.verify_lock().unwrap_or_else(|e| panic!("round {round}: the chain does not verify: {e}"));
        if let Some(last) = reported {
            assert!(
                records > last,
                "round {round}: step {last} was reported durable but the chain has {records} records"
            );
            for step in [0, last / 2, last] {
                assert_eq!(
                    store.ledger(&format!("message-{step}")).unwrap(),
                    Some(LedgerState::Published),
                    "round {round}: ledger entry of step {step}"
                );
                assert_eq!(
                    store.frozen(&format!("sha256:{step:064x}"), Frontend::Code).unwrap().as_deref(),
                    Some(format!("cancel(step{step})").as_str())
                );
            }
            let session = store
                .session_by_token(&format!("conversation-{}", last % 1000))
                .unwrap()
                .expect("session of the last step");
            assert!(session.turns > last / 1000, "round {round}: turns {} for step {last}", session.turns);
        }
    }
    assert!(reported.is_some_and(|s| s > 100), "the writer made progress: {reported:?}");
}
