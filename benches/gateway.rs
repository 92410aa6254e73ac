//! `Gateway::handle` for a typical envelope: one `silp-ir` submessage encoded to the code
//! frontend for an agent, one conversation token carried along, in-memory state.
//! `cargo bench --bench gateway`; figures in docs/performance.md.

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
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

fn handle(c: &mut Criterion) {
    let gateway = Gateway::new(Arc::new(Config::parse(CONFIG).unwrap()), Arc::new(MemoryStore::new()));
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

criterion_group!(benches, handle);
criterion_main!(benches);
