//! Property tests for the SILP codec: `decode(compile(ir))` is equivalent to `ir` for every
//! valid IR through both lossless frontends, and no input makes a decoder panic.

use proptest::prelude::*;
use serde_json::value::RawValue;
use serde_json::{Map, json};
use silpgate::gateway::payload::{self, SilpForm};
use silpgate::nlip::{Content, RawJson};
use silpgate::silp::equivalence::{Strictness, comparable};
use silpgate::silp::ir::{Constraint, Entity, Ir, Meta};
use silpgate::silp::{self, DecodeOptions, Frontend, Notice, sanitize, schema};

#[path = "support/ir_strategy.rs"]
mod ir_strategy;
use ir_strategy::{arbitrary_json, ir};

fn round_trip(ir: &Ir, frontend: Frontend, strictness: Strictness) -> Result<(), TestCaseError> {
    let text = silp::compile(ir, frontend);
    let decoded = silp::decode(&text, frontend, &DecodeOptions::default()).map_err(|e| {
        TestCaseError::fail(format!("{frontend} text {text:?} does not decode:\n{}", e.render(&text)))
    })?;
    prop_assert_eq!(
        comparable(ir, strictness),
        comparable(&decoded.ir, strictness),
        "via {} text {:?}",
        frontend,
        text
    );
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn code_frontend_is_lossless(ir in ir()) {
        round_trip(&ir, Frontend::Code, Strictness::Semantic)?;
    }

    #[test]
    fn json_frontend_is_lossless_and_keeps_extras(ir in ir()) {
        round_trip(&ir, Frontend::Json, Strictness::WithExtras)?;
    }

    #[test]
    fn generated_irs_are_schema_valid_and_hash_stably(ir in ir()) {
        let value = ir.to_value();
        let parsed = schema::parse_ir(&value).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(parsed.ir_hash(), ir.ir_hash());
        // The canonical JSON carries everything, meta included: floats read back bit for bit.
        prop_assert_eq!(parsed.meta.confidence.to_bits(), ir.meta.confidence.to_bits());
        prop_assert_eq!(&parsed, &ir);
    }

    #[test]
    fn ir_payloads_are_read_unchanged_or_stripped_and_reported(ir in ir()) {
        let read = payload::read(SilpForm::Ir, &Content::Json(ir.to_value()), &DecodeOptions::default(), 8)
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        let compact = ir.to_compact_json();
        let invisible = compact.chars().filter(|c| sanitize::is_invisible(*c)).count();
        prop_assert_eq!(read.notices.len(), invisible);
        if invisible == 0 {
            prop_assert_eq!(&read.ir, &ir);
        } else {
            let cleaned: String = compact.chars().filter(|c| !sanitize::is_invisible(*c)).collect();
            prop_assert_eq!(read.ir.to_compact_json(), cleaned);
        }
    }

    #[test]
    fn ir_payloads_read_the_same_from_their_text_as_from_a_tree(ir in ir(), change in 0..7u8, pretty in any::<bool>()) {
        let mut value = ir.to_value();
        match change {
            1 => { value["meta"].as_object_mut().unwrap().remove("req_id"); }
            2 => { value["meta"]["out"] = json!("code"); }
            3 => { value.as_object_mut().unwrap().remove("intent"); }
            4 => { value["extra"] = json!(1); }
            5 => { value["meta"]["confidence"] = json!(2); }
            6 => { value["entities"] = json!([{"id": "a"}]); }
            _ => {}
        }
        let text = if pretty { serde_json::to_string_pretty(&value) } else { serde_json::to_string(&value) }.unwrap();
        let raw = Content::Raw(RawJson::new(RawValue::from_string(text).unwrap()).unwrap());
        let tree = Content::Json(value);
        let options = DecodeOptions::default();
        match (payload::read(SilpForm::Ir, &raw, &options, 8), payload::read(SilpForm::Ir, &tree, &options, 8)) {
            (Ok(a), Ok(b)) => {
                prop_assert_eq!(&a.ir, &b.ir);
                prop_assert_eq!(a.notices, b.notices);
                prop_assert_eq!(a.explicit_out, b.explicit_out);
                prop_assert_eq!(a.sanitized, b.sanitized);
            }
            (Err(a), Err(b)) => prop_assert_eq!(a, b),
            (a, b) => prop_assert!(false, "raw {:?} tree {:?}", a.map(|r| r.ir), b.map(|r| r.ir)),
        }
    }

    #[test]
    fn decoders_never_panic_on_arbitrary_text(s in any::<String>()) {
        for frontend in Frontend::ALL {
            let _ = silp::decode(&s, frontend, &DecodeOptions::default());
        }
    }

    #[test]
    fn code_decoder_never_panics_on_code_like_text(s in CODE_LIKE) {
        if let Err(e) = silp::decode(&s, Frontend::Code, &DecodeOptions::default()) {
            let span = e.span.clone().expect("syntax errors carry a span");
            prop_assert!(span.start <= span.end && span.end <= s.len(), "span {:?} outside {:?}", span, s);
            prop_assert!(s.is_char_boundary(span.start) && s.is_char_boundary(span.end), "span {:?} in {:?}", span, s);
            let _ = e.render(&s);
        }
    }

    /// Invisible characters inserted anywhere change nothing but the offsets: the same IR, one
    /// notice per character at its offset, and an error span that covers the same text.
    #[test]
    fn invisible_characters_only_shift_offsets(
        s in "[a-z!(),;=@:\" <>\\\\t+\\-é北😀\u{3000}]{0,40}",
        inserts in prop::collection::vec((any::<prop::sample::Index>(), invisible_char()), 0..6),
    ) {
        let mut chars: Vec<char> = s.chars().collect();
        for (at, c) in &inserts {
            chars.insert(at.index(chars.len() + 1), *c);
        }
        let t: String = chars.iter().collect();
        let plain = silp::decode(&s, Frontend::Code, &DecodeOptions::default());
        let noisy = silp::decode(&t, Frontend::Code, &DecodeOptions::default());
        match (plain, noisy) {
            (Ok(plain), Ok(noisy)) => {
                prop_assert_eq!(comparable(&plain.ir, Strictness::WithExtras), comparable(&noisy.ir, Strictness::WithExtras));
                let expected: Vec<String> = t
                    .char_indices()
                    .filter(|(_, c)| sanitize::is_invisible(*c))
                    .map(|(i, c)| format!("stripped invisible character U+{:04X} at byte {i}", c as u32))
                    .collect();
                let stripped: Vec<String> = noisy.notices.iter()
                    .filter(|n| matches!(n, Notice::InvisibleStripped { .. }))
                    .map(ToString::to_string)
                    .collect();
                prop_assert_eq!(stripped, expected);
            }
            (Err(plain), Err(noisy)) => {
                prop_assert_eq!(plain.code, noisy.code);
                let (a, b) = (plain.span.clone().expect("a span"), noisy.span.clone().expect("a span"));
                prop_assert!(t.is_char_boundary(b.start) && t.is_char_boundary(b.end), "span {:?} in {:?}", b, t);
                let covered: String = t[b.clone()].chars().filter(|c| !sanitize::is_invisible(*c)).collect();
                prop_assert_eq!(&covered, &s[a.clone()], "span {:?} of {:?} vs {:?} of {:?}", b, t, a, s);
                let _ = noisy.render(&t);
            }
            (plain, noisy) => prop_assert!(false, "{:?} vs {:?}", plain.is_ok(), noisy.is_ok()),
        }
    }

    #[test]
    fn json_decoder_spans_never_split_a_character(s in "[{}\\[\\]\":,a-z0-9 é北😀\u{3000}\u{202E}\u{E0041}]{0,30}") {
        if let Err(e) = silp::decode(&s, Frontend::Json, &DecodeOptions::default())
            && let Some(span) = e.span.clone()
        {
            prop_assert!(span.start <= span.end && span.end <= s.len(), "span {:?} outside {:?}", span, s);
            prop_assert!(s.is_char_boundary(span.start) && s.is_char_boundary(span.end), "span {:?} in {:?}", span, s);
            let _ = e.render(&s);
        }
    }

    #[test]
    fn json_decoder_and_schema_never_panic_on_arbitrary_json(v in arbitrary_json()) {
        let text = v.to_string();
        let _ = silp::decode(&text, Frontend::Json, &DecodeOptions::default());
        if let Ok(ir) = schema::parse_ir(&v) {
            for frontend in Frontend::ALL {
                let _ = silp::compile(&ir, frontend);
            }
        }
    }
}

