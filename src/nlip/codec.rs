//! NLIP messages from and to their two encodings: JSON (ECMA-430/431) and CBOR (ECMA-432, one
//! message per CBOR map, binary content as byte strings).
//!
//! Reading is liberal, as ECMA-430 §5 asks: key names and `format` values in any
//! capitalisation, `null` for an absent optional field, the legacy `control: true|false`.
//! Writing is canonical, as the Python SDK expects: lower-case keys in the SDK's order, absent
//! fields omitted, unknown fields after the known ones. In JSON, binary content is base64 and
//! the subformat carries `;base64` (ECMA-432 §7); JSON -> CBOR -> JSON is lossless.

use super::error::{NlipError, NlipErrorKind};
use super::message::{Content, Format, Message, RawJson, Submessage};
use crate::util::json_text::{self, Style};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde::Deserialize;
use serde::de::value::{MapAccessDeserializer, SeqAccessDeserializer};
use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;
use serde_json::{Map, Number, Value};

/// The wire encoding of a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    Json,
    Cbor,
}

impl Encoding {
    pub(crate) fn content_type(self) -> &'static str {
        match self {
            Encoding::Json => "application/json",
            Encoding::Cbor => "application/cbor",
        }
    }

    /// The encoding named by a content type (parameters such as `; charset=utf-8` ignored).
    pub fn from_content_type(content_type: &str) -> Option<Encoding> {
        let essence = content_type.split(';').next().unwrap_or_default().trim();
        if essence.eq_ignore_ascii_case("application/json") {
            Some(Encoding::Json)
        } else if essence.eq_ignore_ascii_case("application/cbor") {
            Some(Encoding::Cbor)
        } else {
            None
        }
    }
}

/// Size and shape limits applied while reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub max_bytes: usize,
    /// Deepest nesting of arrays and objects anywhere in the message.
    pub max_depth: usize,
    pub max_submessages: usize,
    /// Most values (strings, numbers, booleans, nulls, arrays, maps; map keys included) in the
    /// whole message, counted before it is decoded (see `nlip::items`).
    pub max_items: usize,
    /// Longest conversation token, in bytes: the token is kept in session state and carried
    /// in headers, so it is bounded on the way in. Other tokens (authentication tokens, which
    /// may be long JWTs) are only echoed and fall under the byte limit.
    pub max_conversation_token_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_bytes: 1 << 20,
            max_depth: 32,
            max_submessages: 256,
            max_items: 100_000,
            max_conversation_token_bytes: 256,
        }
    }
}

const BASE64_MARKER: &str = ";base64";

/// Reads one message in `encoding`.
pub fn decode(bytes: &[u8], encoding: Encoding, limits: &Limits) -> Result<Message, NlipError> {
    if bytes.len() > limits.max_bytes {
        return Err(NlipError::new(
            NlipErrorKind::TooLarge,
            format!("message is {} bytes; the limit is {} bytes", bytes.len(), limits.max_bytes),
        ));
    }
    check_items(bytes, encoding, limits.max_items)?;
    let node = match encoding {
        Encoding::Json => {
            let mut reader = serde_json::Deserializer::from_slice(bytes);
            let read = JsonLevel::Message.deserialize(&mut reader).and_then(|node| {
                reader.end()?;
                Ok(node)
            });
            read.map_err(|e| {
                let kind = if e.to_string().contains("recursion limit") {
                    NlipErrorKind::TooComplex
                } else {
                    NlipErrorKind::InvalidEncoding
                };
                NlipError::new(kind, format!("not valid JSON: {e}"))
            })?
        }
        Encoding::Cbor => {
            let value: ciborium::Value =
                ciborium::de::from_reader_with_recursion_limit(bytes, limits.max_depth + 4).map_err(|e| {
                    let kind = match e {
                        ciborium::de::Error::RecursionLimitExceeded => NlipErrorKind::TooComplex,
                        _ => NlipErrorKind::InvalidEncoding,
                    };
                    NlipError::new(kind, format!("not valid CBOR: {e}"))
                })?;
            Node::from_cbor(value)?
        }
    };
    if node.depth() > limits.max_depth {
        return Err(NlipError::new(
            NlipErrorKind::TooComplex,
            format!("message nests deeper than the limit of {} levels", limits.max_depth),
        ));
    }
    message_from(node, limits)
}

