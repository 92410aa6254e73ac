//! Token counts: the draft's single-token verbs, the counts of the conformance IRs' outputs
//! against an independent implementation, `fewest-tokens` in the chooser and the gateway, the
//! tokens the sanitiser removes, and the `silpgate silp tokens` command.

mod support;

use serde_json::{Value, json};
use silpgate::config::Config;
use silpgate::gateway::choose;
use silpgate::gateway::{
    ChoiceReason, Gateway, Inbound, MemoryStore, Note, Origin, Outcome, Status, Transport,
};
use silpgate::nlip::{self, Encoding, Limits};
use silpgate::silp::tokens::{self, Tokenizer};
use silpgate::silp::validate::{self, ValidateOptions};
use silpgate::silp::{self, DecodeOptions, Frontend, schema, whitelist};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

const BOTH: [Tokenizer; 2] = [Tokenizer::O200kBase, Tokenizer::Cl100kBase];

/// The draft's five examples (Appendix A.1..A.5) as its code frontend output spells them;
/// decoded, they are the IRs the examples stand for.
const DRAFT_EXAMPLES: [&str; 5] = [
    "if !rain(t+1): start(hike) else start(cards@indoor)",
    "if loc(me,Beijing,t+1am): cancel(flight,t+1pm); email(zhangsan)",
    "translate(src=fr_rev_bold, tgt=shakespeare_en, style=archaic_heavy)",
    "if budget<=500 and rating>=4.0: book(hotel,downtown,t+5)",
    "fetch(data) -> process -> email(result) with timeout",
];

/// SILP code with zero-width characters inside its words, as the sanitiser takes them out.
const SANITISER_INPUT: &str = "can\u{200b}cel(fl\u{200b}ig\u{200d}ht)";

fn draft_ir(code: &str) -> silp::Ir {
    silp::decode(code, Frontend::Code, &DecodeOptions::default()).expect("the draft's examples decode").ir
}

#[test]
fn every_whitelisted_verb_is_one_token_in_both_encodings() {
    // Draft §3.8: each verb is exactly one token; the code frontend writes it in lower case.
    for tokenizer in BOTH {
        for verb in whitelist::APPROVED {
            let name = verb.to_ascii_lowercase();
            assert_eq!(tokenizer.count(&name), 1, "{name} in {tokenizer}");
        }
        assert_eq!(tokens::multi_token_verbs(tokenizer), vec![], "{tokenizer}");
        // The excluded verbs were excluded for being several tokens; the check sees that too.
        for (excluded, _) in whitelist::EXCLUDED {
            assert!(tokenizer.count(&excluded.to_ascii_lowercase()) > 1, "{excluded} in {tokenizer}");
        }
    }
}

/// `tests/vectors/token-counts.json` was computed once with tiktoken-rs 0.12.1
/// (`CoreBPE::encode_ordinary`, o200k_base and cl100k_base), an implementation independent of
/// the bpe-openai crate silpgate counts with, over the code and json outputs of every IR vector
/// in `tests/vectors/silp-reference.json` that compiles (the texts from
/// `silpgate silp compile --no-whitelist --lines`). Each entry keeps the text it counted,
/// so a change of the codec shows as a changed text, not as a wrong count.
#[test]
fn conformance_outputs_count_as_an_independent_implementation_counts_them() {
    let table: Value =
        serde_json::from_str(include_str!("vectors/token-counts.json")).expect("the table is JSON");
    let vectors: Value =
        serde_json::from_str(include_str!("vectors/silp-reference.json")).expect("the vectors are JSON");
    let entries = table["entries"].as_array().expect("entries");
    let mut checked = 0;
    for vector in vectors.as_array().unwrap() {
        let name = vector["name"].as_str().unwrap();
        let Some(ir) = vector.get("ir").and_then(|v| schema::parse_ir(v).ok()) else { continue };
        // What `silpgate silp compile --no-whitelist` compiles: IRs without validator errors.
        if !validate::validate(&ir, ValidateOptions { enforce_whitelist: false }).valid {
            continue;
        }
        for frontend in [Frontend::Code, Frontend::Json] {
            let entry = entries
                .iter()
                .find(|e| e["vector"] == name && e["frontend"] == frontend.name())
                .unwrap_or_else(|| panic!("{name} ({frontend}) is missing from the token table"));
            let text = silp::compile(&ir, frontend);
            assert_eq!(entry["text"], text.as_str(), "{name} ({frontend}) compiles to the counted text");
            for tokenizer in BOTH {
                let want = entry[tokenizer.name()].as_u64().expect("a count");
                assert_eq!(tokenizer.count(&text) as u64, want, "{name} ({frontend}) in {tokenizer}: {text}");
            }
            checked += 1;
        }
    }
    assert_eq!(checked, entries.len(), "every table entry is a vector's output");
    assert!(checked >= 180, "only {checked} outputs checked");
}

