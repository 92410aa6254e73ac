//! The sled store's per-message state step: session turn, compile.lock lookup, ledger check and
//! insert, each with and without a flush; the whole step of one message; and the relay's step,
//! whose flush a window of 64 messages shares.
//! `cargo bench --bench store`; figures in docs/performance.md.

use criterion::{Criterion, criterion_group, criterion_main};
use silpgate::gateway::session::{SessionPolicy, count_turn};
use silpgate::gateway::store::{Changes, Freeze, LedgerState, Store};
use silpgate::silp::Frontend;
use silpgate::store::SledStore;
use std::hint::black_box;

fn store(c: &mut Criterion) {
    let dir = std::env::temp_dir().join(format!("silpgate-bench-store-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let store = SledStore::open(&dir, None).expect("store opens");
    let policy = SessionPolicy { heartbeat: 10, idle_timeout_ms: u64::MAX / 4, partition: None };
    // A warm store: 1,000 live sessions and 10,000 lock records.
    for i in 0..1000u64 {
        let (_, s) = count_turn(
            &store,
            &format!("conversation-{i}"),
            0,
            &policy,
            silpgate::gateway::session::Party::Client(None),
        )
        .unwrap();
        store.commit(&Changes { sessions: vec![s], ..Changes::default() }, 0).unwrap();
    }
    for i in 0..10_000u64 {
        let f = Freeze {
            ir_hash: format!("sha256:{i:064x}"),
            frontend: Frontend::Code,
            output: format!("cancel(x{i})"),
            principal: None,
        };
        store.commit(&Changes { freezes: vec![f], ..Changes::default() }, 0).unwrap();
    }
    store.flush().unwrap();

    let mut n = 0u64;
    for flush in [false, true] {
        let suffix = if flush { "+flush" } else { "" };
        c.bench_function(&format!("session lookup+update{suffix}"), |b| {
            b.iter(|| {
                n += 1;
                let (_, s) = count_turn(
                    &store,
                    &format!("conversation-{}", n % 1000),
                    n,
                    &policy,
                    silpgate::gateway::session::Party::Client(None),
                )
                .unwrap();
                store.commit(&Changes { sessions: vec![s], ..Changes::default() }, n).unwrap();
                if flush {
                    store.flush().unwrap();
                }
            })
        });
        c.bench_function(&format!("lock freeze lookup{suffix}"), |b| {
            b.iter(|| {
                n += 1;
                let i = n % 10_000;
                let f = Freeze {
                    ir_hash: format!("sha256:{i:064x}"),
                    frontend: Frontend::Code,
                    output: format!("cancel(x{i})"),
                    principal: None,
                };
                let frozen = store.commit(&Changes { freezes: vec![f], ..Changes::default() }, n).unwrap();
                assert!(!frozen[0].first);
                if flush {
                    store.flush().unwrap();
                }
            })
        });
        c.bench_function(&format!("ledger check+insert{suffix}"), |b| {
            b.iter(|| {
                n += 1;
                let id = format!("message-{n}");
                assert_eq!(store.ledger(black_box(&id)).unwrap(), None);
                store
                    .commit(
                        &Changes {
                            ledger: vec![(id, LedgerState::Pending { turn: None, session: None })],
                            ..Changes::default()
                        },
                        n,
                    )
                    .unwrap();
                if flush {
                    store.flush().unwrap();
                }
            })
        });
    }
    c.bench_function("message state step (ledger + session + lock, one flush)", |b| {
        b.iter(|| {
            n += 1;
            let id = format!("message-{n}");
            assert_eq!(store.ledger(&id).unwrap(), None);
            let (_, s) = count_turn(
                &store,
                &format!("conversation-{}", n % 1000),
                n,
                &policy,
                silpgate::gateway::session::Party::Client(None),
            )
            .unwrap();
            let i = n % 10_000;
            let f = Freeze {
                ir_hash: format!("sha256:{i:064x}"),
                frontend: Frontend::Code,
                output: format!("cancel(x{i})"),
                principal: None,
            };
            let changes = Changes {
                sessions: vec![s],
                freezes: vec![f],
                ledger: vec![(id, LedgerState::Pending { turn: None, session: None })],
                ..Changes::default()
            };
            store.commit(&changes, n).unwrap();
            store.flush().unwrap();
        })
    });
    // The AMQP relay's traffic: 200 conversations, every envelope a new IR (a new compile.lock
    // record), a ledger entry and later its published mark, one flush per window of 64. The
    // checkpoints the flushes start run inline here, so their cost is in the figure.
    let mut seq = 0u64;
    c.bench_function("message state step, one flush per window of 64", |b| {
        b.iter_custom(|iters| {
            let start = std::time::Instant::now();
            let mut window = Vec::with_capacity(64);
            for _ in 0..iters {
                seq += 1;
                let id = format!("relay-{seq}");
                assert_eq!(store.ledger(&id).unwrap(), None);
                let (_, s) = count_turn(
                    &store,
                    &format!("relay-conversation-{}", seq % 200),
                    seq,
                    &policy,
                    silpgate::gateway::session::Party::Client(None),
                )
                .unwrap();
                let changes = Changes {
                    sessions: vec![s],
                    freezes: vec![Freeze {
                        ir_hash: format!("sha256:{:064x}", u64::MAX - seq),
                        frontend: Frontend::Json,
                        output: format!("{{\"op\":\"cancel\",\"target\":\"relay-{seq}\"}}"),
                        principal: None,
                    }],
                    ledger: vec![(id.clone(), LedgerState::Pending { turn: None, session: None })],
                    ..Changes::default()
                };
                store.commit(&changes, seq).unwrap();
                window.push(id);
                if window.len() == 64 {
                    store.flush().unwrap();
                    let marks = window.drain(..).map(|id| (id, LedgerState::Published)).collect();
                    store.commit(&Changes { ledger: marks, ..Changes::default() }, seq).unwrap();
                }
            }
            store.flush().unwrap();
            start.elapsed()
        })
    });
    drop(store);
    let _ = std::fs::remove_dir_all(&dir);

    // The floor on this disk: one bare sled insert and flush, with no silpgate code at all.
    let raw_dir = std::env::temp_dir().join(format!("silpgate-bench-raw-{}", std::process::id()));
    let db = sled::open(&raw_dir).expect("raw sled opens");
    c.bench_function("floor: bare sled insert+flush", |b| {
        b.iter(|| {
            n += 1;
            db.insert(n.to_be_bytes(), vec![0u8; 300]).unwrap();
            db.flush().unwrap();
        })
    });
    drop(db);
    let _ = std::fs::remove_dir_all(&raw_dir);
}

criterion_group!(benches, store);
criterion_main!(benches);
