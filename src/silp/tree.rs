//! An IR read from a JSON value that is already parsed (an NLIP envelope's content), walked
//! directly: the same checks and the same IR as [`super::typed`]'s reader of text, without
//! driving serde's deserializer over the tree. `tests/silp_schema_differential.rs` holds this
//! reader ([`from_value`]) to the schema validator's verdict.
//!
//! A value has no repeated keys, so a refusal here is always the schema's.

pub(crate) use super::ir::Noted;
use super::ir::{
    Alternative, Constraint, Entity, Extras, Ir, Meta, Refused, Text, is_action_code, is_req_id,
    is_silp_version,
};
use serde_json::{Map, Value};

/// Reads an IR from a JSON value, with the checks of [`super::typed::read`]; a value has no
/// repeated keys, so here a refusal always means the schema's.
///
/// # Errors
/// [`Refused`] when the value breaks the schema.
pub fn from_value(value: &Value) -> Result<Ir, Refused> {
    read(value, None).map(|(ir, _)| ir)
}

/// [`from_value`], noting whether `meta.out` was given, which the IR alone cannot tell from
/// the default.
///
/// # Errors
/// [`Refused`] as [`from_value`].
pub(crate) fn from_value_noting(value: &Value) -> Result<(Ir, Noted), Refused> {
    read(value, None)
}

/// [`from_value`] for an IR whose `meta.req_id` is assigned by the reader when it has none: as
/// if `req_id` had been inserted into its meta (or a meta holding only it), without copying
/// the tree to insert it.
///
/// # Errors
/// [`Refused`] as [`from_value`] would refuse the IR with `req_id` inserted.
pub(crate) fn from_value_assigning(value: &Value, req_id: &str) -> Result<Ir, Refused> {
    if !is_req_id(req_id) {
        return Err(Refused);
    }
    read(value, Some(req_id)).map(|(ir, _)| ir)
}

/// Reads the IR in `value`; `req_id` is the one assigned when its meta names none.
fn read(value: &Value, req_id: Option<&str>) -> Result<(Ir, Noted), Refused> {
    let root = value.as_object().ok_or(Refused)?;
    let mut ir = Ir::unfilled();
    let mut noted = Noted { out_given: false };
    let (mut intent_seen, mut meta_seen) = (false, false);
    for (key, v) in root {
        match key.as_str() {
            "silp" => {
                ir.silp = string(v)?;
                if !is_silp_version(&ir.silp) {
                    return Err(Refused);
                }
            }
            "version" => ir.version = string(v)?,
            "intent" => {
                intent_seen = true;
                ir.intent = action(v)?;
            }
            "entities" => ir.entities = list(v, entity)?,
            "constraints" => ir.constraints = list(v, constraint)?,
            "alternatives" => ir.alternatives = list(v, alternative)?,
            "meta" => {
                meta_seen = true;
                meta(v, req_id, &mut noted, &mut ir.meta)?;
            }
            // additionalProperties: false.
            _ => return Err(Refused),
        }
    }
    // An assigned req_id brings its meta with it.
    if !meta_seen && let Some(req_id) = req_id {
        meta_seen = true;
        ir.meta = Meta::with_req_id(req_id.into());
    }
    // required: intent, meta.
    if !(intent_seen && meta_seen) {
        return Err(Refused);
    }
    Ok((ir, noted))
}

/// `{"type": "string"}`.
fn string(v: &Value) -> Result<Text, Refused> {
    v.as_str().map(Text::from).ok_or(Refused)
}

/// `{"type": ["string", "null"]}`.
fn optional(v: &Value) -> Result<Option<Text>, Refused> {
    match v {
        Value::Null => Ok(None),
        Value::String(s) => Ok(Some(Text::from(s.as_str()))),
        _ => Err(Refused),
    }
}

/// A string with the action-code pattern.
fn action(v: &Value) -> Result<Text, Refused> {
    let s = v.as_str().ok_or(Refused)?;
    if is_action_code(s) { Ok(Text::from(s)) } else { Err(Refused) }
}

/// An array whose items are objects of one kind.
fn list<T>(v: &Value, item: fn(&Map<String, Value>) -> Result<T, Refused>) -> Result<Vec<T>, Refused> {
    let items = v.as_array().ok_or(Refused)?;
    let mut out = Vec::with_capacity(items.len());
    for v in items {
        out.push(item(v.as_object().ok_or(Refused)?)?);
    }
    Ok(out)
}

fn entity(object: &Map<String, Value>) -> Result<Entity, Refused> {
    let mut e = Entity { id: Text::default(), value: Text::default(), action: None, extra: Extras::new() };
    let (mut id_seen, mut value_seen) = (false, false);
    for (key, v) in object {
        match key.as_str() {
            "id" => {
                id_seen = true;
                e.id = string(v)?;
            }
            "value" => {
                value_seen = true;
                e.value = string(v)?;
            }
            "action" => {
                e.action = optional(v)?;
                if e.action.as_deref().is_some_and(|a| !is_action_code(a)) {
                    return Err(Refused);
                }
            }
            _ => {
                e.extra.insert(key.clone(), v.clone());
            }
        }
    }
    if id_seen && value_seen { Ok(e) } else { Err(Refused) }
}

