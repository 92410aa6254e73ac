//! The typed IR readers (`silp::typed` over text, `silp::tree` over a parsed value) against the schema
//! validator (jsonschema over the shipped schema), which stays the reference for what the
//! draft's schema allows. Both judge the same text: the public vectors, the property
//! generator's IRs, and those IRs mutated one place at a time with values chosen at the
//! schema's edges. Any disagreement on validity fails, and where both accept, the typed IR
//! must be the one the tree path builds.

use proptest::prelude::*;
use serde_json::{Map, Value, json};
use silpgate::silp::ir::Ir;
use silpgate::silp::tree;
use silpgate::silp::typed::{self, Refused};
use silpgate::silp::{ErrorCode, schema};

#[path = "support/ir_strategy.rs"]
mod ir_strategy;
use ir_strategy::{arbitrary_json, ir, text};

/// Both validators on `text`; an `Err` names the disagreement.
fn agree(text: &str) -> Result<(), String> {
    let tree: Result<Value, _> = serde_json::from_str(text);
    let typed = typed::read(text);
    let Ok(value) = tree else {
        return match typed {
            Err(Refused) => Ok(()),
            other => Err(format!("not JSON, yet the typed reader says {other:?}: {text}")),
        };
    };
    let violations = schema::violations(&value);
    // The same reader over the parsed tree (the gateway's path) has no repeated keys to meet.
    match (tree::from_value(&value), violations.is_empty()) {
        (Ok(ir), true) if ir == Ir::from_schema_valid(&value) => {}
        (Err(Refused), false) => {}
        (other, _) => {
            return Err(format!(
                "over the tree, the typed reader says {:?}, schema says {:?}: {text}",
                other.map(|_| "valid"),
                violations.iter().map(ToString::to_string).collect::<Vec<_>>()
            ));
        }
    }
    match (typed, violations.is_empty()) {
        (Ok(ir), true) => {
            let built = Ir::from_schema_valid(&value);
            if ir == built {
                Ok(())
            } else {
                Err(format!(
                    "both accept, but the IRs differ:\n typed {ir:?}\n tree  {built:?}\n text {text}"
                ))
            }
        }
        (Err(Refused), false) => Ok(()),
        // A declared field repeated with an earlier wrong value: the tree sees the last only.
        (Err(Refused), true) if has_repeated_key(text) => Ok(()),
        (typed, _) => Err(format!(
            "typed reader says {:?}, schema says {:?}: {text}",
            typed.map(|_| "valid"),
            violations.iter().map(ToString::to_string).collect::<Vec<_>>()
        )),
    }
}

/// True when some object in `text` names a key twice.
fn has_repeated_key(text: &str) -> bool {
    struct Probe(bool);
    impl<'de> serde::de::Visitor<'de> for &mut Probe {
        type Value = ();
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("any JSON")
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
            let mut keys = std::collections::HashSet::new();
            while let Some(k) = map.next_key::<String>()? {
                self.0 |= !keys.insert(k);
                map.next_value_seed(&mut *self)?;
            }
            Ok(())
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
            while seq.next_element_seed(&mut *self)?.is_some() {}
            Ok(())
        }
        fn visit_str<E>(self, _: &str) -> Result<(), E> {
            Ok(())
        }
        fn visit_bool<E>(self, _: bool) -> Result<(), E> {
            Ok(())
        }
        fn visit_i64<E>(self, _: i64) -> Result<(), E> {
            Ok(())
        }
        fn visit_u64<E>(self, _: u64) -> Result<(), E> {
            Ok(())
        }
        fn visit_f64<E>(self, _: f64) -> Result<(), E> {
            Ok(())
        }
        fn visit_unit<E>(self) -> Result<(), E> {
            Ok(())
        }
    }
    impl<'de> serde::de::DeserializeSeed<'de> for &mut Probe {
        type Value = ();
        fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
            d.deserialize_any(self)
        }
    }
    let mut probe = Probe(false);
    let mut de = serde_json::Deserializer::from_str(text);
    serde::de::DeserializeSeed::deserialize(&mut probe, &mut de).is_ok() && probe.0
}

#[test]
fn every_public_vector_gets_one_verdict() {
    let vectors: Vec<Value> =
        serde_json::from_str(include_str!("vectors/silp-reference.json")).expect("vectors are JSON");
    let mut judged = 0;
    let mut valid = 0;
    for v in &vectors {
        let Some(ir) = v.get("ir").filter(|ir| !ir.is_null()) else { continue };
        let text = ir.to_string();
        agree(&text).unwrap_or_else(|e| panic!("{}: {e}", v["name"]));
        // The same IR as people write it: pretty-printed, keys as given.
        agree(&serde_json::to_string_pretty(ir).expect("value prints")).unwrap_or_else(|e| panic!("{e}"));
        judged += 1;
        valid += usize::from(typed::read(&text).is_ok());
    }
    assert!(judged > 100, "only {judged} vectors carry an IR");
    assert!(valid > 50 && valid < judged, "{valid} of {judged} accepted: the vectors hold both kinds");
}

