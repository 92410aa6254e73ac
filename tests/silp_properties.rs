//! Property tests for the SILP codec: `decode(compile(ir))` is equivalent to `ir` for every
//! valid IR through both lossless frontends, and no input makes a decoder panic.

use proptest::prelude::*;
use serde_json::{Map, Value, json};
use silpgate::silp::equivalence::{Strictness, comparable};
use silpgate::silp::ir::{Alternative, Constraint, Entity, Ir, Meta};
use silpgate::silp::{self, DecodeOptions, Frontend, schema};

/// Strings that stress the code frontend: reserved characters, keywords, spaces, quotes,
/// invisible and control characters, and arbitrary Unicode.
fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => "[a-z0-9_]{1,8}",
        3 => "[ ,()=@;:\"\\\\!<>~a-z+t.\\-]{0,10}",
        1 => Just(String::new()),
        1 => prop::sample::select(vec![
            "else", " else: ", "else:", "if", "and", " and ", "then", "with", "t+1", "t-2", "loc=x",
            "act", "value=3", "time=t+1", "op=<", "subject=me", "a=b", "k=", "->", "; ", "\"", "\\",
            "\u{200B}", "\u{FEFF}x", "a\u{200D}b", "\n", "\t", "\u{2028}", "北京", "café ü", "саncel",
            "ſtart", "90%", "-5", "4.0", "x:", "a:b", ")", "(", "f(x)", "a)b", "!", "!x",
        ]).prop_map(str::to_owned),
        2 => any::<String>(),
    ]
}

fn action_code() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            "!CANCEL",
            "!EMAIL",
            "!START",
            "!NOTIFY",
            "!SWITCH_TOOL",
            "!A_",
            "!A__B",
            "!IF",
            "!ELSE",
            "!LOC"
        ])
        .prop_map(str::to_owned),
        "![A-Z][A-Z_]{0,6}",
    ]
}

fn extras() -> impl Strategy<Value = Map<String, Value>> {
    prop::collection::vec(
        (
            prop::sample::select(vec![
                "lang", "note", "weight", "x-ext", "nested", "flag", "id", "type", "action", "target", "time",
            ]),
            prop_oneof![
                text().prop_map(Value::String),
                any::<i32>().prop_map(|i| json!(i)),
                (-1e6f64..1e6).prop_map(|f| json!(f)),
                any::<bool>().prop_map(Value::Bool),
                Just(json!({"k": [1, "two", null]})),
            ],
        ),
        0..2,
    )
    .prop_map(|pairs| pairs.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())
}

/// Extras never repeat an object's declared fields.
fn without(mut extra: Map<String, Value>, declared: &[&str]) -> Map<String, Value> {
    extra.retain(|k, _| !declared.contains(&k.as_str()));
    extra
}

fn ir() -> impl Strategy<Value = Ir> {
    action_code().prop_flat_map(|intent| {
        let entity = (
            prop_oneof![3 => Just("act".to_owned()), 2 => text()],
            text(),
            prop_oneof![Just(None), Just(Some(intent.clone())), action_code().prop_map(Some)],
            extras(),
        )
            .prop_map(|(id, value, action, extra)| Entity {
                id: id.into(),
                value: value.into(),
                action: action.map(Into::into),
                extra: without(extra, &["id", "value", "action"]),
            });
        let constraint = (
            prop_oneof![3 => "!?[a-z_]{1,6}", 1 => text()],
            text(),
            prop::option::of(text()),
            prop::option::of(text()),
            prop::option::of(prop_oneof![
                prop::sample::select(vec!["==", "!=", "<", ">", "<=", ">=", "~=", "===", ""])
                    .prop_map(str::to_owned),
                text(),
            ]),
            extras(),
        )
            .prop_map(|(kind, value, time, subject, operator, extra)| {
                let mut extra = without(extra, &["type", "value", "time", "subject", "operator"]);
                if let Some(s) = subject {
                    extra.insert("subject".into(), Value::String(s));
                }
                if let Some(o) = operator {
                    extra.insert("operator".into(), Value::String(o));
                }
                Constraint { kind: kind.into(), value: value.into(), time: time.map(Into::into), extra }
            });
        let alternative = (action_code(), prop::option::of(text()), prop::option::of(text()), extras())
            .prop_map(|(action, target, location, extra)| Alternative {
                action: action.into(),
                target: target.map(Into::into),
                location: location.map(Into::into),
                extra: without(extra, &["action", "target", "location"]),
            });
        (
            prop::collection::vec(entity, 0..5),
            prop::collection::vec(constraint, 0..4),
            prop::collection::vec(alternative, 0..3),
        )
            .prop_map(move |(entities, constraints, alternatives)| Ir {
                silp: "v1".into(),
                version: "ir-v0.1".into(),
                intent: intent.as_str().into(),
                entities,
                constraints,
                alternatives,
                meta: Meta::with_req_id("abcd1234".into()),
            })
    })
}

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
    }

    #[test]
    fn decoders_never_panic_on_arbitrary_text(s in any::<String>()) {
        for frontend in Frontend::ALL {
            let _ = silp::decode(&s, frontend, &DecodeOptions::default());
        }
    }

    #[test]
    fn code_decoder_never_panics_on_code_like_text(s in "[a-z!(),;=@:\" <>\\\\t+\\-]{0,40}") {
        if let Err(e) = silp::decode(&s, Frontend::Code, &DecodeOptions::default()) {
            let span = e.span.clone().expect("syntax errors carry a span");
            prop_assert!(span.start <= span.end && span.end <= s.len(), "span {:?} outside {:?}", span, s);
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

fn arbitrary_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|i| json!(i)),
        text().prop_map(Value::String),
        prop::sample::select(vec!["!CANCEL", "intent", "meta", "abcd", "v1", "action_email"])
            .prop_map(|s| json!(s)),
    ];
    leaf.prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::vec(
                (
                    prop::sample::select(vec![
                        "intent",
                        "meta",
                        "req_id",
                        "entities",
                        "constraints",
                        "alternatives",
                        "id",
                        "value",
                        "type",
                        "action",
                        "act",
                        "action_x",
                        "silp"
                    ]),
                    inner
                ),
                0..5
            )
            .prop_map(|kv| Value::Object(kv.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())),
        ]
    })
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
