//! The json frontend: the IR as one flat JSON object of semantic slots (draft §4.2).
//!
//! `{"intent":..,<id>:<value>..,"action_<verb>":[values..],"constraints":[..],"alternatives":[..]}`
//! written as Python's `json.dumps(ensure_ascii=False, separators=(",", ":"))` writes it, so the
//! bytes equal the reference's. When the flat slots cannot hold the entities faithfully
//! (duplicate ids, ids that collide with a slot or start with `action_`, entity extras) the
//! entities are written as an explicit `"entities":[..]` list instead; see docs/silp.md.

use crate::silp::error::{ErrorCode, SilpError};
use crate::silp::ir::{Alternative, Constraint, Entity, Extras, Ir, is_action_code};
use crate::silp::json_text::{self, Style};
use crate::silp::sanitize::{self, Notice};
use serde_json::{Map, Value};

/// Slot names that an entity id must not take in the flat form.
const RESERVED_SLOTS: [&str; 4] = ["intent", "constraints", "alternatives", "entities"];
const ACTION_PREFIX: &str = "action_";

/// Compiles an IR to the json frontend.
pub fn compile(ir: &Ir) -> String {
    let mut out = String::with_capacity(256);
    out.push_str("{\"intent\":");
    write_text(&mut out, &ir.intent);
    if needs_explicit_entities(ir) {
        out.push_str(",\"entities\":[");
        for (i, e) in ir.entities.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            e.write_json(&mut out, Style::FRONTEND);
        }
        out.push(']');
    } else {
        write_flat_entities(&mut out, ir);
    }
    if !ir.constraints.is_empty() {
        out.push_str(",\"constraints\":[");
        for (i, c) in ir.constraints.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            c.write_json(&mut out, Style::FRONTEND);
        }
        out.push(']');
    }
    if !ir.alternatives.is_empty() {
        out.push_str(",\"alternatives\":[");
        for (i, a) in ir.alternatives.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            a.write_json(&mut out, Style::FRONTEND);
        }
        out.push(']');
    }
    out.push('}');
    out
}

/// Strings in this frontend escape the invisible characters, so that the sanitiser (which
/// strips them when raw) leaves the value intact.
fn write_text(out: &mut String, s: &str) {
    json_text::write_text(out, s, Style::FRONTEND);
}

fn needs_explicit_entities(ir: &Ir) -> bool {
    let mut primary_ids: Vec<&str> = Vec::new();
    for e in &ir.entities {
        if e.extra.values().any(|v| !v.is_null()) {
            return true;
        }
        if e.is_primary(&ir.intent) {
            if RESERVED_SLOTS.contains(&e.id.as_str())
                || e.id.starts_with(ACTION_PREFIX)
                || primary_ids.contains(&e.id.as_str())
            {
                return true;
            }
            primary_ids.push(&e.id);
        }
    }
    false
}

/// Primary entities as `id: value` slots and secondary ones grouped under `action_<verb>`, in
/// order of first appearance (as Python dict insertion order gives).
fn write_flat_entities(out: &mut String, ir: &Ir) {
    let mut groups_written: Vec<&str> = Vec::new();
    for (i, e) in ir.entities.iter().enumerate() {
        if e.is_primary(&ir.intent) {
            out.push(',');
            write_text(out, &e.id);
            out.push(':');
            write_text(out, &e.value);
            continue;
        }
        let action = e.action.as_deref().unwrap_or_default();
        if groups_written.contains(&action) {
            continue;
        }
        groups_written.push(action);
        out.push_str(",\"action_");
        out.extend(action.strip_prefix('!').unwrap_or(action).chars().map(|c| c.to_ascii_lowercase()));
        out.push_str("\":[");
        let members = ir.entities[i..]
            .iter()
            .filter(|s| !s.is_primary(&ir.intent) && s.action.as_deref() == Some(action));
        for (j, member) in members.enumerate() {
            if j > 0 {
                out.push(',');
            }
            write_text(out, &member.value);
        }
        out.push(']');
    }
}

/// The semantic parts of a decoded json payload.
pub struct Parsed {
    pub intent: String,
    pub entities: Vec<Entity>,
    pub constraints: Vec<Constraint>,
    pub alternatives: Vec<Alternative>,
}