fn constraint(object: &Map<String, Value>) -> Result<Constraint, Refused> {
    let mut c = Constraint::new(Text::default(), Text::default());
    let (mut type_seen, mut value_seen) = (false, false);
    for (key, v) in object {
        match key.as_str() {
            "type" => {
                type_seen = true;
                c.kind = string(v)?;
            }
            "value" => {
                value_seen = true;
                c.value = string(v)?;
            }
            "time" => c.time = optional(v)?,
            _ => {
                c.extra.insert(key.clone(), v.clone());
            }
        }
    }
    if type_seen && value_seen { Ok(c) } else { Err(Refused) }
}

fn alternative(object: &Map<String, Value>) -> Result<Alternative, Refused> {
    let mut a = Alternative { action: Text::default(), target: None, location: None, extra: Extras::new() };
    let mut action_seen = false;
    for (key, v) in object {
        match key.as_str() {
            "action" => {
                action_seen = true;
                a.action = action(v)?;
            }
            "target" => a.target = optional(v)?,
            "location" => a.location = optional(v)?,
            _ => {
                a.extra.insert(key.clone(), v.clone());
            }
        }
    }
    if action_seen { Ok(a) } else { Err(Refused) }
}

/// Fills `m`, an unfilled meta (every default), in place: a meta is the IR's largest part.
fn meta(v: &Value, req_id: Option<&str>, noted: &mut Noted, m: &mut Meta) -> Result<(), Refused> {
    let object = v.as_object().ok_or(Refused)?;
    let mut req_id_seen = false;
    for (key, v) in object {
        match key.as_str() {
            "priority" => m.priority = integer(v)?,
            "confidence" => m.confidence = confidence(v)?,
            "seq" => {
                let items = v.as_array().ok_or(Refused)?;
                m.seq = items.iter().map(string).collect::<Result<_, _>>()?;
            }
            "out" => {
                m.out = string(v)?;
                noted.out_given = true;
            }
            "next_agent" => m.next_agent = optional(v)?,
            "req_id" => {
                req_id_seen = true;
                m.req_id = string(v)?;
                if !is_req_id(&m.req_id) {
                    return Err(Refused);
                }
            }
            "session_id" => m.session_id = optional(v)?,
            _ => {
                m.extra.insert(key.clone(), v.clone());
            }
        }
    }
    if !req_id_seen && let Some(req_id) = req_id {
        req_id_seen = true;
        m.req_id = req_id.into();
    }
    if req_id_seen { Ok(()) } else { Err(Refused) }
}

/// `{"type": "integer"}`: JSON Schema counts `2.0` as an integer. The value is what the tree
/// path keeps: exact when it fits `i64`, else the `f64` saturated into `i64`.
fn integer(v: &Value) -> Result<i64, Refused> {
    let Value::Number(n) = v else { return Err(Refused) };
    if let Some(u) = n.as_u64() {
        return Ok(i64::try_from(u).unwrap_or(u as f64 as i64));
    }
    if let Some(i) = n.as_i64() {
        return Ok(i);
    }
    match n.as_f64() {
        Some(f) if f.fract() == 0.0 => Ok(f as i64),
        _ => Err(Refused),
    }
}

/// `{"type": "number", "minimum": 0, "maximum": 1}`.
fn confidence(v: &Value) -> Result<f64, Refused> {
    let Value::Number(n) = v else { return Err(Refused) };
    if let Some(u) = n.as_u64() {
        return if u <= 1 { Ok(u as f64) } else { Err(Refused) };
    }
    if let Some(i) = n.as_i64() {
        return if (0..=1).contains(&i) { Ok(i as f64) } else { Err(Refused) };
    }
    match n.as_f64() {
        Some(f) if (0.0..=1.0).contains(&f) => Ok(f),
        _ => Err(Refused),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_assigned_req_id_reads_as_if_it_had_been_inserted() {
        let with_inserted = |text: &str| {
            let mut value: Value = serde_json::from_str(text).unwrap();
            let object = value.as_object_mut().unwrap();
            let meta = object.entry("meta").or_insert_with(|| Value::Object(Default::default()));
            meta.as_object_mut().unwrap().insert("req_id".into(), Value::String("beef".into()));
            from_value(&value)
        };
        for text in [
            r#"{"intent":"!CANCEL"}"#,
            r#"{"intent":"!CANCEL","meta":{}}"#,
            r#"{"intent":"!CANCEL","meta":{"priority":2,"x-note":"kept"}}"#,
            r#"{"intent":"!CANCEL","entities":[{"id":"o1","type":"order"}],"meta":{"out":"code"}}"#,
            r#"{"intent":"cancel"}"#,
            r#"{"intent":"!CANCEL","meta":{"confidence":2}}"#,
            r#"{"meta":{}}"#,
        ] {
            let value: Value = serde_json::from_str(text).unwrap();
            assert_eq!(from_value_assigning(&value, "beef"), with_inserted(text), "{text}");
        }
        let value: Value = serde_json::from_str(r#"{"intent":"!CANCEL"}"#).unwrap();
        assert_eq!(from_value_assigning(&value, "BEEF"), Err(Refused), "the assigned req_id is checked too");
    }
}
