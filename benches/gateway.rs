//! `Gateway::handle` for a typical envelope: one `silp-ir` submessage encoded to the code
//! frontend for an agent, one conversation token carried along, in-memory state.
//! `cargo bench --bench gateway`; figures in docs/performance.md.
//!
//! `GATEWAY_BENCH_CALLS=N` runs `handle` N times without criterion, and with `=N,setup` only
//! what each call is given: `perf stat -e cycles:u,instructions:u` over both tells a call's
//! cost on a busy machine, where wall-clock medians wander (user-mode counts do not include
//! time spent waiting for a core).

use criterion::{BatchSize, Criterion, criterion_group};
use silpgate::config::Config;
use silpgate::gateway::{Gateway, Inbound, MemoryStore, Origin, Status, Transport};
use silpgate::nlip::{self, Encoding, Limits};
use std::hint::black_box;
use std::sync::Arc;

const CONFIG: &str = r#"
[sessions]
heartbeat = 9999
[[agents]]
name = "planner"
frontends = ["code", "json"]
[[routes]]
name = "to-planner"
destination = "planner"
mode = "encode"
"#;

fn envelope() -> String {
    let ir = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/benches/fixtures/case9_tool_call.json"
    ))
    .unwrap();
    format!(
        r#"{{"format":"text","subformat":"english","content":"find a restaurant","submessages":[{{"format":"structured","subformat":"silp-ir","content":{ir},"label":"task"}},{{"format":"token","subformat":"conversation","content":"conv-7f3a"}}]}}"#
    )
}

fn gateway() -> Gateway {
    Gateway::new(Arc::new(Config::parse(CONFIG).unwrap()), Arc::new(MemoryStore::new()))
}

fn handle(c: &mut Criterion) {
    let gateway = gateway();
    let text = envelope();
    let message = nlip::decode(text.as_bytes(), Encoding::Json, &Limits::default()).unwrap();
    let origin = Origin::new(Transport::Amqp, "ingress");
    // The transport hands over a freshly decoded envelope; building it is not part of handle.
    c.bench_function("handle/silp-ir-to-code+token", |b| {
        b.iter_batched(
            || Inbound { envelope: message.clone(), origin: origin.clone(), received_at: 1 },
            |inbound| {
                let outcome = gateway.handle(black_box(inbound));
                assert!(matches!(outcome.status, Status::Delivered));
                outcome
            },
            BatchSize::SmallInput,
        )
    });
    c.bench_function("handle/decode+handle+encode (json wire)", |b| {
        b.iter(|| {
            let message =
                nlip::decode(black_box(text.as_bytes()), Encoding::Json, &Limits::default()).unwrap();
            let outcome =
                gateway.handle(Inbound { envelope: message, origin: origin.clone(), received_at: 1 });
            nlip::encode(&outcome.outbound[0].envelope, Encoding::Json)
        })
    });
}

/// What [`count`] repeats.
#[derive(Clone, Copy, PartialEq)]
enum Counted {
    /// `handle` on a fresh copy of a decoded envelope.
    Handle,
    /// Only the copy and its drop, to subtract.
    Setup,
    /// JSON bytes -> decode -> `handle` -> encode JSON bytes, everything dropped.
    Wire,
}

/// `calls` repetitions of `what`, for a CPU-time count under `perf stat` without criterion.
fn count(calls: u64, what: Counted) {
    let gateway = gateway();
    let text = envelope();
    let message = nlip::decode(text.as_bytes(), Encoding::Json, &Limits::default()).unwrap();
    let origin = Origin::new(Transport::Amqp, "ingress");
    for _ in 0..calls {
        if what == Counted::Wire {
            let message =
                nlip::decode(black_box(text.as_bytes()), Encoding::Json, &Limits::default()).unwrap();
            let outcome =
                gateway.handle(Inbound { envelope: message, origin: origin.clone(), received_at: 1 });
            drop(black_box(nlip::encode(&outcome.outbound[0].envelope, Encoding::Json)));
            continue;
        }
        let inbound = Inbound { envelope: message.clone(), origin: origin.clone(), received_at: 1 };
        if what == Counted::Setup {
            drop(black_box(inbound));
        } else {
            let outcome = gateway.handle(black_box(inbound));
            assert!(matches!(outcome.status, Status::Delivered));
            drop(black_box(outcome));
        }
    }
}

criterion_group!(benches, handle);

fn main() {
    if let Ok(spec) = std::env::var("GATEWAY_BENCH_CALLS") {
        let (calls, mode) = spec.split_once(',').unwrap_or((&spec, ""));
        let what = match mode {
            "" => Counted::Handle,
            "setup" => Counted::Setup,
            "wire" => Counted::Wire,
            other => panic!("GATEWAY_BENCH_CALLS=N, N,setup or N,wire; not {other}"),
        };
        count(calls.parse().expect("GATEWAY_BENCH_CALLS=N[,setup|,wire]"), what);
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
