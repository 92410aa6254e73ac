//! Conformance with the SILP reference implementation: every public vector in
//! `tests/vectors/silp-reference.json` (produced by running the reference) is checked, and a
//! failure names the vector and shows both sides.
//!
//! Where silpgate deliberately differs, the vector is listed below with the reason; the test
//! also proves each compile deviation is needed (the reference's own text does not decode back
//! to the IR), so the lists cannot silently grow.

use serde_json::Value;
use silpgate::silp::equivalence::{Strictness, comparable, equivalent};
use silpgate::silp::validate::{self, ValidateOptions};
use silpgate::silp::{self, DecodeOptions, ErrorCode, Frontend, ReqIdMode, schema};

/// IR vectors where silpgate's output differs from the reference's because the reference's
/// output does not decode back to the same IR (docs/silp.md, "Deviations").
const COMPILE_DEVIATIONS: &[(&str, Frontend, &str)] = &[
    (
        "tests/test_phase1/duplicate_entity_id",
        Frontend::Json,
        "two entities share the id 'act'; flat slots keep only the last",
    ),
    ("probe/value_with_unbalanced_paren", Frontend::Code, "')' inside a value ends the call"),
    ("probe/value_with_leading_space", Frontend::Code, "surrounding spaces are trimmed when read"),
    ("probe/value_with_equals", Frontend::Code, "'a=b' reads as a keyword argument"),
    ("probe/secondary_kwarg_like_value", Frontend::Code, "'to=bob' reads as a keyword argument"),
    ("probe/negation_value_false_lossy", Frontend::Code, "'!rain(t+1)' always means value 'true'"),
    ("probe/func_constraint_value_with_comma", Frontend::Code, "',' inside a value splits it"),
    ("probe/constraint_type_with_dash", Frontend::Code, "'error-rate' is not a name"),
    ("probe/alt_target_with_at", Frontend::Code, "'@' inside a target starts the location"),
    ("probe/alt_target_with_comma", Frontend::Code, "',' inside a target splits it"),
    (
        "probe/entity_id_collides_with_constraints_slot",
        Frontend::Json,
        "an id 'constraints' takes the constraints slot",
    ),
    (
        "probe/entity_id_starts_with_action_",
        Frontend::Json,
        "an id 'action_email' reads as a secondary action",
    ),
    ("probe/duplicate_primary_ids", Frontend::Json, "two entities share the id 'act'"),
    ("probe/entity_extra_field", Frontend::Json, "flat slots cannot carry an entity's extra fields"),
    // Decode vectors carry the reference's compile of the decoded IR as well.
    ("draft/4.1_nested_constraints", Frontend::Json, "three positional arguments share the id 'act'"),
    ("paper/case8_tool_invocation", Frontend::Json, "four positional arguments share the id 'act'"),
    ("paper/case9_multi_turn", Frontend::Json, "three positional arguments share the id 'act'"),
    (
        "paper/case7_conditional_branching",
        Frontend::Code,
        "the misread value 'ticket) else escalate(manager' has an unbalanced ')'",
    ),
    (
        "malformed/code_zero_width_in_value",
        Frontend::Code,
        "a raw U+200B is invisible and stripped when read; written as \\u200b",
    ),
    (
        "malformed/code_zero_width_in_value",
        Frontend::Json,
        "a raw U+200B is invisible and stripped when read; written as \\u200b",
    ),
    (
        "malformed/code_semicolon_no_space",
        Frontend::Code,
        "the misread value 'flight);email(x' has an unbalanced ')'",
    ),
    (
        "malformed/code_newline_separated",
        Frontend::Code,
        "the misread value holds a newline and an unbalanced ')'",
    ),
    ("malformed/json_list_primary_value", Frontend::Code, "the misread value \"['a', 'b']\" has a comma"),
];

