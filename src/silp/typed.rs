//! IR JSON text -> [`Ir`] in one serde pass, no `serde_json::Value` tree, enforcing every
//! constraint of the draft's schema (`schema/silp-ir.schema.json`) on the way: required fields,
//! types, `additionalProperties: false` at the root, the `silp`, `intent`, `action` and
//! `req_id` patterns, `priority` as an integer and `confidence` within 0..=1.
//!
//! This is the fast path only. When it refuses a text, the caller goes through the schema
//! validator ([`super::schema`]), which stays the reference for what the schema says and words
//! the error with its JSON path; `tests/silp_schema_differential.rs` holds the two to the same
//! verdict on every input it generates. A value already parsed is read by [`super::tree`],
//! with the same checks.
//!
//! Unknown fields of the extensible objects keep serde_json's map semantics (a repeated key
//! keeps its first position and its last value), exactly what the tree path builds; a repeated
//! declared field keeps its last value too. The one text judged differently: a declared field
//! repeated with an earlier value of the wrong type. The tree sees only the last value and may
//! accept; this reader refuses at the first, and the caller's fallback accepts it.

pub use super::ir::Refused;
use super::ir::{
    Alternative, Constraint, Entity, Extras, Ir, Meta, Noted, Text, is_action_code, is_req_id,
    is_silp_version,
};
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::Value;
use std::borrow::Cow;
use std::cell::Cell;
use std::fmt;

/// Reads an IR from JSON `text`, or refuses it.
pub fn read(text: &str) -> Result<Ir, Refused> {
    read_noting(text).map(|(ir, _)| ir)
}

/// [`read`], noting whether `meta.out` was given, which the IR alone cannot tell from the
/// default.
pub(crate) fn read_noting(text: &str) -> Result<(Ir, Noted), Refused> {
    let out_given = Cell::new(false);
    let mut de = serde_json::Deserializer::from_str(text);
    let ir = de
        .deserialize_map(RootVisitor { req_id: None, out_given: &out_given })
        .and_then(|ir| de.end().map(|()| ir))
        .map_err(|_| Refused)?;
    Ok((ir, Noted { out_given: out_given.get() }))
}

/// The serde error every refusal is raised as; its text is never shown, the caller re-checks
/// through the schema validator for the wording.
fn refuse<E: de::Error>() -> E {
    E::custom("not a schema-valid IR")
}

/// A key or string that borrows from the input when it has no escapes (the JSON frontend's
/// reader uses it too).
pub(crate) struct Str<'de>(pub(crate) Cow<'de, str>);

impl<'de> de::Deserialize<'de> for Str<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Str<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Str<'de>, E> {
                Ok(Str(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Str<'de>, E> {
                Ok(Str(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Str<'de>, E> {
                Ok(Str(Cow::Owned(v)))
            }
        }
        d.deserialize_str(V)
    }
}

/// `{"type": "string"}`.
fn string<'de, A: MapAccess<'de>>(map: &mut A) -> Result<Text, A::Error> {
    map.next_value::<Text>()
}

/// `{"type": ["string", "null"]}`.
fn optional<'de, A: MapAccess<'de>>(map: &mut A) -> Result<Option<Text>, A::Error> {
    map.next_value::<Option<Text>>()
}

/// A string with the action-code pattern.
fn action<'de, A: MapAccess<'de>>(map: &mut A) -> Result<Text, A::Error> {
    let s = string(map)?;
    if is_action_code(&s) { Ok(s) } else { Err(refuse()) }
}

/// Adds an unknown field the way serde_json's map does.
fn extra<'de, A: MapAccess<'de>>(
    map: &mut A,
    extras: &mut Extras,
    key: Cow<'de, str>,
) -> Result<(), A::Error> {
    let value = map.next_value::<Value>()?;
    extras.insert(key.into_owned(), value);
    Ok(())
}

/// Reads the root object; `req_id` is the one assigned to an IR that names none.
struct RootVisitor<'r> {
    req_id: Option<&'r str>,
    out_given: &'r Cell<bool>,
}

impl<'de> Visitor<'de> for RootVisitor<'_> {
    type Value = Ir;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an IR object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Ir, A::Error> {
        let mut ir = Ir::unfilled();
        // The required fields seen, one bit each.
        let mut seen = 0u8;
        while let Some(Str(key)) = map.next_key::<Str>()? {
            match &*key {
                "silp" => {
                    ir.silp = string(&mut map)?;
                    if !is_silp_version(&ir.silp) {
                        return Err(refuse());
                    }
                }
                "version" => {
                    ir.version = string(&mut map)?;
                }
                "intent" => {
                    seen |= 1;
                    ir.intent = action(&mut map)?;
                }
                "entities" => {
                    ir.entities = map.next_value_seed(List(EntitySeed))?;
                }
                "constraints" => {
                    ir.constraints = map.next_value_seed(List(ConstraintSeed))?;
                }
                "alternatives" => {
                    ir.alternatives = map.next_value_seed(List(AlternativeSeed))?;
                }
                "meta" => {
                    seen |= 2;
                    ir.meta =
                        map.next_value_seed(MetaSeed { req_id: self.req_id, out_given: self.out_given })?;
                }
                // additionalProperties: false.
                _ => return Err(refuse()),
            }
        }
        // An assigned req_id brings its meta with it.
        if seen & 2 == 0
            && let Some(req_id) = self.req_id
        {
            seen |= 2;
            ir.meta = Meta::with_req_id(req_id.into());
        }
        // required: intent, meta.
        if seen != 3 {
            return Err(refuse());
        }
        Ok(ir)
    }
}

