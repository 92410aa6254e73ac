//! json frontend text -> IR, in one pass over the text with serde (no intermediate JSON tree).
//!
//! Semantics are the reference's: `intent` is the primary action; `constraints` and
//! `alternatives` are lists of objects; a key `action_<verb>` holds the values of a secondary
//! action (a list, or one string); any other key is a primary entity `id: value`. A repeated
//! key keeps its first position and its last value, as a Python dict does. An `entities` key
//! holding an array is silpgate's explicit entity list.

use super::ACTION_PREFIX;
use crate::silp::error::{ErrorCode, SilpError};
use crate::silp::ir::{Alternative, Constraint, Entity, Extras, Text, is_action_code};
use crate::silp::sanitize::{self, Notice};
use crate::silp::typed::Str;
use crate::util::json_text::{FloatStyle, write_float};
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::Value;
use std::borrow::Cow;
use std::fmt;
use std::ops::Range;

/// The semantic parts of a decoded json payload.
pub(crate) struct Parsed {
    pub intent: Text,
    pub entities: Vec<Entity>,
    pub constraints: Vec<Constraint>,
    pub alternatives: Vec<Alternative>,
}

/// Reads json frontend `text`. Syntax errors are `invalid_syntax` with the byte span;
/// well-formed JSON that is not a payload is `decode_failed`.
pub(crate) fn read(text: &str, notices: &mut Vec<Notice>) -> Result<Parsed, SilpError> {
    let mut de = serde_json::Deserializer::from_str(text);
    let parsed = de.deserialize_map(PayloadVisitor { notices }).and_then(|p| de.end().map(|()| p));
    parsed.map_err(|e| {
        let message = without_position(&e);
        match e.classify() {
            serde_json::error::Category::Data => SilpError::new(ErrorCode::DecodeFailed, message),
            _ => {
                let at = crate::silp::offset_of(text, e.line(), e.column());
                SilpError::syntax(crate::silp::char_span(text, at), format!("invalid JSON: {message}"))
            }
        }
    })
}

fn without_position(e: &serde_json::Error) -> String {
    let text = e.to_string();
    match text.find(" at line ") {
        Some(i) => text[..i].to_owned(),
        None => text,
    }
}

fn failed<E: de::Error>(message: impl fmt::Display) -> E {
    E::custom(message)
}

/// A slot value: a string, or a number or boolean read as its JSON spelling.
struct Scalar(Text);

impl<'de> de::Deserialize<'de> for Scalar {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Scalar;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string, number or boolean value")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Scalar, E> {
                Ok(Scalar(Text::from(v)))
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<Scalar, E> {
                Ok(Scalar(Text::const_new(if v { "true" } else { "false" })))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Scalar, E> {
                Ok(Scalar(compact_str::format_compact!("{v}")))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Scalar, E> {
                Ok(Scalar(compact_str::format_compact!("{v}")))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Scalar, E> {
                let mut s = String::new();
                write_float(&mut s, v, FloatStyle::Python);
                Ok(Scalar(Text::from(s)))
            }
        }
        d.deserialize_any(V)
    }
}

struct PayloadVisitor<'n> {
    notices: &'n mut Vec<Notice>,
}

/// Where the entities of one key sit in the entity list, for Python's repeated-key rule.
struct Slot {
    key: Text,
    range: Range<usize>,
    /// The explicit `entities` list: its entities say their action themselves.
    explicit: bool,
}