/// IR vectors the schema rejects although the reference accepts them.
const SCHEMA_DEVIATIONS: &[(&str, &str)] = &[(
    "probe/intent_trailing_newline",
    "the schema's pattern '^![A-Z][A-Z_]*$' does not match a trailing newline (Python's '$' does)",
)];

/// What silpgate reads where the reference reads the input wrongly, or errs where the
/// reference accepted garbage. `Ok(code)`: the decoded IR, recompiled with the code frontend.
const DECODE_DEVIATIONS: &[(&str, Result<&str, ErrorCode>)] = &[
    ("draft00/operator_then_form", Ok("if weather>rain: switch(indoor_activity)")),
    ("paper/case7_conditional_branching", Ok("if urgency>high: route(ticket) else: escalate(manager)")),
    ("malformed/code_cyrillic_homoglyph_fn", Ok("cancel(flight)")),
    ("malformed/code_zero_width_in_fn", Ok("cancel(flight)")),
    ("malformed/code_bom_prefix", Ok("cancel(flight)")),
    ("malformed/code_zero_width_in_value", Ok("cancel(flight)")),
    ("malformed/code_semicolon_no_space", Ok("cancel(flight); email(x)")),
    ("malformed/code_newline_separated", Ok("cancel(flight); email(x)")),
    ("malformed/json_null_value", Err(ErrorCode::DecodeFailed)),
    ("malformed/json_list_primary_value", Err(ErrorCode::DecodeFailed)),
    ("malformed/json_meta_key", Err(ErrorCode::DecodeFailed)),
];

fn vectors() -> Vec<Value> {
    serde_json::from_str(include_str!("vectors/silp-reference.json")).expect("vector file is JSON")
}

fn name(v: &Value) -> &str {
    v["name"].as_str().expect("every vector has a name")
}

fn reference() -> DecodeOptions {
    DecodeOptions { req_id: ReqIdMode::Reference, ..DecodeOptions::default() }
}

fn schema_deviation(v: &Value) -> bool {
    SCHEMA_DEVIATIONS.iter().any(|(n, _)| *n == name(v))
}

fn strictness(frontend: Frontend) -> Strictness {
    if frontend == Frontend::Json { Strictness::WithExtras } else { Strictness::Semantic }
}

#[test]
fn vector_file_has_every_group() {
    let v = vectors();
    assert_eq!(v.len(), 126);
    for group in ["example/", "tests/", "draft/", "probe/", "malformed/"] {
        assert!(v.iter().any(|x| name(x).starts_with(group)), "no {group} vectors");
    }
}