/// Code-like text with non-ASCII letters, look-alikes and invisible characters, so that the
/// sanitiser's offset remapping is exercised.
const CODE_LIKE: &str = "[a-z!(),;=@:\" <>\\\\t+\\-é北аſ😀\u{3000}\u{200B}\u{FEFF}\u{202E}\u{2066}\u{00AD}\u{FE0F}\u{E0041}\u{E0100}]{0,40}";

/// One invisible character of each class the sanitiser strips.
fn invisible_char() -> impl Strategy<Value = char> {
    prop::sample::select(
        INVISIBLE_CLASSES.iter().flat_map(|(_, chars)| chars.iter().copied()).collect::<Vec<_>>(),
    )
}

#[test]
fn a_megabyte_of_input_is_decoded_or_refused_cleanly() {
    let options = DecodeOptions::default();
    let just_under = format!("cancel({})", "a".repeat(options.max_input_bytes - 8));
    let decoded = silp::decode(&just_under, Frontend::Code, &options).expect("1 MiB payload decodes");
    assert_eq!(decoded.ir.entities[0].value.len(), options.max_input_bytes - 8);

    let too_big = format!("cancel({})", "a".repeat(options.max_input_bytes));
    let err = silp::decode(&too_big, Frontend::Code, &options).unwrap_err();
    assert_eq!(err.code, silp::ErrorCode::InvalidSyntax);
    assert!(err.message.contains("limit"), "{}", err.message);
}