impl<'de> Visitor<'de> for PayloadVisitor<'_> {
    type Value = Parsed;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a json payload object such as {\"intent\": \"!CANCEL\", \"act\": \"flight\"}")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Parsed, A::Error> {
        let mut intent: Option<Text> = None;
        let mut constraints = Vec::new();
        let mut alternatives = Vec::new();
        let mut entities: Vec<Entity> = Vec::with_capacity(4);
        let mut slots: Vec<Slot> = Vec::with_capacity(4);
        while let Some(Str(key)) = map.next_key::<Str>()? {
            let before = entities.len();
            let mut explicit = false;
            match key.as_ref() {
                "intent" => {
                    let raw = map
                        .next_value::<Option<Str>>()?
                        .ok_or_else(|| failed("'intent' must be a string such as \"!CANCEL\""))?;
                    intent = Some(action_code(&raw.0, "intent", self.notices)?);
                    continue;
                }
                "constraints" => {
                    let item = constraint_from as ObjectReader<_>;
                    let notices = &mut *self.notices;
                    constraints = map.next_value_seed(ListSeed {
                        name: "constraints",
                        declared: CONSTRAINT_FIELDS,
                        item,
                        notices,
                    })?;
                    continue;
                }
                "alternatives" => {
                    let item = alternative_from as ObjectReader<_>;
                    let notices = &mut *self.notices;
                    alternatives = map.next_value_seed(ListSeed {
                        name: "alternatives",
                        declared: ALTERNATIVE_FIELDS,
                        item,
                        notices,
                    })?;
                    continue;
                }
                "entities" => {
                    let (list, is_list) =
                        map.next_value_seed(EntitiesSeed { notices: &mut *self.notices })?;
                    explicit = is_list;
                    entities.extend(list);
                }
                k if k.starts_with(ACTION_PREFIX) => {
                    let action = secondary_action(k, self.notices)?;
                    map.next_value_seed(ActionValues { key: k, action: &action, entities: &mut entities })?;
                }
                k => {
                    let Scalar(value) = map.next_value::<Option<Scalar>>()?.ok_or_else(|| {
                        failed(format!("{k}: a value must be a string, number or boolean, found null"))
                    })?;
                    // The action is the intent, filled in once the intent is known.
                    entities.push(Entity { id: Text::from(k), value, action: None, extra: Extras::new() });
                }
            }
            let range = before..entities.len();
            match slots.iter().position(|s| s.key == key.as_ref()) {
                // A repeated key: its new entities take the place of the old ones.
                Some(i) => {
                    let new: Vec<Entity> = entities.drain(range).collect();
                    let old = slots[i].range.clone();
                    let shift = new.len() as isize - old.len() as isize;
                    slots[i].range = old.start..old.start + new.len();
                    slots[i].explicit = explicit;
                    entities.splice(old, new);
                    for later in &mut slots[i + 1..] {
                        later.range = (later.range.start as isize + shift) as usize
                            ..(later.range.end as isize + shift) as usize;
                    }
                }
                None => slots.push(Slot { key: Text::from(key.as_ref()), range, explicit }),
            }
        }
        let intent =
            intent.ok_or_else(|| failed("missing 'intent': a json payload needs \"intent\": \"!VERB\""))?;
        // Flat slots are primary entities; an explicit list says so itself.
        for slot in slots.iter().filter(|s| !s.explicit) {
            for e in &mut entities[slot.range.clone()] {
                e.action.get_or_insert_with(|| intent.clone());
            }
        }
        Ok(Parsed { intent, entities, constraints, alternatives })
    }
}

/// `action_email` -> `!EMAIL` (Unicode upper-casing, as the reference; then the sanitiser).
fn secondary_action<E: de::Error>(key: &str, notices: &mut Vec<Notice>) -> Result<Text, E> {
    let verb = &key[ACTION_PREFIX.len()..];
    let mut code = Text::with_capacity(verb.len() + 1);
    code.push('!');
    if verb.is_ascii() {
        code.push_str(verb);
        code.make_ascii_uppercase();
    } else {
        code.push_str(&verb.to_uppercase());
    }
    action_code(&code, key, notices)
}

/// An action code, with look-alike characters mapped (and reported).
fn action_code<E: de::Error>(raw: &str, path: &str, notices: &mut Vec<Notice>) -> Result<Text, E> {
    let code = match sanitize::ascii_identifier(raw) {
        Ok(ascii) if ascii != raw => {
            notices.push(Notice::HomoglyphMapped { from: raw.to_owned(), to: ascii.to_string(), offset: 0 });
            Text::from(ascii.as_ref())
        }
        _ => Text::from(raw),
    };
    if is_action_code(&code) {
        return Ok(code);
    }
    Err(failed(format!(
        "{path}: invalid action code '{raw}': must be '!' followed by upper-case letters and underscores"
    )))
}

/// The values of an `action_<verb>` key (a list of strings, or one string), appended to the
/// entity list as secondary entities.
struct ActionValues<'a> {
    key: &'a str,
    action: &'a Text,
    entities: &'a mut Vec<Entity>,
}

