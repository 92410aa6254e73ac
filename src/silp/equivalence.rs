//! Semantic equivalence of two IRs, as the draft defines it for lossless round trips (§4.6):
//! same intent; same primary entities (id, value) in order; same secondary entities
//! (value, action), grouped by action in order of first appearance as every frontend groups
//! them; same constraints (type, value, time, subject, operator) and alternatives (action,
//! target, location) in order. `meta`, `silp` and `version` are not part of it.

use super::ir::{Entity, Ir};
use serde_json::{Value, json};

/// What must survive a round trip through a frontend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strictness {
    /// The draft's semantic equivalence.
    Semantic,
    /// Semantic equivalence plus every unknown extra field (what the json frontend keeps).
    WithExtras,
}

/// A JSON value that is equal for two IRs exactly when they are equivalent under `strictness`;
/// compare these to get a readable diff.
pub fn comparable(ir: &Ir, strictness: Strictness) -> Value {
    let extras = strictness == Strictness::WithExtras;
    let primary: Vec<Value> = ir
        .entities
        .iter()
        .filter(|e| e.is_primary(&ir.intent))
        .map(|e| with_extras(json!([e.id, e.value]), e, extras))
        .collect();
    let secondary: Vec<Value> = grouped_secondaries(ir)
        .into_iter()
        .map(|e| with_extras(json!([e.value, e.action]), e, extras))
        .collect();
    let constraints: Vec<Value> = ir
        .constraints
        .iter()
        .map(|c| {
            let mut v =
                json!([c.kind, c.value, c.time, field(&c.extra, "subject"), field(&c.extra, "operator")]);
            if extras {
                v.as_array_mut().expect("array").push(non_null(&c.extra));
            }
            v
        })
        .collect();
    let alternatives: Vec<Value> = ir
        .alternatives
        .iter()
        .map(|a| {
            let mut v = json!([a.action, a.target, a.location]);
            if extras {
                v.as_array_mut().expect("array").push(non_null(&a.extra));
            }
            v
        })
        .collect();
    json!({
        "intent": ir.intent,
        "primary": primary,
        "secondary": secondary,
        "constraints": constraints,
        "alternatives": alternatives,
    })
}

/// True when `a` and `b` are equivalent under `strictness`.
pub fn equivalent(a: &Ir, b: &Ir, strictness: Strictness) -> bool {
    comparable(a, strictness) == comparable(b, strictness)
}

fn grouped_secondaries(ir: &Ir) -> Vec<&Entity> {
    let secondaries: Vec<&Entity> = ir.entities.iter().filter(|e| !e.is_primary(&ir.intent)).collect();
    let mut actions: Vec<&str> = Vec::new();
    for e in &secondaries {
        let a = e.action.as_deref().unwrap_or_default();
        if !actions.contains(&a) {
            actions.push(a);
        }
    }
    actions
        .into_iter()
        .flat_map(|a| secondaries.iter().copied().filter(move |e| e.action.as_deref() == Some(a)))
        .collect()
}

fn field(extra: &serde_json::Map<String, Value>, key: &str) -> Value {
    extra.get(key).cloned().unwrap_or(Value::Null)
}

/// Extras without null values (the canonical form drops them too).
fn non_null(extra: &serde_json::Map<String, Value>) -> Value {
    Value::Object(extra.iter().filter(|(_, v)| !v.is_null()).map(|(k, v)| (k.clone(), v.clone())).collect())
}

fn with_extras(mut v: Value, e: &Entity, extras: bool) -> Value {
    if extras {
        v.as_array_mut().expect("array").push(non_null(&e.extra));
    }
    v
}