/// Refuses a message holding more values than `max_items` before any of them is built.
fn check_items(bytes: &[u8], encoding: Encoding, max_items: usize) -> Result<(), NlipError> {
    // Every value starts at a byte of its own, in JSON and in CBOR: a message no longer than
    // the limit cannot hold more values than the limit, and most messages are far shorter.
    if bytes.len() <= max_items {
        return Ok(());
    }
    let items = match encoding {
        Encoding::Json => super::items::json(bytes, max_items),
        Encoding::Cbor => super::items::cbor(bytes, max_items),
    };
    if items > max_items {
        return Err(NlipError::new(
            NlipErrorKind::TooLarge,
            format!("message holds more than {max_items} values (nlip.max_items)"),
        ));
    }
    Ok(())
}

/// Refuses a conversation token whose content is longer than `max_bytes`.
fn check_token(sub: &Submessage, index: usize, max_bytes: usize) -> Result<(), NlipError> {
    let length = match &sub.content {
        Content::Json(Value::String(s)) => s.len(),
        Content::Binary(b) => b.len(),
        Content::Json(_) | Content::Raw(_) => 0,
    };
    if sub.is_conversation_token() && length > max_bytes {
        return Err(NlipError::at(
            NlipErrorKind::TooLarge,
            format!("submessages[{index}].content"),
            format!(
                "a conversation token of {length} bytes; the limit is {max_bytes} bytes (nlip.max_conversation_token_bytes)"
            ),
        ));
    }
    Ok(())
}

/// Refuses a conversation token that is not text, and a second one. silpgate keys sessions,
/// quotas and ownership on the token, and an agent reads it too: both must read the same one,
/// so there is exactly one reading of it, or the message is refused.
fn check_one_conversation(subs: &[Submessage]) -> Result<(), NlipError> {
    let mut first: Option<usize> = None;
    for (index, sub) in subs.iter().enumerate().filter(|(_, s)| s.is_conversation_token()) {
        if sub.content.as_str().is_none() {
            let found = match &sub.content {
                Content::Binary(_) => "a byte string",
                Content::Raw(_) => "an object",
                Content::Json(value) => json_kind(value),
            };
            return Err(NlipError::envelope(
                format!("submessages[{index}].content"),
                format!("a conversation token is a string, found {found}"),
            ));
        }
        if let Some(first) = first {
            return Err(NlipError::envelope(
                format!("submessages[{index}]"),
                format!(
                    "a second conversation token (the first is submessages[{first}]); a message belongs to one conversation"
                ),
            ));
        }
        first = Some(index);
    }
    Ok(())
}

/// What kind of JSON value `value` is, for an error message.
fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Writes a message in `encoding`.
pub fn encode(message: &Message, encoding: Encoding) -> Vec<u8> {
    match encoding {
        Encoding::Json => to_json(message).into_bytes(),
        Encoding::Cbor => {
            let mut out = Vec::with_capacity(256);
            ciborium::ser::into_writer(&to_cbor(message), &mut out)
                .expect("writing CBOR to a Vec cannot fail");
            out
        }
    }
}

// ---- the decoded tree ---------------------------------------------------------------------

/// A JSON or CBOR document: JSON's values plus CBOR byte strings. A JSON document is split
/// into nodes only down to the envelope's own levels (the message, its submessage list, each
/// submessage); below them each value stays the tree serde_json built, and is handed over as
/// content or an unknown field as it is, not taken apart and built again. The object content
/// of a `silp-ir` (sub)message is not built into a tree at all: it stays the text it was.
enum Node {
    Json(Value),
    Raw(RawJson),
    Bytes(Vec<u8>),
    Array(Vec<Node>),
    Map(Vec<(String, Node)>),
}