impl ActionValues<'_> {
    fn push(&mut self, value: Text) {
        let (id, action) = (Text::from(self.key), Some(self.action.clone()));
        self.entities.push(Entity { id, value, action, extra: Extras::new() });
    }
}

impl<'de> DeserializeSeed<'de> for ActionValues<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ActionValues<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "{}: a list of strings (the values of a secondary action)", self.key)
    }
    fn visit_str<E: de::Error>(mut self, v: &str) -> Result<(), E> {
        self.push(Text::from(v));
        Ok(())
    }
    fn visit_seq<A: SeqAccess<'de>>(mut self, mut seq: A) -> Result<(), A::Error> {
        let mut index = 0;
        while let Some(field) = seq.next_element::<FieldValue>()? {
            match field {
                FieldValue::Str(s) => self.push(Text::from(s.as_ref())),
                other => {
                    return Err(failed(format!(
                        "{}[{index}]: secondary action values must be strings, found {}",
                        self.key,
                        other.kind()
                    )));
                }
            }
            index += 1;
        }
        Ok(())
    }
}

/// A list of objects (`constraints`, `alternatives`, `entities`); `null` is an empty list.
struct ListSeed<'n, F> {
    name: &'static str,
    /// The declared fields of this kind of object; every other field is an extra.
    declared: Declared,
    item: F,
    notices: &'n mut Vec<Notice>,
}

type Declared = &'static [&'static str; 3];
const CONSTRAINT_FIELDS: Declared = &["type", "value", "time"];
const ALTERNATIVE_FIELDS: Declared = &["action", "target", "location"];
const ENTITY_FIELDS: Declared = &["id", "value", "action"];

/// Where an object sits: `constraints[2]`. Written out only for error messages.
#[derive(Clone, Copy)]
struct Path {
    name: &'static str,
    index: usize,
}

impl fmt::Display for Path {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "{}[{}]", self.name, self.index)
    }
}

type ObjectReader<T> = fn(ObjectFields<'_>, Path, &mut Vec<Notice>) -> Result<T, String>;

impl<'de, T> DeserializeSeed<'de> for ListSeed<'_, ObjectReader<T>> {
    type Value = Vec<T>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Vec<T>, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de, T> Visitor<'de> for ListSeed<'_, ObjectReader<T>> {
    type Value = Vec<T>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "'{}' to be an array of objects", self.name)
    }
    fn visit_unit<E: de::Error>(self) -> Result<Vec<T>, E> {
        Ok(Vec::new())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<T>, A::Error> {
        let mut out = Vec::new();
        loop {
            let path = Path { name: self.name, index: out.len() };
            match seq.next_element_seed(ObjectSeed { path, declared: self.declared })? {
                Some(fields) => out.push((self.item)(fields, path, self.notices).map_err(failed)?),
                None => return Ok(out),
            }
        }
    }
}

/// A field value: a string (borrowed when it can be), null, or the kind of anything else.
enum FieldValue<'de> {
    Str(Cow<'de, str>),
    Null,
    Other(&'static str),
}

impl FieldValue<'_> {
    fn kind(&self) -> &'static str {
        match self {
            FieldValue::Str(_) => "a string",
            FieldValue::Null => "null",
            FieldValue::Other(kind) => kind,
        }
    }
}

impl<'de> de::Deserialize<'de> for FieldValue<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = FieldValue<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(FieldValue::Str(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(FieldValue::Str(Cow::Owned(v.to_owned())))
            }
            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(FieldValue::Null)
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
                Ok(FieldValue::Other("a boolean"))
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
                Ok(FieldValue::Other("a number"))
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
                Ok(FieldValue::Other("a number"))
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
                Ok(FieldValue::Other("a number"))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(FieldValue::Other("an array"))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(FieldValue::Other("an object"))
            }
        }
        d.deserialize_any(V)
    }
}

/// The declared fields of a list object (in the order of its `Declared` names) and its extras.
struct ObjectFields<'de> {
    names: Declared,
    declared: [Option<FieldValue<'de>>; 3],
    extras: Extras,
}