/// How one kind of list item is read: an object visitor over its fields.
trait Item: Copy {
    type Out;
    fn read<'de, A: MapAccess<'de>>(self, map: A) -> Result<Self::Out, A::Error>;
}

/// An array whose items are objects of one kind.
struct List<I>(I);

impl<'de, I: Item> DeserializeSeed<'de> for List<I> {
    type Value = Vec<I::Out>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de, I: Item> Visitor<'de> for List<I> {
    type Value = Vec<I::Out>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an array of objects")
    }

    fn visit_seq<S: SeqAccess<'de>>(self, mut seq: S) -> Result<Self::Value, S::Error> {
        let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(16));
        while let Some(item) = seq.next_element_seed(ObjectSeed(self.0))? {
            out.push(item);
        }
        Ok(out)
    }
}

struct ObjectSeed<I>(I);

impl<'de, I: Item> DeserializeSeed<'de> for ObjectSeed<I> {
    type Value = I::Out;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de, I: Item> Visitor<'de> for ObjectSeed<I> {
    type Value = I::Out;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an object")
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        self.0.read(map)
    }
}

#[derive(Clone, Copy)]
struct EntitySeed;

impl Item for EntitySeed {
    type Out = Entity;

    fn read<'de, A: MapAccess<'de>>(self, mut map: A) -> Result<Entity, A::Error> {
        let mut e =
            Entity { id: Text::default(), value: Text::default(), action: None, extra: Extras::new() };
        let mut seen = 0u8;
        while let Some(Str(key)) = map.next_key::<Str>()? {
            match &*key {
                "id" => {
                    seen |= 1;
                    e.id = string(&mut map)?;
                }
                "value" => {
                    seen |= 2;
                    e.value = string(&mut map)?;
                }
                "action" => {
                    e.action = optional(&mut map)?;
                    if e.action.as_deref().is_some_and(|a| !is_action_code(a)) {
                        return Err(refuse());
                    }
                }
                _ => extra(&mut map, &mut e.extra, key)?,
            }
        }
        if seen & 3 != 3 {
            return Err(refuse());
        }
        Ok(e)
    }
}

#[derive(Clone, Copy)]
struct ConstraintSeed;

impl Item for ConstraintSeed {
    type Out = Constraint;

    fn read<'de, A: MapAccess<'de>>(self, mut map: A) -> Result<Constraint, A::Error> {
        let mut c = Constraint::new(Text::default(), Text::default());
        let mut seen = 0u8;
        while let Some(Str(key)) = map.next_key::<Str>()? {
            match &*key {
                "type" => {
                    seen |= 1;
                    c.kind = string(&mut map)?;
                }
                "value" => {
                    seen |= 2;
                    c.value = string(&mut map)?;
                }
                "time" => {
                    c.time = optional(&mut map)?;
                }
                _ => extra(&mut map, &mut c.extra, key)?,
            }
        }
        if seen & 3 != 3 {
            return Err(refuse());
        }
        Ok(c)
    }
}

#[derive(Clone, Copy)]
struct AlternativeSeed;

impl Item for AlternativeSeed {
    type Out = Alternative;

    fn read<'de, A: MapAccess<'de>>(self, mut map: A) -> Result<Alternative, A::Error> {
        let mut a =
            Alternative { action: Text::default(), target: None, location: None, extra: Extras::new() };
        let mut seen = 0u8;
        while let Some(Str(key)) = map.next_key::<Str>()? {
            match &*key {
                "action" => {
                    seen |= 1;
                    a.action = action(&mut map)?;
                }
                "target" => {
                    a.target = optional(&mut map)?;
                }
                "location" => {
                    a.location = optional(&mut map)?;
                }
                _ => extra(&mut map, &mut a.extra, key)?,
            }
        }
        if seen & 1 != 1 {
            return Err(refuse());
        }
        Ok(a)
    }
}

/// Reads `meta`; `req_id` is the one assigned when it names none.
struct MetaSeed<'r> {
    req_id: Option<&'r str>,
    out_given: &'r Cell<bool>,
}