impl Node {
    fn from_cbor(value: ciborium::Value) -> Result<Node, NlipError> {
        use ciborium::Value as C;
        let invalid = |m: String| NlipError::new(NlipErrorKind::InvalidEncoding, m);
        Ok(match value {
            C::Null => Node::Json(Value::Null),
            C::Bool(b) => Node::Json(Value::Bool(b)),
            C::Text(s) => Node::Json(Value::String(s)),
            C::Bytes(b) => Node::Bytes(b),
            C::Integer(i) => {
                let i = i128::from(i);
                let n = i64::try_from(i)
                    .map(Number::from)
                    .or_else(|_| u64::try_from(i).map(Number::from))
                    .map_err(|_| invalid(format!("integer {i} does not fit in 64 bits")))?;
                Node::Json(Value::Number(n))
            }
            C::Float(f) => Node::Json(Value::Number(
                Number::from_f64(f).ok_or_else(|| invalid(format!("float {f} has no JSON spelling")))?,
            )),
            C::Tag(_, inner) => Node::from_cbor(*inner)?,
            C::Array(items) => Node::Array(items.into_iter().map(Node::from_cbor).collect::<Result<_, _>>()?),
            C::Map(entries) => Node::Map(
                entries
                    .into_iter()
                    .map(|(k, v)| match k {
                        C::Text(k) => Ok((k, Node::from_cbor(v)?)),
                        other => Err(invalid(format!("map keys must be text strings, found {other:?}"))),
                    })
                    .collect::<Result<_, _>>()?,
            ),
            other => return Err(invalid(format!("unsupported CBOR item {other:?}"))),
        })
    }

    fn depth(&self) -> usize {
        match self {
            Node::Json(value) => json_depth(value),
            Node::Raw(raw) => raw.depth(),
            Node::Bytes(_) => 0,
            Node::Array(items) => 1 + items.iter().map(Node::depth).max().unwrap_or(0),
            Node::Map(entries) => 1 + entries.iter().map(|(_, v)| v.depth()).max().unwrap_or(0),
        }
    }

    /// As plain JSON; nested byte strings become base64 text.
    fn into_json(self) -> Value {
        match self {
            Node::Json(v) => v,
            Node::Raw(raw) => raw.value(),
            Node::Bytes(b) => Value::String(BASE64.encode(b)),
            Node::Array(items) => Value::Array(items.into_iter().map(Node::into_json).collect()),
            Node::Map(entries) => {
                Value::Object(entries.into_iter().map(|(k, v)| (k, v.into_json())).collect())
            }
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            Node::Json(value) => json_kind(value),
            Node::Array(_) => "an array",
            Node::Map(_) | Node::Raw(_) => "an object",
            Node::Bytes(_) => "a byte string",
        }
    }
}

/// Reads a JSON message straight into its levels: the message's fields, and in a
/// `submessages` array each submessage's fields, as entries in the order written, their
/// values as `serde_json` trees. Building those levels as maps first, only to take them apart
/// again, cost a hash and an allocation per field; and a map keeps one of two fields of the
/// same name where the entries keep both, so a message that names a field twice is refused,
/// as in CBOR, instead of read as whichever came last. Anything that is not the level
/// expected is kept whole, for the error that names what it is.
#[derive(Clone, Copy)]
enum JsonLevel {
    Message,
    Submessages,
    Submessage,
}

