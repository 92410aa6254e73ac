//! Generators of SILP IRs and JSON for property tests: IRs whose every field varies (strings
//! that stress the frontends, extras, every meta field) and arbitrary JSON with IR-like keys.
//! Shared by the codec properties and the schema differential test.

use proptest::prelude::*;
use serde_json::{Map, Value, json};
use silpgate::silp::Frontend;
use silpgate::silp::ir::{Alternative, Constraint, Entity, Ir, Meta};

/// Strings that stress the code frontend: reserved characters, keywords, spaces, quotes,
/// invisible and control characters, and arbitrary Unicode.
pub fn text() -> impl Strategy<Value = String> {
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

pub fn action_code() -> impl Strategy<Value = String> {
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

pub fn extras() -> impl Strategy<Value = Map<String, Value>> {
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

/// Every meta field varies: priority, confidence floats from 0 to 1 (with the spellings that
/// need an exponent), seq lists, out frontends, next agent, req_id, session id and extras.
pub fn meta() -> impl Strategy<Value = Meta> {
    let confidence = prop_oneof![
        2 => 0.0f64..=1.0,
        1 => prop::sample::select(vec![0.0, 1.0, 0.5, 0.1, 0.3, 1e-4, 1e-5, 1e-7, 1.5e-10, 5e-324, 0.9999999999999999]),
    ];
    let seq = prop::collection::vec(
        prop_oneof![
            3 => prop::sample::select(vec!["sequential", "parallel", "reason_first", "reason_last"]).prop_map(str::to_owned),
            1 => text(),
        ],
        0..4,
    );
    let out = prop_oneof![
        3 => prop::sample::select(Frontend::ALL.iter().map(|f| f.name()).collect::<Vec<_>>()).prop_map(str::to_owned),
        1 => text(),
    ];
    (
        prop_oneof![3 => Just(0i64), 1 => any::<i64>()],
        confidence,
        seq,
        out,
        prop::option::of(text()),
        "[a-f0-9]{4,8}",
        prop::option::of(text()),
        extras(),
    )
        .prop_map(|(priority, confidence, seq, out, next_agent, req_id, session_id, extra)| Meta {
            priority,
            confidence,
            seq: seq.into_iter().map(Into::into).collect(),
            out: out.into(),
            next_agent: next_agent.map(Into::into),
            req_id: req_id.into(),
            session_id: session_id.map(Into::into),
            extra: without(
                extra,
                &["priority", "confidence", "seq", "out", "next_agent", "req_id", "session_id"],
            ),
        })
}

pub fn ir() -> impl Strategy<Value = Ir> {
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
            meta(),
        )
            .prop_map(move |(entities, constraints, alternatives, meta)| Ir {
                silp: "v1".into(),
                version: "ir-v0.1".into(),
                intent: intent.as_str().into(),
                entities,
                constraints,
                alternatives,
                meta,
            })
    })
}

pub fn arbitrary_json() -> impl Strategy<Value = Value> {
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