#[test]
fn values_at_the_schema_edges_get_one_verdict() {
    let base = json!({"intent": "!CANCEL", "entities": [{"id": "a", "value": "b"}],
        "constraints": [{"type": "t", "value": "v"}], "alternatives": [{"action": "!EMAIL"}],
        "meta": {"req_id": "abcd"}});
    for (pointer, value) in [
        ("/silp", json!("v1")),
        ("/silp", json!("v12")),
        ("/silp", json!("v")),
        ("/silp", json!("v\u{0663}")),
        ("/silp", json!("v1\n")),
        ("/silp", json!("V1")),
        ("/intent", json!("!A")),
        ("/intent", json!("!A_")),
        ("/intent", json!("!_A")),
        ("/intent", json!("!")),
        ("/intent", json!("!A\n")),
        ("/intent", json!("!Ä")),
        ("/entities/0/action", Value::Null),
        ("/entities/0/action", json!("!X")),
        ("/entities/0/action", json!("x")),
        ("/alternatives/0/target", Value::Null),
        ("/alternatives/0/target", json!(1)),
        ("/constraints/0/time", Value::Null),
        ("/constraints/0/time", json!(false)),
        ("/meta/req_id", json!("abc")),
        ("/meta/req_id", json!("abcdef12")),
        ("/meta/req_id", json!("abcdef123")),
        ("/meta/req_id", json!("ABCD")),
        ("/meta/req_id", json!("abcd\n")),
        ("/meta/req_id", json!("abc\u{0663}")),
        ("/meta/priority", json!(2.0)),
        ("/meta/priority", json!(2.5)),
        ("/meta/priority", json!(-7)),
        ("/meta/priority", json!(u64::MAX)),
        ("/meta/priority", json!(1e300)),
        ("/meta/priority", json!("1")),
        ("/meta/confidence", json!(0)),
        ("/meta/confidence", json!(1)),
        ("/meta/confidence", json!(2)),
        ("/meta/confidence", json!(-0.0)),
        ("/meta/confidence", json!(-1e-300)),
        ("/meta/confidence", json!(1.0000000000000002)),
        ("/meta/confidence", json!(u64::MAX)),
        ("/meta/confidence", json!(i64::MIN)),
        ("/meta/confidence", Value::Null),
        ("/meta/seq", json!(["a", 1])),
        ("/meta/seq", json!([])),
        ("/meta/out", Value::Null),
        ("/meta/next_agent", Value::Null),
        ("/meta/session_id", json!(["s"])),
        ("/meta", json!([])),
        ("/entities", json!({})),
        ("/entities/0", json!("a")),
        ("/constraints", Value::Null),
    ] {
        let mut ir = base.clone();
        set(&mut ir, pointer, value);
        let text = ir.to_string();
        agree(&text).unwrap_or_else(|e| panic!("{pointer}: {e}"));
    }
}

#[test]
fn repeated_keys_are_judged_as_the_tree_judges_them() {
    for text in [
        r#"{"intent":5,"intent":"!CANCEL","meta":{"req_id":"abcd"}}"#,
        r#"{"intent":"!CANCEL","intent":5,"meta":{"req_id":"abcd"}}"#,
        r#"{"intent":"!CANCEL","meta":{"req_id":"x"},"meta":{"req_id":"abcd"}}"#,
        r#"{"intent":"!CANCEL","meta":{"req_id":"abcd","note":1,"note":[2]}}"#,
        r#"{"intent":"!CANCEL","entities":[{"id":"a","value":"b","x":1,"x":null}],"meta":{"req_id":"abcd"}}"#,
    ] {
        agree(text).unwrap_or_else(|e| panic!("{e}"));
        // Whatever the typed reader makes of it, the public entry point takes the tree's word.
        let tree =
            serde_json::from_str(text).map_err(|_| ()).and_then(|v| schema::parse_ir(&v).map_err(|_| ()));
        assert_eq!(schema::parse_ir_text(text).ok(), tree.ok(), "{text}");
    }
}