impl<'de> DeserializeSeed<'de> for JsonLevel {
    type Value = Node;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Node, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for JsonLevel {
    type Value = Node;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("an NLIP message")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Node, A::Error> {
        if let JsonLevel::Submessages = self {
            return Value::deserialize(MapAccessDeserializer::new(map)).map(Node::Json);
        }
        let mut entries = Vec::with_capacity(map.size_hint().unwrap_or(6));
        // The subformat is usually written before the content (the SDK's order): a `silp-ir`
        // content that follows its subformat is kept raw. One written first is built as a tree,
        // which reads the same, only slower.
        let mut holds_ir = false;
        while let Some(key) = map.next_key::<String>()? {
            let node = match self {
                JsonLevel::Message if key.eq_ignore_ascii_case("submessages") => {
                    map.next_value_seed(JsonLevel::Submessages)?
                }
                _ if holds_ir && key.eq_ignore_ascii_case("content") => raw_content(map.next_value()?)?,
                _ => {
                    let value: Value = map.next_value()?;
                    if key.eq_ignore_ascii_case("subformat") {
                        holds_ir = value.as_str().is_some_and(|s| s.eq_ignore_ascii_case("silp-ir"));
                    }
                    Node::Json(value)
                }
            };
            entries.push((key, node));
        }
        Ok(Node::Map(entries))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Node, A::Error> {
        let JsonLevel::Submessages = self else {
            return Value::deserialize(SeqAccessDeserializer::new(seq)).map(Node::Json);
        };
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(2));
        while let Some(item) = seq.next_element_seed(JsonLevel::Submessage)? {
            items.push(item);
        }
        Ok(Node::Array(items))
    }

    fn visit_bool<E>(self, v: bool) -> Result<Node, E> {
        Ok(Node::Json(Value::Bool(v)))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Node, E> {
        Ok(Node::Json(Value::from(v)))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Node, E> {
        Ok(Node::Json(Value::from(v)))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Node, E> {
        Ok(Node::Json(Value::from(v)))
    }

    fn visit_str<E>(self, v: &str) -> Result<Node, E> {
        Ok(Node::Json(Value::String(v.to_owned())))
    }

    fn visit_unit<E>(self) -> Result<Node, E> {
        Ok(Node::Json(Value::Null))
    }
}

/// A `silp-ir` content read raw: kept so when it is an object that can be read back (see
/// [`RawJson`]); anything else is built into the tree it would have been.
fn raw_content<E: serde::de::Error>(raw: Box<RawValue>) -> Result<Node, E> {
    let raw = if raw.get().starts_with('{') {
        match RawJson::new(raw) {
            Ok(raw) => return Ok(Node::Raw(raw)),
            Err(raw) => raw,
        }
    } else {
        raw
    };
    serde_json::from_str(raw.get()).map(Node::Json).map_err(E::custom)
}

/// How deep arrays and objects nest in `value`, counted as [`Node::depth`] counts them.
fn json_depth(value: &Value) -> usize {
    match value {
        Value::Array(items) => 1 + items.iter().map(json_depth).max().unwrap_or(0),
        Value::Object(map) => 1 + map.values().map(json_depth).max().unwrap_or(0),
        Value::Null | Value::Bool(_) | Value::Number(_) | Value::String(_) => 0,
    }
}

// ---- message from tree --------------------------------------------------------------------

/// The fields of one message level, by lower-cased known name; unknown fields kept as-is.
struct Fields {
    known: [Option<(String, Node)>; 7],
    extra: Map<String, Value>,
}

const KNOWN: [&str; 7] = ["messagetype", "format", "subformat", "content", "label", "submessages", "control"];

impl Fields {
    fn split(entries: Vec<(String, Node)>, path: &str) -> Result<Fields, NlipError> {
        let mut fields = Fields { known: Default::default(), extra: Map::new() };
        for (key, node) in entries {
            match KNOWN.iter().position(|k| k.eq_ignore_ascii_case(&key)) {
                Some(i) => {
                    if let Some((first, _)) = &fields.known[i] {
                        return Err(NlipError::envelope(
                            join(path, KNOWN[i]),
                            format!("field given twice (as '{first}' and '{key}'); field names ignore case"),
                        ));
                    }
                    fields.known[i] = Some((key, node));
                }
                None => {
                    fields.extra.insert(key, node.into_json());
                }
            }
        }
        Ok(fields)
    }

    fn take(&mut self, name: &str) -> Option<Node> {
        let i = KNOWN.iter().position(|k| *k == name).expect("known field");
        self.known[i]
            .take()
            .map(|(_, node)| node)
            .filter(|n| !matches!(n, Node::Json(Value::Null)) || name == "content")
    }

    fn required_string(&mut self, name: &str, path: &str) -> Result<String, NlipError> {
        match self.take(name) {
            Some(Node::Json(Value::String(s))) => Ok(s),
            Some(other) => Err(NlipError::envelope(
                join(path, name),
                format!("must be a string, found {}", other.kind()),
            )),
            None => Err(NlipError::envelope(join(path, name), format!("missing required field '{name}'"))),
        }
    }

    fn optional_string(&mut self, name: &str, path: &str) -> Result<Option<String>, NlipError> {
        match self.take(name) {
            None => Ok(None),
            Some(Node::Json(Value::String(s))) => Ok(Some(s)),
            Some(other) => Err(NlipError::envelope(
                join(path, name),
                format!("must be a string, found {}", other.kind()),
            )),
        }
    }
}

fn join(path: &str, field: &str) -> String {
    if path.is_empty() { field.to_owned() } else { format!("{path}.{field}") }
}

fn message_from(node: Node, limits: &Limits) -> Result<Message, NlipError> {
    let Node::Map(entries) = node else {
        return Err(NlipError::new(
            NlipErrorKind::InvalidEnvelope,
            format!("an NLIP message is an object, found {}", node.kind()),
        ));
    };
    let mut fields = Fields::split(entries, "")?;
    let mut messagetype = fields.optional_string("messagetype", "")?;
    // The legacy boolean `control` becomes `messagetype: control`.
    match fields.take("control") {
        Some(Node::Json(Value::Bool(true))) if messagetype.is_none() => {
            messagetype = Some("control".to_owned())
        }
        None | Some(Node::Json(Value::Bool(_))) => {}
        Some(other) => {
            return Err(NlipError::envelope("control", format!("must be a boolean, found {}", other.kind())));
        }
    }
    let (format, subformat, content) = body(&mut fields, "")?;
    let label = fields.optional_string("label", "")?;
    let submessages = match fields.take("submessages") {
        None => None,
        Some(Node::Array(items)) => {
            if items.len() > limits.max_submessages {
                return Err(NlipError::at(
                    NlipErrorKind::TooComplex,
                    "submessages",
                    format!("{} submessages; the limit is {}", items.len(), limits.max_submessages),
                ));
            }
            let subs: Vec<Submessage> = items
                .into_iter()
                .enumerate()
                .map(|(i, n)| submessage_from(n, i))
                .collect::<Result<_, _>>()?;
            for (i, sub) in subs.iter().enumerate() {
                check_token(sub, i, limits.max_conversation_token_bytes)?;
            }
            check_one_conversation(&subs)?;
            Some(subs)
        }
        Some(other) => {
            return Err(NlipError::envelope(
                "submessages",
                format!("must be an array, found {}", other.kind()),
            ));
        }
    };
    Ok(Message { messagetype, format, subformat, content, label, submessages, extra: fields.extra })
}

fn submessage_from(node: Node, index: usize) -> Result<Submessage, NlipError> {
    let path = format!("submessages[{index}]");
    let Node::Map(entries) = node else {
        return Err(NlipError::envelope(path, format!("a submessage is an object, found {}", node.kind())));
    };
    let mut fields = Fields::split(entries, &path)?;
    // NLIP submessages are one flat list; nested ones would reach agents without the
    // validation every other payload gets, so they are refused rather than kept as data.
    if fields.take("submessages").is_some() {
        return Err(NlipError::envelope(
            join(&path, "submessages"),
            "a submessage cannot hold submessages of its own; put every submessage in the message's list",
        ));
    }
    // A submessage has no messagetype or control of its own: keep them as data.
    for name in ["messagetype", "control"] {
        let i = KNOWN.iter().position(|k| *k == name).expect("known field");
        if let Some((key, node)) = fields.known[i].take() {
            fields.extra.insert(key, node.into_json());
        }
    }
    let (format, subformat, content) = body(&mut fields, &path)?;
    let label = fields.optional_string("label", &path)?;
    Ok(Submessage { format, subformat, content, label, extra: fields.extra })
}

/// `format`, `subformat` and `content`, shared by a message and a submessage.
fn body(fields: &mut Fields, path: &str) -> Result<(Format, String, Content), NlipError> {
    let format_text = fields.required_string("format", path)?;
    let format = Format::parse(&format_text).ok_or_else(|| {
        NlipError::envelope(
            join(path, "format"),
            format!(
                "unknown format '{format_text}'; expected one of text, token, structured, binary, location, generic (or the legacy error)"
            ),
        )
    })?;
    let mut subformat = fields.required_string("subformat", path)?;
    let content = match fields.take("content") {
        None => return Err(NlipError::envelope(join(path, "content"), "missing required field 'content'")),
        Some(Node::Bytes(b)) => Content::Binary(b),
        // Base64 text under a `;base64` subformat is binary content; text that does not decode
        // (a truncated example, say) is passed on as the text it is.
        Some(Node::Json(Value::String(s))) if has_base64_marker(&subformat) => {
            match BASE64.decode(s.as_bytes()) {
                Ok(bytes) => {
                    subformat.truncate(subformat.len() - BASE64_MARKER.len());
                    Content::Binary(bytes)
                }
                Err(_) => Content::Json(Value::String(s)),
            }
        }
        Some(Node::Raw(raw)) => Content::Raw(raw),
        Some(node) => Content::Json(node.into_json()),
    };
    Ok((format, subformat, content))
}

fn has_base64_marker(subformat: &str) -> bool {
    subformat.len() >= BASE64_MARKER.len()
        && subformat.as_bytes()[subformat.len() - BASE64_MARKER.len()..]
            .eq_ignore_ascii_case(BASE64_MARKER.as_bytes())
}

// ---- writing ------------------------------------------------------------------------------

/// The canonical JSON text of a message.
pub fn to_json(message: &Message) -> String {
    let mut out = String::with_capacity(256);
    out.push('{');
    if let Some(t) = &message.messagetype {
        out.push_str("\"messagetype\":");
        json_text::write_str(&mut out, t);
        out.push(',');
    }
    write_body(&mut out, message.format, &message.subformat, &message.content);
    if let Some(label) = &message.label {
        out.push_str(",\"label\":");
        json_text::write_str(&mut out, label);
    }
    if let Some(subs) = &message.submessages {
        out.push_str(",\"submessages\":[");
        for (i, s) in subs.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push('{');
            write_body(&mut out, s.format, &s.subformat, &s.content);
            if let Some(label) = &s.label {
                out.push_str(",\"label\":");
                json_text::write_str(&mut out, label);
            }
            json_text::write_extras(&mut out, &s.extra, Style::CANONICAL);
            out.push('}');
        }
        out.push(']');
    }
    json_text::write_extras(&mut out, &message.extra, Style::CANONICAL);
    out.push('}');
    out
}

fn write_body(out: &mut String, format: Format, subformat: &str, content: &Content) {
    out.push_str("\"format\":\"");
    out.push_str(format.as_str());
    out.push_str("\",\"subformat\":");
    match content {
        Content::Json(value) => {
            json_text::write_str(out, subformat);
            out.push_str(",\"content\":");
            json_text::write_value(out, value, Style::CANONICAL);
        }
        // Written canonical like any other content, not as the sender spaced it.
        Content::Raw(raw) => {
            json_text::write_str(out, subformat);
            out.push_str(",\"content\":");
            json_text::write_value(out, &raw.value(), Style::CANONICAL);
        }
        Content::Binary(bytes) => {
            json_text::write_str(out, &format!("{subformat}{BASE64_MARKER}"));
            out.push_str(",\"content\":\"");
            out.push_str(&BASE64.encode(bytes));
            out.push('"');
        }
    }
}

fn to_cbor(message: &Message) -> ciborium::Value {
    use ciborium::Value as C;
    let mut entries = Vec::with_capacity(7);
    if let Some(t) = &message.messagetype {
        entries.push((C::Text("messagetype".into()), C::Text(t.clone())));
    }
    cbor_body(&mut entries, message.format, &message.subformat, &message.content);
    if let Some(label) = &message.label {
        entries.push((C::Text("label".into()), C::Text(label.clone())));
    }
    if let Some(subs) = &message.submessages {
        let items = subs
            .iter()
            .map(|s| {
                let mut e = Vec::with_capacity(4);
                cbor_body(&mut e, s.format, &s.subformat, &s.content);
                if let Some(label) = &s.label {
                    e.push((C::Text("label".into()), C::Text(label.clone())));
                }
                e.extend(s.extra.iter().map(|(k, v)| (C::Text(k.clone()), json_to_cbor(v))));
                C::Map(e)
            })
            .collect();
        entries.push((C::Text("submessages".into()), C::Array(items)));
    }
    entries.extend(message.extra.iter().map(|(k, v)| (C::Text(k.clone()), json_to_cbor(v))));
    C::Map(entries)
}

fn cbor_body(
    entries: &mut Vec<(ciborium::Value, ciborium::Value)>,
    format: Format,
    subformat: &str,
    content: &Content,
) {
    use ciborium::Value as C;
    entries.push((C::Text("format".into()), C::Text(format.as_str().into())));
    entries.push((C::Text("subformat".into()), C::Text(subformat.into())));
    let content = match content {
        Content::Json(v) => json_to_cbor(v),
        Content::Raw(raw) => json_to_cbor(&raw.value()),
        Content::Binary(b) => C::Bytes(b.clone()),
    };
    entries.push((C::Text("content".into()), content));
}

fn json_to_cbor(value: &Value) -> ciborium::Value {
    use ciborium::Value as C;
    match value {
        Value::Null => C::Null,
        Value::Bool(b) => C::Bool(*b),
        Value::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => C::Integer(i.into()),
            (None, Some(u)) => C::Integer(u.into()),
            _ => C::Float(n.as_f64().unwrap_or_default()),
        },
        Value::String(s) => C::Text(s.clone()),
        Value::Array(items) => C::Array(items.iter().map(json_to_cbor).collect()),
        Value::Object(map) => {
            C::Map(map.iter().map(|(k, v)| (C::Text(k.clone()), json_to_cbor(v))).collect())
        }
    }
}