#[test]
fn deep_nesting_is_an_error_not_a_crash() {
    let options = DecodeOptions::default();
    let parens = format!("cancel({}x{})", "(".repeat(200_000), ")".repeat(200_000));
    let decoded = silp::decode(&parens, Frontend::Code, &options).expect("balanced parentheses are a value");
    assert_eq!(decoded.ir.entities[0].value.len(), 400_001);

    let unbalanced = format!("cancel({}", "(".repeat(200_000));
    assert!(silp::decode(&unbalanced, Frontend::Code, &options).is_err());

    let arrays = format!(
        "{{\"intent\":\"!CANCEL\",\"constraints\":[{{\"type\":\"a\",\"value\":\"b\",\"x\":{}{}}}]}}",
        "[".repeat(100_000),
        "]".repeat(100_000)
    );
    let err = silp::decode(&arrays, Frontend::Json, &options).unwrap_err();
    assert!(err.message.contains("recursion limit"), "{err}");
    let shallow_but_wrong =
        format!("{{\"intent\":\"!CANCEL\",\"act\":{}{}}}", "[".repeat(100_000), "]".repeat(100_000));
    assert_eq!(
        silp::decode(&shallow_but_wrong, Frontend::Json, &options).unwrap_err().code,
        silp::ErrorCode::DecodeFailed
    );
}

/// One character of every class the sanitiser strips: the draft's four zero-width characters,
/// bidi embeddings, overrides, isolates and marks, the soft hyphen, both variation-selector
/// blocks, tag characters, and the other default-ignorable code points (joiners, invisible
/// operators, fillers, unassigned default-ignorables).
const INVISIBLE_CLASSES: &[(&str, &[char])] = &[
    ("zero-width (draft §8.1)", &['\u{200B}', '\u{200C}', '\u{200D}', '\u{FEFF}']),
    ("bidi embedding and override", &['\u{202A}', '\u{202B}', '\u{202C}', '\u{202D}', '\u{202E}']),
    ("bidi isolate", &['\u{2066}', '\u{2067}', '\u{2068}', '\u{2069}']),
    ("bidi mark", &['\u{200E}', '\u{200F}', '\u{061C}']),
    ("soft hyphen", &['\u{00AD}']),
    ("variation selector", &['\u{FE00}', '\u{FE0F}', '\u{E0100}', '\u{E01EF}']),
    ("tag character", &['\u{E0001}', '\u{E0020}', '\u{E0041}', '\u{E007F}']),
    (
        "other default-ignorable",
        &[
            '\u{034F}',
            '\u{115F}',
            '\u{1160}',
            '\u{17B4}',
            '\u{180B}',
            '\u{180E}',
            '\u{2060}',
            '\u{2061}',
            '\u{2064}',
            '\u{2065}',
            '\u{206A}',
            '\u{206F}',
            '\u{3164}',
            '\u{FFA0}',
            '\u{FFF0}',
            '\u{1BCA0}',
            '\u{1D173}',
            '\u{E0000}',
            '\u{E0FFF}',
        ],
    ),
];

fn stripped_chars(notices: &[Notice]) -> Vec<char> {
    notices
        .iter()
        .filter_map(|n| match n {
            Notice::InvisibleStripped { ch, .. } => Some(*ch),
            Notice::HomoglyphMapped { .. } => None,
        })
        .collect()
}