impl<'de> ObjectFields<'de> {
    fn take(&mut self, name: &str) -> Option<FieldValue<'de>> {
        let i = self.names.iter().position(|d| *d == name).expect("a declared field");
        self.declared[i].take()
    }

    fn string(&mut self, name: &str, path: Path) -> Result<Text, String> {
        match self.take(name) {
            Some(FieldValue::Str(s)) => Ok(Text::from(s.as_ref())),
            Some(other) => Err(format!("{path}.{name}: must be a string, found {}", other.kind())),
            None => Err(format!("{path}: missing '{name}'")),
        }
    }

    fn optional(&mut self, name: &str, path: Path) -> Result<Option<Text>, String> {
        match self.take(name) {
            None | Some(FieldValue::Null) => Ok(None),
            Some(FieldValue::Str(s)) => Ok(Some(Text::from(s.as_ref()))),
            Some(other) => Err(format!("{path}.{name}: must be a string, found {}", other.kind())),
        }
    }
}

struct ObjectSeed {
    path: Path,
    declared: Declared,
}

impl<'de> DeserializeSeed<'de> for ObjectSeed {
    type Value = ObjectFields<'de>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<ObjectFields<'de>, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ObjectSeed {
    type Value = ObjectFields<'de>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "{} to be an object", self.path)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<ObjectFields<'de>, A::Error> {
        let mut fields =
            ObjectFields { names: self.declared, declared: Default::default(), extras: Extras::new() };
        while let Some(Str(key)) = map.next_key::<Str>()? {
            // A repeated key keeps its first position and its last value.
            match self.declared.iter().position(|d| *d == key.as_ref()) {
                Some(i) => fields.declared[i] = Some(map.next_value()?),
                None => {
                    let value: Value = map.next_value()?;
                    fields.extras.insert(key.into_owned(), value);
                }
            }
        }
        Ok(fields)
    }
}

fn constraint_from(mut o: ObjectFields<'_>, path: Path, _: &mut Vec<Notice>) -> Result<Constraint, String> {
    let kind = o.string("type", path)?;
    let value = o.string("value", path)?;
    let time = o.optional("time", path)?;
    Ok(Constraint { kind, value, time, extra: o.extras })
}

fn alternative_from(
    mut o: ObjectFields<'_>,
    path: Path,
    notices: &mut Vec<Notice>,
) -> Result<Alternative, String> {
    let raw = o.string("action", path)?;
    let action = checked_code(&raw, &format!("{path}.action"), notices)?;
    let target = o.optional("target", path)?;
    let location = o.optional("location", path)?;
    Ok(Alternative { action, target, location, extra: o.extras })
}

fn entity_from(mut o: ObjectFields<'_>, path: Path, notices: &mut Vec<Notice>) -> Result<Entity, String> {
    let id = o.string("id", path)?;
    let value = o.string("value", path)?;
    let action = match o.optional("action", path)? {
        Some(a) => Some(checked_code(&a, &format!("{path}.action"), notices)?),
        None => None,
    };
    Ok(Entity { id, value, action, extra: o.extras })
}

fn checked_code(raw: &str, path: &str, notices: &mut Vec<Notice>) -> Result<Text, String> {
    if is_action_code(raw) {
        return Ok(Text::from(raw));
    }
    action_code::<serde_json::Error>(raw, path, notices).map_err(|e| e.to_string())
}

/// The explicit entity list, or (for a non-array) an ordinary slot named `entities`.
struct EntitiesSeed<'n> {
    notices: &'n mut Vec<Notice>,
}

impl<'de> DeserializeSeed<'de> for EntitiesSeed<'_> {
    /// The entities, and whether they came as the explicit list.
    type Value = (Vec<Entity>, bool);
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for EntitiesSeed<'_> {
    type Value = (Vec<Entity>, bool);
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("'entities' to be an array of entity objects, or a string value")
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        let entity = Entity {
            id: Text::const_new("entities"),
            value: Text::from(v),
            action: None,
            extra: Extras::new(),
        };
        Ok((vec![entity], false))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        let item = entity_from as ObjectReader<Entity>;
        let seed = ListSeed { name: "entities", declared: ENTITY_FIELDS, item, notices: self.notices };
        Ok((seed.visit_seq(seq)?, true))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Err(failed("entities: a value must be a string, number or boolean, found an object"))
    }
}
