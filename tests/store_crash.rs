//! kill -9 at random moments: every message the writer reported as durable is still there,
//! whole, after a reopen; the window of messages it was committing is there whole or not at
//! all; the store opens every time, and the compile.lock chain verifies.

use silpgate::gateway::store::{LedgerState, Store};
use silpgate::silp::Frontend;
use silpgate::store::SledStore;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// What the writer said before it was killed: the last message reported durable, and the
/// window it began after that, if any (committed whole or not at all).
#[derive(Default)]
struct Said {
    durable: Option<u64>,
    in_flight: Option<(u64, u64)>,
}

impl Said {
    fn read(&mut self, line: &str) {
        let words: Vec<&str> = line.split_whitespace().collect();
        let number =
            |i: usize| words[i].parse::<u64>().unwrap_or_else(|_| panic!("the writer said {line:?}"));
        match words.first() {
            Some(&"window") => self.in_flight = Some((number(1), number(2))),
            Some(&"durable") => {
                self.durable = Some(number(1));
                self.in_flight = None;
            }
            _ => panic!("the writer said {line:?}"),
        }
    }
}

/// Whether every part of message `n` is in the store (its ledger entry, its compile.lock
/// record), or none is; panics when only some are.
fn holds(store: &SledStore, n: u64, round: usize) -> bool {
    let ledger = store.ledger(&format!("message-{n}")).unwrap();
    let frozen = store.frozen(&format!("sha256:{n:064x}"), Frontend::Code).unwrap();
    match (ledger, frozen.as_deref()) {
        (Some(LedgerState::Published), Some(output)) => {
            assert_eq!(output, format!("cancel(step{n})"), "round {round}: message {n}'s record");
            true
        }
        (None, None) => false,
        (ledger, frozen) => panic!("round {round}: message {n} half there: {ledger:?}, {frozen:?}"),
    }
}

#[test]
fn every_reported_write_survives_sigkill() {
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("store-crash-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut said = Said::default();
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let kills = 25;
    let mut windows_cut = 0;
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
                if tx.send(line).is_err() {
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
            if let Ok(line) = rx.recv_timeout(Duration::from_millis(5)) {
                said.read(&line);
            }
        }
        child.kill().expect("SIGKILL");
        let status = child.wait().expect("reaped");
        assert!(!status.success(), "round {round}: the writer must have been killed");
        reader.join().expect("reader thread");
        while let Ok(line) = rx.try_recv() {
            said.read(&line);
        }

        let store = SledStore::open(&dir, None)
            .unwrap_or_else(|e| panic!("round {round}: the store does not open: {e}"));
        let records =
            store.verify_lock().unwrap_or_else(|e| panic!("round {round}: the chain does not verify: {e}"));
        if let Some(last) = said.durable {
            assert!(
                records > last,
                "round {round}: message {last} was reported durable but the chain has {records} records"
            );
            for n in 0..=last {
                assert!(
                    holds(&store, n, round),
                    "round {round}: message {n} was reported durable and is gone"
                );
            }
            let session = store
                .session_by_token(&format!("conversation-{}", last % 1000))
                .unwrap()
                .expect("session of the last message");
            assert!(session.turns > last / 1000, "round {round}: turns {} for message {last}", session.turns);
        }
        // The window the kill cut: all of it or none of it, and the chain says which.
        if let Some((first, last)) = said.in_flight.take() {
            let whole = holds(&store, first, round);
            for n in first..=last {
                assert_eq!(
                    holds(&store, n, round),
                    whole,
                    "round {round}: window {first}..={last} is cut at {n}"
                );
            }
            assert_eq!(records, if whole { last + 1 } else { first }, "round {round}: the chain's length");
            if first < last {
                windows_cut += 1;
            }
            if whole {
                said.durable = Some(last);
            }
        }
    }
    assert!(said.durable.is_some_and(|s| s > 100), "the writer made progress: {:?}", said.durable);
    assert!(windows_cut > 0, "no kill landed in a window of several messages");
}