#[test]
fn every_invisible_class_is_stripped_from_code_payloads_and_reported() {
    for (class, chars) in INVISIBLE_CLASSES {
        for &c in *chars {
            let text = format!("can{c}cel(fli{c}ght) else rebook(x@ho{c}me)");
            let decoded = silp::decode(&text, Frontend::Code, &DecodeOptions::default())
                .unwrap_or_else(|e| panic!("{class} U+{:04X}: {}", c as u32, e.render(&text)));
            assert_eq!(decoded.ir.intent, "!CANCEL", "{class} U+{:04X}", c as u32);
            assert_eq!(decoded.ir.entities[0].value, "flight", "{class} U+{:04X}", c as u32);
            assert_eq!(
                decoded.ir.alternatives[0].location.as_deref(),
                Some("home"),
                "{class} U+{:04X}",
                c as u32
            );
            assert_eq!(stripped_chars(&decoded.notices), [c, c, c], "{class} U+{:04X}", c as u32);
            let offsets: Vec<String> = decoded.notices.iter().map(ToString::to_string).collect();
            assert!(offsets[0].ends_with("at byte 3"), "{class}: {offsets:?}");
            let second = format!("can{c}cel(fli").len();
            assert!(offsets[1].ends_with(&format!("at byte {second}")), "{class}: {offsets:?}");
        }
    }
}

#[test]
fn every_invisible_class_is_stripped_from_json_payloads_and_reported() {
    for (class, chars) in INVISIBLE_CLASSES {
        for &c in *chars {
            let text = format!("{{\"intent\":\"!CAN{c}CEL\",\"act\":\"fli{c}ght\"}}");
            let decoded = silp::decode(&text, Frontend::Json, &DecodeOptions::default())
                .unwrap_or_else(|e| panic!("{class} U+{:04X}: {}", c as u32, e.render(&text)));
            assert_eq!(decoded.ir.intent, "!CANCEL", "{class} U+{:04X}", c as u32);
            assert_eq!(decoded.ir.entities[0].value, "flight", "{class} U+{:04X}", c as u32);
            assert_eq!(stripped_chars(&decoded.notices), [c, c], "{class} U+{:04X}", c as u32);
        }
    }
}

#[test]
fn every_invisible_class_is_stripped_from_ir_payloads_and_reported() {
    for (class, chars) in INVISIBLE_CLASSES {
        for &c in *chars {
            let ir = json!({
                "intent": format!("!CAN{c}CEL"),
                "entities": [{"id": "act", "value": format!("fli{c}ght"), "note": [format!("a{c}")]}],
                "constraints": [{"type": "rain", "value": format!("tr{c}ue"), "time": "t+1"}],
                "alternatives": [{"action": "!REBOOK", "target": format!("{c}x")}],
                "meta": {"req_id": "abcd1234", "session_id": format!("s{c}1"), "seq": [format!("{c}sequential")]},
            });
            let read = payload::read(SilpForm::Ir, &Content::Json(ir), &DecodeOptions::default(), 8)
                .unwrap_or_else(|e| panic!("{class} U+{:04X}: {e}", c as u32));
            let ir = read.ir;
            let at = format!("{class} U+{:04X}", c as u32);
            assert_eq!(ir.intent, "!CANCEL", "{at}");
            assert_eq!(ir.entities[0].value, "flight", "{at}");
            assert_eq!(ir.entities[0].extra["note"], json!(["a"]), "{at}");
            assert_eq!(ir.constraints[0].value, "true", "{at}");
            assert_eq!(ir.alternatives[0].target.as_deref(), Some("x"), "{at}");
            assert_eq!(ir.meta.session_id.as_deref(), Some("s1"), "{at}");
            assert_eq!(ir.meta.seq, ["sequential"], "{at}");
            assert_eq!(stripped_chars(&read.notices), [c; 7], "{at}");
            let first = read.notices[0].to_string();
            assert!(first.contains("intent"), "{at}: the notice names the field: {first}");
        }
    }
}

#[test]
fn invisible_characters_never_reach_surface_output_raw() {
    for (class, chars) in INVISIBLE_CLASSES {
        for &c in *chars {
            // An IR can hold them: a quoted `\uXXXX` escape in a code payload is kept on purpose.
            let ir = Ir {
                silp: "v1".into(),
                version: "ir-v0.1".into(),
                intent: "!CANCEL".into(),
                entities: vec![Entity {
                    id: "act".into(),
                    value: format!("fli{c}ght").into(),
                    action: None,
                    extra: Map::new(),
                }],
                constraints: vec![Constraint {
                    kind: "rain".into(),
                    value: format!("{c}x").into(),
                    time: Some("t+1".into()),
                    extra: Map::new(),
                }],
                alternatives: vec![],
                meta: Meta::with_req_id("abcd1234".into()),
            };
            for frontend in [Frontend::Code, Frontend::Json] {
                let text = silp::compile(&ir, frontend);
                assert!(!text.contains(c), "{class} U+{:04X} raw in {frontend} output {text:?}", c as u32);
                round_trip(&ir, frontend, Strictness::WithExtras)
                    .unwrap_or_else(|e| panic!("{class} U+{:04X}: {e}", c as u32));
            }
        }
    }
}