impl<'de> DeserializeSeed<'de> for MetaSeed<'_> {
    type Value = Meta;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Meta, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for MetaSeed<'_> {
    type Value = Meta;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a meta object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Meta, A::Error> {
        let mut m = Meta::with_req_id(Text::default());
        let mut seen = 0u8;
        while let Some(Str(key)) = map.next_key::<Str>()? {
            match &*key {
                "priority" => {
                    m.priority = map.next_value::<Number>()?.integer().ok_or_else(refuse)?;
                }
                "confidence" => {
                    m.confidence = map.next_value::<Number>()?.confidence().ok_or_else(refuse)?;
                }
                "seq" => {
                    m.seq = map.next_value::<Vec<Text>>()?;
                }
                "out" => {
                    m.out = string(&mut map)?;
                    self.out_given.set(true);
                }
                "next_agent" => {
                    m.next_agent = optional(&mut map)?;
                }
                "req_id" => {
                    seen |= 1;
                    m.req_id = string(&mut map)?;
                    if !is_req_id(&m.req_id) {
                        return Err(refuse());
                    }
                }
                "session_id" => {
                    m.session_id = optional(&mut map)?;
                }
                _ => extra(&mut map, &mut m.extra, key)?,
            }
        }
        if seen == 0
            && let Some(req_id) = self.req_id
        {
            seen = 1;
            m.req_id = req_id.into();
        }
        if seen != 1 {
            return Err(refuse());
        }
        Ok(m)
    }
}

/// A JSON number as serde_json reads it (integers exactly, the rest as `f64`).
#[derive(Clone, Copy)]
enum Number {
    Int(i64),
    UInt(u64),
    Float(f64),
}

impl Number {
    /// `{"type": "integer"}`: JSON Schema counts `2.0` as an integer. The value is what the tree
    /// path keeps: exact when it fits `i64`, else the `f64` saturated into `i64`.
    fn integer(self) -> Option<i64> {
        match self {
            Number::Int(i) => Some(i),
            Number::UInt(u) => Some(i64::try_from(u).unwrap_or(u as f64 as i64)),
            Number::Float(f) if f.fract() == 0.0 => Some(f as i64),
            Number::Float(_) => None,
        }
    }

    /// `{"type": "number", "minimum": 0, "maximum": 1}`.
    fn confidence(self) -> Option<f64> {
        match self {
            Number::Int(i) => (0..=1).contains(&i).then_some(i as f64),
            Number::UInt(u) => (u <= 1).then_some(u as f64),
            Number::Float(f) => (0.0..=1.0).contains(&f).then_some(f),
        }
    }
}

impl<'de> de::Deserialize<'de> for Number {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Number;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a number")
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Number, E> {
                Ok(Number::Int(v))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Number, E> {
                Ok(Number::UInt(v))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Number, E> {
                Ok(Number::Float(v))
            }
        }
        d.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_minimal_ir_gets_every_default() {
        let ir = read(r#"{"intent":"!CANCEL","meta":{"req_id":"abcd"}}"#).unwrap();
        assert_eq!(ir.silp, "v1");
        assert_eq!(ir.version, "ir-v0.1");
        assert_eq!(ir.meta.out, "natural");
        assert_eq!(ir.meta.confidence, 1.0);
    }

    #[test]
    fn schema_breaches_are_refused() {
        for text in [
            r#"{"intent":"!CANCEL"}"#,
            r#"{"intent":"cancel","meta":{"req_id":"abcd"}}"#,
            r#"{"intent":"!CANCEL","meta":{"req_id":"ABCD"}}"#,
            r#"{"intent":"!CANCEL","meta":{"req_id":"abcd"},"x":1}"#,
            r#"{"intent":"!CANCEL","meta":{"req_id":"abcd","confidence":1.5}}"#,
            r#"{"intent":"!CANCEL","meta":{"req_id":"abcd","priority":1.5}}"#,
            r#"{"silp":"v","intent":"!CANCEL","meta":{"req_id":"abcd"}}"#,
            r#"{"intent":"!CANCEL","entities":[{"id":"a"}],"meta":{"req_id":"abcd"}}"#,
            r#"{"intent":"!CANCEL","meta":{"req_id":"abcd"}} x"#,
        ] {
            assert_eq!(read(text).unwrap_err(), Refused, "{text}");
        }
    }

    #[test]
    fn a_repeated_declared_field_keeps_its_last_value() {
        let ir = read(r#"{"intent":"!A","intent":"!B","meta":{"req_id":"abcd"}}"#).unwrap();
        assert_eq!(ir.intent, "!B");
        assert_eq!(read(r#"{"intent":"!A","intent":5,"meta":{"req_id":"abcd"}}"#), Err(Refused));
    }

    #[test]
    fn an_explicit_out_is_noted() {
        let (ir, noted) = read_noting(r#"{"intent":"!A","meta":{"req_id":"abcd","out":"natural"}}"#).unwrap();
        assert_eq!(ir.meta.out, "natural");
        assert!(noted.out_given);
        let (_, noted) = read_noting(r#"{"intent":"!A","meta":{"req_id":"abcd"}}"#).unwrap();
        assert!(!noted.out_given);
    }

    #[test]
    fn integral_floats_are_integers_as_in_json_schema() {
        let ir = read(r#"{"intent":"!A","meta":{"req_id":"abcd","priority":2.0,"confidence":0}}"#).unwrap();
        assert_eq!(ir.meta.priority, 2);
        assert_eq!(ir.meta.confidence, 0.0);
    }
}