/// Reads a parsed JSON document as a json frontend payload.
pub fn read(document: Value, notices: &mut Vec<Notice>) -> Result<Parsed, SilpError> {
    let Value::Object(mut map) = document else {
        return Err(failed(format!("expected a JSON object, found {}", kind_of(&document))));
    };
    let intent = match map.shift_remove("intent") {
        Some(Value::String(s)) => action_code(&s, "intent", notices)?,
        Some(other) => {
            return Err(failed(format!(
                "'intent' must be a string such as \"!CANCEL\", found {}",
                kind_of(&other)
            )));
        }
        None => return Err(failed("missing 'intent': a json payload needs \"intent\": \"!VERB\"")),
    };
    let constraints = match map.shift_remove("constraints") {
        Some(v) => list_of(v, "constraints", constraint_from)?,
        None => Vec::new(),
    };
    let alternatives = match map.shift_remove("alternatives") {
        Some(v) => list_of(v, "alternatives", |obj, path| alternative_from(obj, path, notices))?,
        None => Vec::new(),
    };
    let mut entities = Vec::new();
    for (key, value) in map {
        if key == "entities" && value.is_array() {
            entities.extend(list_of(value, "entities", |obj, path| entity_from(obj, path, notices))?);
        } else if let Some(verb) = key.strip_prefix(ACTION_PREFIX) {
            let action = action_code(&format!("!{}", verb.to_uppercase()), &key, notices)?;
            let values = match value {
                Value::Array(items) => items,
                scalar => vec![scalar],
            };
            for (i, v) in values.into_iter().enumerate() {
                let Value::String(value) = v else {
                    return Err(failed(format!(
                        "{key}[{i}]: secondary action values must be strings, found {}",
                        kind_of(&v)
                    )));
                };
                entities.push(Entity {
                    id: key.clone(),
                    value,
                    action: Some(action.clone()),
                    extra: Extras::new(),
                });
            }
        } else {
            let value = scalar_text(value, &key)?;
            entities.push(Entity { id: key, value, action: Some(intent.clone()), extra: Extras::new() });
        }
    }
    Ok(Parsed { intent, entities, constraints, alternatives })
}

fn failed(message: impl Into<String>) -> SilpError {
    SilpError::new(ErrorCode::DecodeFailed, message)
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// An action code, with look-alike characters mapped (and reported).
fn action_code(raw: &str, path: &str, notices: &mut Vec<Notice>) -> Result<String, SilpError> {
    let code = match sanitize::ascii_identifier(raw) {
        Ok(ascii) if ascii != raw => {
            notices.push(Notice::HomoglyphMapped { from: raw.to_owned(), to: ascii.to_string(), offset: 0 });
            ascii.into_owned()
        }
        _ => raw.to_owned(),
    };
    if is_action_code(&code) {
        return Ok(code);
    }
    Err(failed(format!(
        "{path}: invalid action code '{raw}': must be '!' followed by upper-case letters and underscores"
    )))
}

/// A slot value as text. Numbers and booleans are taken as their JSON spelling; null, arrays
/// and objects are not values.
fn scalar_text(v: Value, path: &str) -> Result<String, SilpError> {
    match v {
        Value::String(s) => Ok(s),
        Value::Number(n) => Ok(n.to_string()),
        Value::Bool(b) => Ok(b.to_string()),
        other => Err(failed(format!(
            "{path}: a value must be a string, number or boolean, found {}",
            kind_of(&other)
        ))),
    }
}

fn list_of<T>(
    v: Value,
    name: &str,
    mut item: impl FnMut(Map<String, Value>, &str) -> Result<T, SilpError>,
) -> Result<Vec<T>, SilpError> {
    match v {
        Value::Null => Ok(Vec::new()),
        Value::Array(items) => items
            .into_iter()
            .enumerate()
            .map(|(i, x)| match x {
                Value::Object(obj) => item(obj, &format!("{name}[{i}]")),
                other => Err(failed(format!("{name}[{i}]: expected an object, found {}", kind_of(&other)))),
            })
            .collect(),
        other => Err(failed(format!("'{name}' must be an array of objects, found {}", kind_of(&other)))),
    }
}

fn take_string(obj: &mut Map<String, Value>, field: &str, path: &str) -> Result<String, SilpError> {
    match obj.shift_remove(field) {
        Some(Value::String(s)) => Ok(s),
        Some(other) => Err(failed(format!("{path}.{field}: must be a string, found {}", kind_of(&other)))),
        None => Err(failed(format!("{path}: missing '{field}'"))),
    }
}

fn take_optional(obj: &mut Map<String, Value>, field: &str, path: &str) -> Result<Option<String>, SilpError> {
    match obj.shift_remove(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(other) => Err(failed(format!("{path}.{field}: must be a string, found {}", kind_of(&other)))),
    }
}

fn constraint_from(mut obj: Map<String, Value>, path: &str) -> Result<Constraint, SilpError> {
    let kind = take_string(&mut obj, "type", path)?;
    let value = take_string(&mut obj, "value", path)?;
    let time = take_optional(&mut obj, "time", path)?;
    Ok(Constraint { kind, value, time, extra: obj })
}

fn alternative_from(
    mut obj: Map<String, Value>,
    path: &str,
    notices: &mut Vec<Notice>,
) -> Result<Alternative, SilpError> {
    let action = take_string(&mut obj, "action", path)?;
    let action = action_code(&action, &format!("{path}.action"), notices)?;
    let target = take_optional(&mut obj, "target", path)?;
    let location = take_optional(&mut obj, "location", path)?;
    Ok(Alternative { action, target, location, extra: obj })
}

fn entity_from(
    mut obj: Map<String, Value>,
    path: &str,
    notices: &mut Vec<Notice>,
) -> Result<Entity, SilpError> {
    let id = take_string(&mut obj, "id", path)?;
    let value = take_string(&mut obj, "value", path)?;
    let action = match take_optional(&mut obj, "action", path)? {
        Some(a) => Some(action_code(&a, &format!("{path}.action"), notices)?),
        None => None,
    };
    Ok(Entity { id, value, action, extra: obj })
}