/// cl100k_base counts from OpenAI's own tiktoken (Python, `tests/interop/token_counts.py`),
/// run here: every text of the table above, every approved verb, the draft's examples and the
/// heavily quoted IR in both frontends, the sanitiser's input. silpgate's counter and the
/// table must both agree with it, so that neither the table nor the tests below that weigh
/// frontends by silpgate's own counts rest on silpgate's counter alone. (o200k_base is checked
/// against the table only: no copy of its ranks reaches this machine; tests/run.sh says why.)
#[test]
fn cl100k_counts_are_tiktokens() {
    let table: Value =
        serde_json::from_str(include_str!("vectors/token-counts.json")).expect("the table is JSON");
    let entries = table["entries"].as_array().expect("entries");
    let mut texts: Vec<String> = entries.iter().map(|e| e["text"].as_str().unwrap().to_owned()).collect();
    texts.extend(whitelist::APPROVED.iter().map(|verb| verb.to_ascii_lowercase()));
    let irs: Vec<silp::Ir> =
        DRAFT_EXAMPLES.iter().map(|code| draft_ir(code)).chain([heavily_quoted_ir()]).collect();
    for ir in &irs {
        texts.extend([Frontend::Code, Frontend::Json].map(|f| silp::compile(ir, f)));
    }
    texts.extend([SANITISER_INPUT, "cancel(flight)"].map(str::to_owned));
    let python = std::env::var("SILPGATE_PYTHON").unwrap_or_else(|_| "target/pyenv/bin/python".into());
    let mut command = Command::new(&python);
    command.arg(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/interop/token_counts.py"));
    let input = serde_json::to_vec(&texts).unwrap();
    let output = support::process::run_bounded_with_input(command, &input, Duration::from_secs(120));
    assert!(output.status.success(), "token_counts.py: {}", String::from_utf8_lossy(&output.stderr));
    let counts: Vec<usize> = serde_json::from_slice(&output.stdout).expect("a JSON array of counts");
    assert_eq!(counts.len(), texts.len());
    for (i, (text, want)) in texts.iter().zip(&counts).enumerate() {
        assert_eq!(Tokenizer::Cl100kBase.count(text), *want, "silpgate's cl100k_base count of {text:?}");
        if let Some(entry) = entries.get(i) {
            assert_eq!(entry["cl100k_base"].as_u64(), Some(*want as u64), "the table's count of {text:?}");
        }
    }
    assert!(counts.len() >= 200, "only {} texts counted", counts.len());
}

fn cheapest(ir: &silp::Ir, tokenizer: Tokenizer) -> Frontend {
    choose::fewest_tokens(None, false, |f| tokenizer.count(&silp::compile(ir, f))).unwrap().frontend
}

#[test]
fn fewest_tokens_picks_code_for_the_draft_examples() {
    for code in DRAFT_EXAMPLES {
        let ir = draft_ir(code);
        for tokenizer in BOTH {
            assert_eq!(cheapest(&ir, tokenizer), Frontend::Code, "{code} in {tokenizer}");
        }
    }
}

/// A note pasted from a word processor: paragraphs separated by U+2028 LINE SEPARATOR and
/// U+0085 NEXT LINE. The code frontend never writes those raw (they break lines for some
/// readers), so it quotes the value and spells each as `\u2028`, several tokens apiece; the
/// json frontend writes them raw, and that outweighs its longer slot syntax.
fn heavily_quoted_ir() -> silp::Ir {
    let paragraphs = ["Dear team", "the flight is off", "rebook for Monday", "keep the hotel", "thanks"];
    let note = paragraphs.join("\u{2028}\u{85}");
    let value = json!({
        "silp": "v1", "intent": "!EMAIL",
        "entities": [
            {"id": "act", "value": "ops", "action": "!EMAIL"},
            {"id": "body", "value": note, "action": "!EMAIL"}
        ],
        "constraints": [], "alternatives": [], "meta": {"req_id": "abcd"}
    });
    schema::parse_ir(&value).expect("a valid IR")
}

#[test]
fn fewest_tokens_picks_json_where_code_needs_heavy_quoting() {
    let ir = heavily_quoted_ir();
    for tokenizer in BOTH {
        let code = tokenizer.count(&silp::compile(&ir, Frontend::Code));
        let json = tokenizer.count(&silp::compile(&ir, Frontend::Json));
        assert!(json < code, "{tokenizer}: json {json} tokens, code {code}");
        assert_eq!(cheapest(&ir, tokenizer), Frontend::Json, "{tokenizer}");
    }
}

const CONFIG: &str = r#"
[[agents]]
name = "gpt"
frontends = ["code", "json"]
tokenizer = "o200k_base"
frontend = "fewest-tokens"

[[agents]]
name = "plain"
frontends = ["code", "json"]

[[agents]]
name = "lossy-ok"
frontends = []
tokenizer = "cl100k_base"

[[routes]]
name = "lossy"
destination = "lossy-ok"
mode = "encode"
frontend = "fewest-tokens"
allow_lossy = true
[routes.match]
source = "lossy"

[[routes]]
name = "forced"
destination = "gpt"
mode = "encode"
frontend = "code"
[routes.match]
source = "forced"

[[routes]]
name = "plain"
destination = "plain"
mode = "encode"
[routes.match]
source = "plain"

[[routes]]
name = "default"
destination = "gpt"
mode = "encode"
"#;

fn gateway() -> Gateway {
    Gateway::new(Arc::new(Config::parse(CONFIG).expect("test config is valid")), Arc::new(MemoryStore::new()))
}

fn send(g: &Gateway, source: &str, subformat: &str, content: Value) -> Outcome {
    let envelope = json!({"format": "structured", "subformat": subformat, "content": content});
    let envelope = nlip::decode(envelope.to_string().as_bytes(), Encoding::Json, &Limits::default()).unwrap();
    let o = g.handle(Inbound { envelope, origin: Origin::new(Transport::Cli, source), received_at: 0 });
    assert!(matches!(o.status, Status::Delivered), "{:?}", o.status);
    o
}

fn choice(o: &Outcome) -> (Frontend, ChoiceReason) {
    o.notes
        .iter()
        .find_map(|n| match n {
            Note::Frontend { frontend, reason, .. } => Some((*frontend, *reason)),
            _ => None,
        })
        .expect("a frontend note")
}

fn tokens_note(o: &Outcome) -> Option<(String, Frontend, Tokenizer, usize, usize)> {
    o.notes.iter().find_map(|n| match n {
        Note::Tokens { agent, frontend, tokenizer, surface, natural } => {
            Some((agent.clone(), *frontend, *tokenizer, *surface, *natural))
        }
        _ => None,
    })
}

#[test]
fn the_gateway_sends_the_frontend_with_the_fewest_tokens_and_says_why() {
    let g = gateway();
    let draft = draft_ir(DRAFT_EXAMPLES[0]).to_value();
    let o = send(&g, "ingress", "silp-ir", draft.clone());
    assert_eq!(choice(&o), (Frontend::Code, ChoiceReason::FewestTokens));
    let code = silp::compile(&draft_ir(DRAFT_EXAMPLES[0]), Frontend::Code);
    let natural = silp::compile(&draft_ir(DRAFT_EXAMPLES[0]), Frontend::Natural);
    let t = Tokenizer::O200kBase;
    assert_eq!(
        tokens_note(&o),
        Some(("gpt".into(), Frontend::Code, t, t.count(&code), t.count(&natural))),
        "the tokens note counts what was sent and the baseline"
    );

    // The text sent goes through the compile.lock like any other: frozen the first time.
    assert!(o.notes.iter().any(|n| matches!(n, Note::LockFrozen { frontend: Frontend::Code, .. })));
    let again = send(&g, "ingress", "silp-ir", draft.clone());
    assert!(!again.notes.iter().any(|n| matches!(n, Note::LockFrozen { .. })), "frozen once");
    assert_eq!(again.outbound[0].envelope.content, o.outbound[0].envelope.content);

    let o = send(&g, "ingress", "silp-ir", heavily_quoted_ir().to_value());
    assert_eq!(choice(&o), (Frontend::Json, ChoiceReason::FewestTokens));
    let out: Value = serde_json::from_str(&nlip::to_json(&o.outbound[0].envelope)).unwrap();
    assert_eq!(out["subformat"], "silp-json");

    // A route's fixed frontend wins over the agent's fewest-tokens.
    let o = send(&g, "forced", "silp-ir", heavily_quoted_ir().to_value());
    assert_eq!(choice(&o), (Frontend::Code, ChoiceReason::RouteOverride));

    // Without a tokenizer nothing is counted; the choice is the usual one.
    let o = send(&g, "plain", "silp-ir", draft);
    assert_eq!(choice(&o), (Frontend::Code, ChoiceReason::AgentProfile));
    assert_eq!(tokens_note(&o), None);
}

#[test]
fn a_route_that_allows_lossy_weighs_the_natural_baselines_too() {
    let g = gateway();
    // One short call: the natural rendering of an entity-less search is a couple of words.
    let ir = json!({"silp":"v1","intent":"!SEARCH","entities":[],"meta":{"req_id":"abcd"}});
    let o = send(&g, "lossy", "silp-ir", ir.clone());
    let parsed = schema::parse_ir(&ir).unwrap();
    let t = Tokenizer::Cl100kBase;
    let counts: Vec<(usize, Frontend)> =
        Frontend::ALL.iter().map(|f| (t.count(&silp::compile(&parsed, *f)), *f)).collect();
    let best = counts.iter().min_by_key(|(n, _)| *n).unwrap();
    assert_eq!(choice(&o), (best.1, ChoiceReason::FewestTokens), "{counts:?}");
    let (agent, _, tokenizer, surface, _) = tokens_note(&o).expect("a tokens note");
    assert_eq!((agent.as_str(), tokenizer, surface), ("lossy-ok", t, best.0));
}

#[test]
fn the_sanitiser_records_the_tokens_its_change_removed() {
    let g = gateway();
    let o = send(&g, "ingress", "silp-code", json!(SANITISER_INPUT));
    let (before, after) = o
        .notes
        .iter()
        .find_map(|n| match n {
            Note::SanitizedTokens { tokenizer: Tokenizer::O200kBase, before, after, .. } => {
                Some((*before, *after))
            }
            _ => None,
        })
        .expect("a sanitised-tokens note");
    let t = Tokenizer::O200kBase;
    assert_eq!(before, t.count(SANITISER_INPUT));
    assert_eq!(after, t.count("cancel(flight)"));
    assert!(before > after, "{before} -> {after}");

    let metrics = silpgate::metrics::get();
    let removed = || metrics.sanitizer_tokens.with_label_values(&["o200k_base"]).get();
    let was = removed();
    metrics.observe_notes(&o.notes);
    assert_eq!(removed() - was, (before - after) as u64);
}

#[test]
fn the_token_metrics_count_per_agent_frontend_and_tokenizer() {
    let g = gateway();
    let o = send(&g, "ingress", "silp-code", json!("cancel(flight)"));
    let (agent, frontend, tokenizer, surface, natural) = tokens_note(&o).expect("a tokens note");
    let metrics = silpgate::metrics::get();
    let labels = [agent.as_str(), frontend.name(), tokenizer.name()];
    let (s0, n0) = (
        metrics.surface_tokens.with_label_values(&labels).get(),
        metrics.natural_tokens.with_label_values(&labels).get(),
    );
    metrics.observe_notes(&o.notes);
    assert_eq!(metrics.surface_tokens.with_label_values(&labels).get() - s0, surface as u64);
    assert_eq!(metrics.natural_tokens.with_label_values(&labels).get() - n0, natural as u64);
    let text = metrics.render();
    assert!(
        text.contains(
            "silpgate_payload_tokens_total{agent=\"gpt\",frontend=\"code\",tokenizer=\"o200k_base\"}"
        )
    );
}

#[test]
fn a_ping_may_name_the_tokenizer_and_a_bad_one_is_refused() {
    let g = gateway();
    let ping = |tokenizer: Value| {
        let v = json!({"messagetype":"control","format":"text","subformat":"english","content":"//ping","submessages":[
            {"format":"structured","subformat":"json","content":{"silp":"v1","frontends":["json"],"tokenizer":tokenizer}}
        ]});
        let envelope = nlip::decode(v.to_string().as_bytes(), Encoding::Json, &Limits::default()).unwrap();
        g.handle(Inbound { envelope, origin: Origin::new(Transport::Cli, "newcomer"), received_at: 0 })
    };
    let o = ping(json!("cl100k_base"));
    assert!(matches!(o.status, Status::Delivered), "{:?}", o.status);
    let profile = g.store().profile("newcomer").unwrap().expect("a profile");
    assert_eq!(profile.tokenizer, Some(Tokenizer::Cl100kBase));
    for bad in [json!("p50k_base"), json!("file:/tmp/tokenizer.json"), json!(7)] {
        let o = ping(bad.clone());
        let Status::Failed(e) = &o.status else { panic!("{bad} accepted: {:?}", o.status) };
        assert!(e.to_string().contains("tokenizer"), "{bad}: {e}");
    }
}

#[test]
fn configuration_names_tokenizers_and_fewest_tokens_and_refuses_the_rest() {
    let config = Config::parse(CONFIG).unwrap();
    assert_eq!(config.agents[0].tokenizer, Some(Tokenizer::O200kBase));
    let refused = |text: &str| Config::parse(text).unwrap_err().to_string();
    let e = refused("[[agents]]\nname = \"a\"\nfrontends = []\ntokenizer = \"gpt2\"\n");
    assert!(e.contains("unknown tokenizer 'gpt2'") && e.contains("o200k_base, cl100k_base"), "{e}");
    let e = refused("[[agents]]\nname = \"a\"\nfrontends = []\ntokenizer = \"file:/m/tokenizer.json\"\n");
    assert!(e.contains("tokenizer files are not supported"), "{e}");
    let e = refused("[[agents]]\nname = \"a\"\nfrontends = []\nfrontend = \"json\"\n");
    assert!(e.contains("agent 'a'") && e.contains("fewest-tokens"), "{e}");
    let e = refused(
        "[[agents]]\nname = \"a\"\nfrontends = []\n[[routes]]\nname = \"r\"\ndestination = \"a\"\nmode = \"encode\"\nfrontend = \"fewest\"\n",
    );
    assert!(e.contains("unknown frontend 'fewest'") && e.contains("fewest-tokens"), "{e}");
}

fn silpgate(args: &[&str], stdin: &str) -> (i32, String, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_silpgate"));
    command.args(args);
    let out = support::process::run_bounded_with_input(command, stdin.as_bytes(), Duration::from_secs(60));
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

#[test]
fn the_tokens_command_measures_every_frontend_against_natural_language() {
    let ir = draft_ir(DRAFT_EXAMPLES[0]);
    let (code, out, err) = silpgate(&["silp", "tokens", "--tokenizer", "o200k_base"], &ir.to_compact_json());
    assert_eq!(code, 0, "{err}");
    let report: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(report["tokenizer"], "o200k_base");
    let t = Tokenizer::O200kBase;
    let natural = t.count(&silp::compile(&ir, Frontend::Natural));
    for frontend in Frontend::ALL {
        let text = silp::compile(&ir, frontend);
        let entry = &report[frontend.name()];
        assert_eq!(entry["bytes"], text.len(), "{frontend}");
        assert_eq!(entry["tokens"], t.count(&text), "{frontend}");
        let ratio = entry["tokens_vs_natural"].as_f64().unwrap();
        assert!((ratio - t.count(&text) as f64 / natural as f64).abs() < 0.001, "{frontend}: {ratio}");
    }
    assert_eq!(report["natural"]["tokens_vs_natural"], 1.0);

    // Surface text: decoded, and the text as given measured beside the frontends.
    let a5 = DRAFT_EXAMPLES[4];
    let (code, out, err) =
        silpgate(&["silp", "tokens", "--tokenizer", "cl100k_base", "--frontend", "code"], a5);
    assert_eq!(code, 0, "{err}");
    let report: Value = serde_json::from_str(&out).unwrap();
    let c = Tokenizer::Cl100kBase;
    assert_eq!(report["input"], json!({"frontend": "code", "bytes": a5.len(), "tokens": c.count(a5)}));
    assert_eq!(report["json"]["tokens"], c.count(&silp::compile(&draft_ir(a5), Frontend::Json)));
}

#[test]
fn the_tokens_command_counts_text_as_it_is_one_line_at_a_time() {
    let lines = "\"cancel(flight)\"\n\"\u{200b}\"\nnot json\n\"Отменить рейс\"\n";
    let (code, out, err) =
        silpgate(&["silp", "tokens", "--tokenizer", "o200k_base", "--text", "--lines"], lines);
    assert_eq!(code, 0, "{err}");
    let out: Vec<Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let t = Tokenizer::O200kBase;
    assert_eq!(
        out[0],
        json!({"ok": {"tokenizer": "o200k_base", "bytes": 14, "tokens": t.count("cancel(flight)")}})
    );
    // A zero-width space alone is a token of its own: what §8.1 warns about.
    assert_eq!(out[1]["ok"]["tokens"], t.count("\u{200b}"));
    assert!(t.count("\u{200b}") >= 1);
    assert_eq!(out[2]["error"]["code"], "invalid_syntax");
    assert_eq!(out[3]["ok"]["tokens"], t.count("Отменить рейс"));
    assert_eq!(out.len(), 4);

    // An IR per line; a bad one is an error line, the rest go on.
    let ir = draft_ir(DRAFT_EXAMPLES[2]).to_compact_json();
    let input = format!("{ir}\n{{\"silp\":\"v1\"}}\n");
    let (code, out, err) = silpgate(&["silp", "tokens", "--tokenizer", "cl100k_base", "--lines"], &input);
    assert_eq!(code, 0, "{err}");
    let out: Vec<Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert!(out[0]["ok"]["code"]["tokens"].as_u64().unwrap() > 0, "{}", out[0]);
    assert_eq!(out[1]["error"]["code"], "decode_failed", "{}", out[1]);
}

#[test]
fn the_tokens_command_refuses_bad_arguments_and_checks_the_verbs() {
    let (code, out, _) = silpgate(&["silp", "tokens", "--verbs", "--tokenizer", "cl100k_base"], "");
    assert_eq!(code, 0);
    assert!(out.contains("all 13 whitelisted verbs are one token in cl100k_base"), "{out}");
    let (code, _, err) = silpgate(&["silp", "tokens", "--tokenizer", "gpt2"], "{}");
    assert_eq!(code, 2);
    assert!(err.contains("unknown tokenizer 'gpt2'"), "{err}");
    let (code, _, err) =
        silpgate(&["silp", "tokens", "--tokenizer", "o200k_base", "--frontend", "natural"], "x");
    assert_eq!(code, 2);
    assert!(err.contains("--text"), "{err}");
    let (code, _, err) =
        silpgate(&["silp", "tokens", "--tokenizer", "o200k_base", "--frontend", "code"], "cancel(");
    assert_eq!(code, 1);
    assert!(err.contains("error[invalid_syntax]"), "{err}");
}
