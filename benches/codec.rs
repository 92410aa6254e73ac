//! Compile and decode speed of the lossless frontends on the reference's benchmark cases, and
//! what counting a payload's tokens costs: uncached, and from the (IR hash, frontend,
//! tokenizer) cache the gateway counts through.
//! `cargo bench --bench codec`; docs/performance.md has the figures and the Python baseline.

use criterion::{Criterion, criterion_group, criterion_main};
use silpgate::silp::tokens::{TokenCache, Tokenizer};
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

fn tokens(c: &mut Criterion) {
    let cache = TokenCache::new(1 << 16);
    for tokenizer in Tokenizer::ALL {
        tokenizer.warm();
        for frontend in [Frontend::Code, Frontend::Json] {
            for (name, json) in CASES {
                let value = serde_json::from_str(json).expect("fixture is JSON");
                let ir = schema::parse_ir(&value).expect("fixture is a valid IR");
                let text = silp::compile(&ir, frontend);
                let hash = ir.ir_hash();
                c.bench_function(&format!("tokens/{tokenizer}/{frontend}/{name}"), |b| {
                    b.iter(|| tokenizer.count(black_box(&text)))
                });
                // The gateway's path: the IR hash is at hand (the compile.lock needs it).
                c.bench_function(&format!("tokens-cached/{tokenizer}/{frontend}/{name}"), |b| {
                    b.iter(|| cache.count(black_box(&hash), frontend, tokenizer, || text.clone()))
                });
            }
        }
    }
}

criterion_group!(benches, codec, tokens);
criterion_main!(benches);
