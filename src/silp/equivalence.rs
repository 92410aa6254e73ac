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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::silp::ir::{Alternative, Constraint, Meta};
    use serde_json::Map;

    fn entity(id: &str, value: &str, action: Option<&str>) -> Entity {
        Entity { id: id.into(), value: value.into(), action: action.map(Into::into), extra: Map::new() }
    }

    fn constraint(kind: &str, value: &str, time: Option<&str>, extra: Value) -> Constraint {
        let extra = match extra {
            Value::Object(map) => map,
            _ => Map::new(),
        };
        Constraint { kind: kind.into(), value: value.into(), time: time.map(Into::into), extra }
    }

    /// An IR that uses every compared field: primary and secondary entities of two actions,
    /// constraints with time, subject and operator, an alternative with target and location.
    fn sample() -> Ir {
        Ir {
            silp: "v1".into(),
            version: "ir-v0.1".into(),
            intent: "!CANCEL".into(),
            entities: vec![
                entity("act", "flight", None),
                entity("when", "today", Some("!CANCEL")),
                entity("act", "bob", Some("!EMAIL")),
                entity("act", "hotel", Some("!BOOK")),
                entity("act", "alice", Some("!EMAIL")),
            ],
            constraints: vec![
                constraint("rain", "true", Some("t+1"), json!({})),
                constraint("temp", "5", None, json!({"subject": "me", "operator": "<"})),
            ],
            alternatives: vec![Alternative {
                action: "!REBOOK".into(),
                target: Some("train".into()),
                location: Some("home".into()),
                extra: Map::new(),
            }],
            meta: Meta::with_req_id("abcd1234".into()),
        }
    }

    #[test]
    fn an_ir_is_equivalent_to_itself_and_to_what_frontends_may_change() {
        let ir = sample();
        assert!(equivalent(&ir, &ir.clone(), Strictness::Semantic));
        assert!(equivalent(&ir, &ir.clone(), Strictness::WithExtras));

        // meta, silp and version are not carried by a frontend.
        let mut other = ir.clone();
        other.meta.req_id = "ffff".into();
        other.meta.confidence = 0.25;
        other.meta.seq = vec!["sequential".into()];
        other.meta.out = "code".into();
        other.version = "ir-v9".into();
        assert!(equivalent(&ir, &other, Strictness::WithExtras));

        // Secondary entities are grouped by action in order of first appearance, as every
        // frontend writes them: moving alice next to bob changes nothing.
        let mut grouped = ir.clone();
        let alice = grouped.entities.remove(4);
        grouped.entities.insert(3, alice);
        assert!(equivalent(&ir, &grouped, Strictness::WithExtras));

        // A primary entity's action may be absent or the intent.
        let mut explicit = ir.clone();
        explicit.entities[0].action = Some("!CANCEL".into());
        assert!(equivalent(&ir, &explicit, Strictness::WithExtras));

        // Extras other than subject and operator count only with extras; a null extra is absent.
        let mut extra = ir.clone();
        extra.entities[0].extra.insert("lang".into(), json!("en"));
        assert!(equivalent(&ir, &extra, Strictness::Semantic));
        assert!(!equivalent(&ir, &extra, Strictness::WithExtras));
        let mut null_extra = ir.clone();
        null_extra.alternatives[0].extra.insert("note".into(), Value::Null);
        assert!(equivalent(&ir, &null_extra, Strictness::WithExtras));
    }

    #[test]
    fn every_compared_field_tells_irs_apart() {
        let ir = sample();
        type Change = fn(&mut Ir);
        let changes: &[(&str, Change)] = &[
            ("intent", |ir| ir.intent = "!START".into()),
            ("primary value", |ir| ir.entities[0].value = "Flight".into()),
            ("primary id", |ir| ir.entities[1].id = "at".into()),
            ("primary order", |ir| ir.entities.swap(0, 1)),
            ("primary made secondary", |ir| ir.entities[0].action = Some("!EMAIL".into())),
            ("secondary value", |ir| ir.entities[2].value = "bob ".into()),
            ("secondary action", |ir| ir.entities[3].action = Some("!EMAIL".into())),
            ("secondary order within an action", |ir| ir.entities.swap(2, 4)),
            ("secondary group order", |ir| {
                let hotel = ir.entities.remove(3);
                ir.entities.insert(2, hotel);
            }),
            ("entity removed", |ir| {
                ir.entities.pop();
            }),
            ("entity added", |ir| ir.entities.push(entity("act", "flight", None))),
            ("constraint type", |ir| ir.constraints[0].kind = "!rain".into()),
            ("constraint value", |ir| ir.constraints[0].value = "false".into()),
            ("constraint time", |ir| ir.constraints[0].time = None),
            ("constraint subject", |ir| {
                ir.constraints[1].extra.insert("subject".into(), json!("you"));
            }),
            ("constraint operator", |ir| {
                ir.constraints[1].extra.remove("operator");
            }),
            ("constraint order", |ir| ir.constraints.swap(0, 1)),
            ("constraint removed", |ir| {
                ir.constraints.pop();
            }),
            ("alternative action", |ir| ir.alternatives[0].action = "!WAIT".into()),
            ("alternative target", |ir| ir.alternatives[0].target = None),
            ("alternative location", |ir| ir.alternatives[0].location = Some("Home".into())),
            ("alternative added", |ir| ir.alternatives.push(ir.alternatives[0].clone())),
        ];
        for (what, change) in changes {
            let mut other = ir.clone();
            change(&mut other);
            for strictness in [Strictness::Semantic, Strictness::WithExtras] {
                assert!(
                    !equivalent(&ir, &other, strictness),
                    "{what} changed, yet {strictness:?}-equivalent"
                );
                assert!(
                    !equivalent(&other, &ir, strictness),
                    "{what} changed, yet {strictness:?}-equivalent"
                );
            }
        }
    }
}
