//! The path a user runs, per line of a 20,000-line input cycled from the public conformance
//! vectors: JSON text in, parse + validate + compile + write (compile), or parse + decode +
//! write (decode), for the code and json frontends, each output line assembled in one buffer
//! as `silpgate silp compile/decode --lines` writes it. Beside each row, in the same run, the
//! floor: a bare serde_json parse of the same bytes into a plain struct, no SILP work at all.
//!
//! `cargo bench --bench whole_path` prints the table; `-- --write-lines DIR` also writes the
//! three input files, which `benches/bench-whole-path.sh` feeds to the command line and to the
//! Python reference (`benches/whole_path_reference.py`). `cargo test --all-targets` runs it
//! without `--bench`: one round over each workload, a smoke run.

use serde::Deserialize;
use silpgate::silp::validate::{self, ValidateOptions};
use silpgate::silp::{self, DecodeOptions, Frontend, schema};
use silpgate::util::json_text;
use std::borrow::Cow;
use std::hint::black_box;
use std::time::Instant;

const LINES: usize = 20_000;
const ROUNDS: usize = 15;

/// The IR as a plain serde struct: what parsing alone costs.
#[allow(dead_code)]
#[derive(Deserialize)]
struct BareIr<'a> {
    #[serde(borrow)]
    silp: Option<Cow<'a, str>>,
    #[serde(borrow)]
    version: Option<Cow<'a, str>>,
    #[serde(borrow)]
    intent: Cow<'a, str>,
    #[serde(borrow, default)]
    entities: Vec<BareObject<'a>>,
    #[serde(borrow, default)]
    constraints: Vec<BareObject<'a>>,
    #[serde(borrow, default)]
    alternatives: Vec<BareObject<'a>>,
    meta: BareMeta<'a>,
}

#[allow(dead_code)]
#[derive(Deserialize)]
struct BareObject<'a> {
    #[serde(borrow)]
    id: Option<Cow<'a, str>>,
    #[serde(borrow, rename = "type")]
    kind: Option<Cow<'a, str>>,
    #[serde(borrow)]
    value: Option<Cow<'a, str>>,
    #[serde(borrow)]
    action: Option<Cow<'a, str>>,
}

#[allow(dead_code)]
#[derive(Deserialize)]
struct BareMeta<'a> {
    #[serde(borrow)]
    req_id: Cow<'a, str>,
    priority: Option<f64>,
    confidence: Option<f64>,
}

struct Workload {
    name: &'static str,
    file: &'static str,
    lines: Vec<String>,
}

fn workloads() -> Vec<Workload> {
    let vectors: Vec<serde_json::Value> =
        serde_json::from_str(include_str!("../tests/vectors/silp-reference.json")).expect("vectors are JSON");
    let cycle = |items: Vec<String>| -> Vec<String> { items.iter().cycle().take(LINES).cloned().collect() };
    let irs = vectors.iter().filter_map(|v| v.get("ir").filter(|ir| ir.is_object())).map(|ir| ir.to_string());
    let texts = |field: &str| {
        vectors
            .iter()
            .filter_map(|v| v.get(field).and_then(|t| t.as_str()))
            .map(|t| serde_json::Value::String(t.to_owned()).to_string())
            .collect::<Vec<_>>()
    };
    let irs: Vec<String> = irs.collect();
    vec![
        Workload { name: "compile, code", file: "compile.jsonl", lines: cycle(irs.clone()) },
        Workload { name: "compile, json", file: "compile.jsonl", lines: cycle(irs) },
        Workload { name: "decode, code", file: "decode-code.jsonl", lines: cycle(texts("code")) },
        Workload { name: "decode, json", file: "decode-json.jsonl", lines: cycle(texts("json_text")) },
    ]
}

/// One compile line, as the command line does it.
fn compile_line(out: &mut String, line: &str, frontend: Frontend) {
    let rules = ValidateOptions::default();
    match schema::parse_ir_text(line) {
        Ok(ir) => {
            // `--lines` writes no warnings, so only the rules that refuse are run.
            let errors = validate::errors(&ir, rules);
            if errors.is_empty() {
                out.push_str("{\"ok\":");
                json_text::write_str(out, &silp::compile(&ir, frontend));
                out.push('}');
            } else {
                error_line(out, "decode_failed", &errors.join("; "));
            }
        }
        Err(e) => error_line(out, e.code.as_str(), &e.message),
    }
}

/// One decode line, as the command line does it.
fn decode_line(out: &mut String, line: &str, frontend: Frontend, options: &DecodeOptions) {
    let Ok(text) = serde_json::from_str::<Cow<str>>(line) else {
        return error_line(out, "invalid_syntax", "line is not JSON");
    };
    match silp::decode(&text, frontend, options) {
        Ok(decoded) => {
            out.push_str("{\"ok\":");
            out.push_str(&decoded.ir.to_compact_json());
            out.push('}');
        }
        Err(e) => error_line(out, e.code.as_str(), &e.message),
    }
}

fn error_line(out: &mut String, code: &str, message: &str) {
    out.push_str("{\"error\":{\"code\":\"");
    out.push_str(code);
    out.push_str("\",\"message\":");
    json_text::write_str(out, message);
    out.push_str("}}");
}

/// The best over rounds of the per-line time of `each` over every line: on a shared machine
/// the best round is the one least disturbed by other work.
fn per_line(lines: &[String], rounds: usize, mut each: impl FnMut(&mut String, &str)) -> f64 {
    let mut out = String::with_capacity(1 << 16);
    let mut times = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let start = Instant::now();
        for line in lines {
            each(&mut out, black_box(line));
            out.push('\n');
            if out.len() > 1 << 16 {
                black_box(&out);
                out.clear();
            }
        }
        times.push(start.elapsed().as_secs_f64() / lines.len() as f64);
    }
    times.into_iter().fold(f64::INFINITY, f64::min)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let write_to = args.iter().position(|a| a == "--write-lines").and_then(|i| args.get(i + 1));
    let workloads = workloads();
    if let Some(dir) = write_to {
        for w in &workloads {
            let mut text = w.lines.join("\n");
            text.push('\n');
            std::fs::write(format!("{dir}/{}", w.file), text).expect("lines are written");
        }
    }
    let rounds = if args.iter().any(|a| a == "--bench") { ROUNDS } else { 1 };
    let options = DecodeOptions::default();
    println!("| per line | whole path | bare serde parse of the same bytes | ratio |");
    println!("|---|---|---|---|");
    for w in &workloads {
        let whole = match w.name {
            "compile, code" => per_line(&w.lines, rounds, |out, l| compile_line(out, l, Frontend::Code)),
            "compile, json" => per_line(&w.lines, rounds, |out, l| compile_line(out, l, Frontend::Json)),
            "decode, code" => {
                per_line(&w.lines, rounds, |out, l| decode_line(out, l, Frontend::Code, &options))
            }
            _ => per_line(&w.lines, rounds, |out, l| decode_line(out, l, Frontend::Json, &options)),
        };
        let floor = if w.name.starts_with("compile") {
            per_line(&w.lines, rounds, |_, l| {
                black_box(serde_json::from_str::<BareIr>(l).is_ok());
            })
        } else {
            per_line(&w.lines, rounds, |_, l| {
                black_box(serde_json::from_str::<Cow<str>>(l).is_ok());
            })
        };
        println!("| {} | {:.2} µs | {:.3} µs | {:.1}x |", w.name, whole * 1e6, floor * 1e6, whole / floor);
    }
}