#[test]
fn compile_output_is_byte_identical_except_documented_deviations() {
    let mut failures = Vec::new();
    // The vectors the reference compiled (a schema-invalid IR has `json_text: null`), but for
    // the documented schema deviations, which the reference accepts and the schema does not:
    // each of their IRs is schema-valid, and none is skipped.
    for v in vectors().iter().filter(|v| v["json_text"].is_string() && !schema_deviation(v)) {
        let ir = schema::parse_ir(&v["ir"]).unwrap_or_else(|e| panic!("{}: {e}", name(v)));
        for (frontend, key) in [
            (Frontend::Code, "code"),
            (Frontend::Json, "json_text"),
            (Frontend::Natural, "natural"),
            (Frontend::NlJson, "nl_json"),
        ] {
            let ours = silp::compile(&ir, frontend);
            let theirs = v[key].as_str().expect("compiled text");
            let deviation = COMPILE_DEVIATIONS.iter().any(|(n, f, _)| *n == name(v) && *f == frontend);
            if deviation {
                if ours == theirs {
                    failures.push(format!("{}: {key} is listed as a deviation but is identical", name(v)));
                }
                // The deviation is only allowed where the reference's text loses something.
                let back = silp::decode(theirs, frontend, &DecodeOptions::default());
                if back.is_ok_and(|d| equivalent(&ir, &d.ir, strictness(frontend))) {
                    failures.push(format!(
                        "{}: {key} deviates although the reference text {theirs:?} round-trips",
                        name(v)
                    ));
                }
            } else if ours != theirs {
                failures.push(format!("{}: {key}\n  reference: {theirs}\n  silpgate:  {ours}", name(v)));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn canonical_json_and_ir_hash_match_the_reference() {
    let mut failures = Vec::new();
    for v in vectors().iter().filter(|v| v.get("ir_sha256").is_some() && !schema_deviation(v)) {
        let ir = schema::parse_ir(&v["ir"]).unwrap_or_else(|e| panic!("{}: {e}", name(v)));
        if Some(ir.to_compact_json().as_str()) != v["compact_json"].as_str() {
            failures.push(format!(
                "{}: compact JSON\n  reference: {}\n  silpgate:  {}",
                name(v),
                v["compact_json"],
                ir.to_compact_json()
            ));
        }
        if Some(ir.ir_hash().as_str()) != v["ir_sha256"].as_str() {
            failures.push(format!("{}: ir_hash {} != {}", name(v), ir.ir_hash(), v["ir_sha256"]));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn schema_rejects_what_the_reference_rejects() {
    let mut failures = Vec::new();
    for v in vectors().iter().filter(|v| v.get("json_text").is_some() || v.get("schema_error").is_some()) {
        let expected_error = v.get("schema_error").is_some() || schema_deviation(v);
        match (schema::parse_ir(&v["ir"]), expected_error) {
            (Ok(_), true) => failures.push(format!("{}: accepted, expected a schema error", name(v))),
            (Err(e), false) => failures.push(format!("{}: rejected: {e}", name(v))),
            (Err(e), true) => assert!(e.message.contains(" at "), "{}: error names no path: {e}", name(v)),
            (Ok(_), false) => {}
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn validator_reports_the_reference_rules_and_messages() {
    let mut failures = Vec::new();
    for v in vectors().iter().filter(|v| v.get("validate").is_some()) {
        let enforce_whitelist = !name(v).contains("whitelist_disabled");
        let report = validate::validate_value(&v["ir"], ValidateOptions { enforce_whitelist });
        let expected = &v["validate"];
        if v.get("schema_error").is_some() || schema_deviation(v) {
            if report.valid || report.errors.is_empty() {
                failures.push(format!("{}: expected schema errors, got {report:?}", name(v)));
            }
            continue;
        }
        let ours = serde_json::to_value(&report).expect("report serialises");
        if &ours != expected {
            failures.push(format!("{}:\n  reference: {expected}\n  silpgate:  {ours}", name(v)));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn reference_text_decodes_to_the_reference_ir_with_operator_and_subject_kept() {
    let mut failures = Vec::new();
    for v in vectors().iter().filter(|v| v.get("json_text").is_some() && !schema_deviation(v)) {
        for (frontend, text_key, decoded_key) in
            [(Frontend::Code, "code", "code_decoded"), (Frontend::Json, "json_text", "json_decoded")]
        {
            let (Some(text), Some(expected)) = (v[text_key].as_str(), v[decoded_key].get("ir")) else {
                continue;
            };
            let deviation = COMPILE_DEVIATIONS.iter().any(|(n, f, _)| *n == name(v) && *f == frontend);
            match silp::decode(text, frontend, &reference()) {
                Ok(d) if &d.ir.to_value() == expected => {}
                Ok(_) | Err(_) if deviation => {}
                Ok(d) => failures.push(format!(
                    "{}: {decoded_key}\n  reference: {expected}\n  silpgate:  {}",
                    name(v),
                    d.ir.to_compact_json()
                )),
                Err(e) => failures.push(format!("{}: {decoded_key}: {e}", name(v))),
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn reference_outputs_the_reference_cannot_decode_decode_here() {
    // examples case5b/case5c (`disk>90%`, `error_rate>5%`) and the probes the reference fails on.
    let mut failures = Vec::new();
    for v in vectors().iter().filter(|v| v["code_decoded"].get("error").is_some() && !schema_deviation(v)) {
        if COMPILE_DEVIATIONS.iter().any(|(n, f, _)| *n == name(v) && *f == Frontend::Code) {
            continue;
        }
        let ir = schema::parse_ir(&v["ir"]).expect("schema-valid");
        let text = v["code"].as_str().expect("code text");
        match silp::decode(text, Frontend::Code, &DecodeOptions::default()) {
            Ok(d) if equivalent(&ir, &d.ir, Strictness::Semantic) => {}
            Ok(d) => failures.push(format!(
                "{}: {text}\n  want {}\n  got  {}",
                name(v),
                comparable(&ir, Strictness::Semantic),
                comparable(&d.ir, Strictness::Semantic)
            )),
            Err(e) => failures.push(format!("{}: {text}: {e}", name(v))),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn every_vector_ir_round_trips_through_both_lossless_frontends() {
    let mut failures = Vec::new();
    // The vectors the reference compiled (a schema-invalid IR has `json_text: null`), but for
    // the documented schema deviations, which the reference accepts and the schema does not:
    // each of their IRs is schema-valid, and none is skipped.
    for v in vectors().iter().filter(|v| v["json_text"].is_string() && !schema_deviation(v)) {
        let ir = schema::parse_ir(&v["ir"]).unwrap_or_else(|e| panic!("{}: {e}", name(v)));
        for frontend in [Frontend::Code, Frontend::Json] {
            let text = silp::compile(&ir, frontend);
            match silp::decode(&text, frontend, &DecodeOptions::default()) {
                Ok(d) if equivalent(&ir, &d.ir, strictness(frontend)) => {}
                Ok(d) => failures.push(format!(
                    "{} via {frontend}: {text}\n  want {}\n  got  {}",
                    name(v),
                    comparable(&ir, strictness(frontend)),
                    comparable(&d.ir, strictness(frontend))
                )),
                Err(e) => failures.push(format!("{} via {frontend}: {text}: {e}", name(v))),
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn decode_vectors_match_the_reference_except_documented_deviations() {
    let mut failures = Vec::new();
    for v in vectors().iter().filter(|v| v.get("decode_input").is_some()) {
        let frontend: Frontend =
            v["decode_frontend"].as_str().expect("frontend").parse().expect("known frontend");
        let input = v["decode_input"].as_str().expect("input");
        let ours = silp::decode(input, frontend, &reference());
        if let Some((_, expected)) = DECODE_DEVIATIONS.iter().find(|(n, _)| *n == name(v)) {
            match (expected, &ours) {
                (Ok(code), Ok(d)) if silp::compile(&d.ir, Frontend::Code) == *code => {}
                (Err(code), Err(e)) if e.code == *code => {}
                _ => failures.push(format!("{}: expected {expected:?}, got {ours:?}", name(v))),
            }
            continue;
        }
        match (v["decode_result"].get("ir"), &ours) {
            (Some(expected), Ok(d)) if &d.ir.to_value() == expected => {}
            (None, Err(e)) => {
                // The reference raised; silpgate must raise too, with a draft error code.
                assert!(!e.message.is_empty(), "{}: empty message", name(v));
                let expected_code = match v["decode_result"]["error"]["type"].as_str() {
                    Some("ValueError" | "JSONDecodeError") => ErrorCode::InvalidSyntax,
                    Some("NotImplementedError") => ErrorCode::UnsupportedFrontend,
                    _ => ErrorCode::DecodeFailed,
                };
                if e.code != expected_code {
                    failures.push(format!(
                        "{}: error code {} (expected {expected_code}): {e}",
                        name(v),
                        e.code
                    ));
                }
            }
            (expected, ours) => {
                failures.push(format!("{}:\n  reference: {expected:?}\n  silpgate:  {ours:?}", name(v)))
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
