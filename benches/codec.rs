//! Compile and decode speed of the lossless frontends on the reference's benchmark cases.
//! `cargo bench --bench codec`; docs/performance.md has the figures and the Python baseline.

use criterion::{Criterion, criterion_group, criterion_main};
use silpgate::silp::{self, DecodeOptions, Frontend, schema};
use std::hint::black_box;

const CASES: [(&str, &str); 4] = [
    ("case2_negation", include_str!("fixtures/case2_negation.json")),
    ("case6_nested_constraint", include_str!("fixtures/case6_nested_constraint.json")),
    ("case7_parallel_action", include_str!("fixtures/case7_parallel_action.json")),
    ("case9_tool_call", include_str!("fixtures/case9_tool_call.json")),
];

fn codec(c: &mut Criterion) {
    let options = DecodeOptions::default();
    for frontend in [Frontend::Code, Frontend::Json] {
        for (name, json) in CASES {
            let value = serde_json::from_str(json).expect("fixture is JSON");
            let ir = schema::parse_ir(&value).expect("fixture is a valid IR");
            let text = silp::compile(&ir, frontend);
            c.bench_function(&format!("compile/{frontend}/{name}"), |b| {
                b.iter(|| silp::compile(black_box(&ir), frontend))
            });
            c.bench_function(&format!("decode/{frontend}/{name}"), |b| {
                b.iter(|| silp::decode(black_box(&text), frontend, &options).expect("decodes"))
            });
        }
    }
}

criterion_group!(benches, codec);
criterion_main!(benches);