#[test]
fn refused_texts_keep_the_tree_paths_error() {
    let syntax =
        schema::parse_ir_text("{\"intent\": \"!CANCEL\",\n \"meta\": {\"req_id\": tru}}").unwrap_err();
    assert_eq!(syntax.code, ErrorCode::InvalidSyntax);
    assert!(syntax.span.is_some(), "{syntax:?}");
    let schema_error = schema::parse_ir_text(r#"{"intent":"!CANCEL","meta":{"req_id":"ABCD"}}"#).unwrap_err();
    assert_eq!(schema_error.code, ErrorCode::DecodeFailed);
    assert!(schema_error.message.contains("meta.req_id"), "{}", schema_error.message);
    let version =
        schema::parse_ir_text(r#"{"silp":"v2","intent":"!CANCEL","meta":{"req_id":"abcd"}}"#).unwrap_err();
    assert_eq!(version.code, ErrorCode::UnsupportedVersion);
}

/// Sets (or, with a pointer whose parent is missing, skips) the value at `pointer`.
fn set(root: &mut Value, pointer: &str, value: Value) {
    let (parent, last) = pointer.rsplit_once('/').expect("pointer has a parent");
    match root.pointer_mut(parent) {
        Some(Value::Object(map)) => {
            map.insert(last.to_owned(), value);
        }
        Some(Value::Array(items)) => {
            if let Some(slot) = last.parse::<usize>().ok().and_then(|i| items.get_mut(i)) {
                *slot = value;
            }
        }
        _ => {}
    }
}

/// Every place in `value`, as JSON pointers, the root first.
fn places(value: &Value, at: String, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                places(v, format!("{at}/{k}"), out);
            }
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                places(v, format!("{at}/{i}"), out);
            }
        }
        _ => {}
    }
    out.push(at);
}

/// One edit of an IR at one place.
#[derive(Debug, Clone)]
enum Mutation {
    Replace(Value),
    Remove,
    AddKey(String, Value),
}

/// Values at the edges of the schema's types and patterns, and any string or number.
fn edge_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        3 => prop::sample::select(vec![
            Value::Null, json!(true), json!(0), json!(1), json!(-1), json!(2), json!(2.0), json!(0.5),
            json!(1.5), json!(-0.0), json!(u64::MAX), json!(i64::MIN), json!(1e300), json!([]), json!({}),
            json!(["a"]), json!([1]), json!(""), json!("v1"), json!("v2"), json!("v"), json!("v1 "),
            json!("!A"), json!("!A_B"), json!("!a"), json!("A"), json!("!"), json!("!A1"), json!("abcd"),
            json!("abc"), json!("abcdef01"), json!("abcdef012"), json!("ABCD"), json!("abcg"),
            json!("abcd\n"), json!("\u{0661}\u{0662}\u{0663}\u{0664}"), json!({"req_id": "abcd"}),
            json!([{"id": "a", "value": "b"}]), json!([{"action": "!A"}]), json!([{"type": "t", "value": "v"}]),
        ]),
        1 => text().prop_map(Value::String),
        1 => any::<i64>().prop_map(|i| json!(i)),
        1 => (-2.0f64..2.0).prop_map(|f| json!(f)),
    ]
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        3 => edge_value().prop_map(Mutation::Replace),
        2 => Just(Mutation::Remove),
        1 => (
            prop::sample::select(vec![
                "silp", "version", "intent", "meta", "req_id", "id", "value", "action", "type", "time",
                "priority", "confidence", "seq", "out", "x-ext", "entities",
            ]),
            edge_value(),
        )
            .prop_map(|(k, v)| Mutation::AddKey(k.to_owned(), v)),
    ]
}

/// Applies `mutation` at the `choice`-th place of `value`.
fn mutate(value: &mut Value, choice: prop::sample::Index, mutation: Mutation) {
    let mut all = Vec::new();
    places(value, String::new(), &mut all);
    let at = choice.get(&all).clone();
    match mutation {
        Mutation::Replace(v) if at.is_empty() => *value = v,
        Mutation::Replace(v) => set(value, &at, v),
        Mutation::Remove => {
            if let Some((parent, last)) = at.rsplit_once('/') {
                match value.pointer_mut(parent) {
                    Some(Value::Object(map)) => {
                        map.shift_remove(last);
                    }
                    Some(Value::Array(items)) => {
                        if let Ok(i) = last.parse::<usize>()
                            && i < items.len()
                        {
                            items.remove(i);
                        }
                    }
                    _ => {}
                }
            }
        }
        Mutation::AddKey(k, v) => {
            if let Some(Value::Object(map)) = value.pointer_mut(&at) {
                map.insert(k, v);
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn generated_irs_get_one_verdict(ir in ir()) {
        let text = ir.to_compact_json();
        prop_assert!(typed::read(&text).is_ok(), "a generated IR is refused: {}", text);
        agree(&text).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn mutated_irs_get_one_verdict(
        ir in ir(),
        edits in prop::collection::vec((any::<prop::sample::Index>(), mutation()), 1..3),
    ) {
        let mut value = ir.to_value();
        for (choice, m) in edits {
            mutate(&mut value, choice, m);
        }
        agree(&value.to_string()).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn arbitrary_json_gets_one_verdict(v in arbitrary_json()) {
        agree(&v.to_string()).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn arbitrary_objects_with_ir_fields_get_one_verdict(
        fields in prop::collection::vec(
            (prop::sample::select(vec!["silp", "version", "intent", "entities", "constraints",
                "alternatives", "meta", "other"]), edge_value()),
            0..8,
        ),
    ) {
        let map: Map<String, Value> = fields.into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
        agree(&Value::Object(map).to_string()).map_err(TestCaseError::fail)?;
    }
}
