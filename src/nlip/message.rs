//! The NLIP message model of ECMA-430: a first submessage (`messagetype`, `format`,
//! `subformat`, `content`) with an ordered list of submessages. Unknown fields are kept, in
//! their original spelling, so that a forwarded message loses nothing.

use serde_json::value::RawValue;
use serde_json::{Map, Value};
use std::borrow::Cow;
use std::fmt;

/// The `format` values of ECMA-430 Table 1, plus the drafts' `error`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Format {
    Text,
    Token,
    Structured,
    Binary,
    Location,
    Generic,
    /// Removed from ECMA-430 before publication; still sent by older peers and the SDK.
    Error,
}

impl Format {
    pub const ALL: [Format; 7] = [
        Format::Text,
        Format::Token,
        Format::Structured,
        Format::Binary,
        Format::Location,
        Format::Generic,
        Format::Error,
    ];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Format::Text => "text",
            Format::Token => "token",
            Format::Structured => "structured",
            Format::Binary => "binary",
            Format::Location => "location",
            Format::Generic => "generic",
            Format::Error => "error",
        }
    }

    /// Case-insensitive, as ECMA-430 §5 says values are.
    pub(crate) fn parse(s: &str) -> Option<Format> {
        Format::ALL.into_iter().find(|f| f.as_str().eq_ignore_ascii_case(s))
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A `content` value: any JSON value, or raw bytes (a CBOR byte string; base64 with a
/// `;base64` subformat marker in JSON).
#[derive(Debug, Clone)]
pub enum Content {
    Json(Value),
    /// A JSON object as the sender wrote it, not yet parsed: the codec keeps a `silp-ir`
    /// payload so, because the gateway reads it straight into an IR and a tree built first
    /// would only be dropped. Equal to the [`Content::Json`] of the same value.
    Raw(RawJson),
    Binary(Vec<u8>),
}

impl Content {
    pub fn text(s: impl Into<String>) -> Self {
        Content::Json(Value::String(s.into()))
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Content::Json(Value::String(s)) => Some(s),
            _ => None,
        }
    }

    /// The content as a JSON value: as held, or parsed from its raw text; `None` for binary.
    pub(crate) fn json(&self) -> Option<Cow<'_, Value>> {
        match self {
            Content::Json(value) => Some(Cow::Borrowed(value)),
            Content::Raw(raw) => Some(Cow::Owned(raw.value())),
            Content::Binary(_) => None,
        }
    }
}

impl PartialEq for Content {
    fn eq(&self, other: &Content) -> bool {
        match (self, other) {
            (Content::Binary(a), Content::Binary(b)) => a == b,
            (Content::Binary(_), _) | (_, Content::Binary(_)) => false,
            (Content::Json(a), Content::Json(b)) => a == b,
            _ => self.json() == other.json(),
        }
    }
}

/// JSON text that serde_json has read in full once, kept as written, and shallow enough to be
/// read into a value again: serde_json checks the text of a `RawValue` without its recursion
/// limit, but builds a value within it.
#[derive(Debug, Clone)]
pub struct RawJson {
    raw: Box<RawValue>,
    depth: usize,
}

impl RawJson {
    /// Deepest nesting kept raw, well inside serde_json's recursion limit of 128.
    pub(crate) const MAX_DEPTH: usize = 100;

    /// `raw` kept, or given back when it nests deeper than [`RawJson::MAX_DEPTH`].
    pub fn new(raw: Box<RawValue>) -> Result<RawJson, Box<RawValue>> {
        let depth = text_depth(raw.get());
        if depth <= Self::MAX_DEPTH { Ok(RawJson { raw, depth }) } else { Err(raw) }
    }

    pub fn get(&self) -> &str {
        self.raw.get()
    }

    /// How deep arrays and objects nest in it (a scalar is 0, `{}` is 1).
    pub(crate) fn depth(&self) -> usize {
        self.depth
    }

    pub(crate) fn value(&self) -> Value {
        serde_json::from_str(self.raw.get()).expect("valid JSON within the recursion limit reads back")
    }
}

/// How deep arrays and objects nest in valid JSON `text`: brackets outside strings.
fn text_depth(text: &str) -> usize {
    let (mut depth, mut deepest) = (0usize, 0usize);
    let mut bytes = text.bytes();
    while let Some(b) = bytes.next() {
        match b {
            b'{' | b'[' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b'}' | b']' => depth = depth.saturating_sub(1),
            b'"' => {
                while let Some(b) = bytes.next() {
                    match b {
                        b'\\' => {
                            bytes.next();
                        }
                        b'"' => break,
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    deepest
}

/// One submessage.
#[derive(Debug, Clone, PartialEq)]
pub struct Submessage {
    pub format: Format,
    pub subformat: String,
    pub content: Content,
    pub label: Option<String>,
    /// Unknown fields, original key spelling, arrival order.
    pub extra: Map<String, Value>,
}

/// One NLIP message.
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    pub messagetype: Option<String>,
    pub format: Format,
    pub subformat: String,
    pub content: Content,
    /// Not in the standard; the Python SDK has it.
    pub label: Option<String>,
    /// `None` when the field was absent (or null); `Some(vec![])` is kept as `[]`.
    pub submessages: Option<Vec<Submessage>>,
    pub extra: Map<String, Value>,
}

impl Submessage {
    pub fn new(format: Format, subformat: impl Into<String>, content: Content) -> Self {
        Submessage { format, subformat: subformat.into(), content, label: None, extra: Map::new() }
    }

    pub(crate) fn with_label(mut self, label: impl Into<String>) -> Self {
        self.label = Some(label.into());
        self
    }

    pub(crate) fn is_token(&self) -> bool {
        self.format == Format::Token
    }

    /// A conversation token: subformat `conversation` or `conversation_<suffix>` (§6.2.1).
    pub(crate) fn is_conversation_token(&self) -> bool {
        self.is_token() && has_prefix_word(&self.subformat, "conversation")
    }

    /// An authentication token: `authentication[_<suffix>]`, or the SDK's `authorization`.
    pub fn is_authentication_token(&self) -> bool {
        self.is_token()
            && (has_prefix_word(&self.subformat, "authentication")
                || has_prefix_word(&self.subformat, "authorization"))
    }
}

/// `word` or `word_<anything>`, case-insensitively.
fn has_prefix_word(s: &str, word: &str) -> bool {
    s.len() >= word.len()
        && s.as_bytes()[..word.len()].eq_ignore_ascii_case(word.as_bytes())
        && (s.len() == word.len() || s.as_bytes()[word.len()] == b'_')
}

impl Message {
    pub fn new(format: Format, subformat: impl Into<String>, content: Content) -> Self {
        Message {
            messagetype: None,
            format,
            subformat: subformat.into(),
            content,
            label: None,
            submessages: None,
            extra: Map::new(),
        }
    }

    /// An English text message, as the SDK's `create_text` makes.
    pub(crate) fn text(content: impl Into<String>) -> Self {
        Message::new(Format::Text, "english", Content::text(content))
    }

    pub fn with_messagetype(mut self, messagetype: impl Into<String>) -> Self {
        self.messagetype = Some(messagetype.into());
        self
    }

    pub fn push(&mut self, submessage: Submessage) {
        self.submessages.get_or_insert_with(Vec::new).push(submessage);
    }

    pub fn submessages(&self) -> &[Submessage] {
        self.submessages.as_deref().unwrap_or_default()
    }

    /// True for `messagetype: control` (any capitalisation).
    pub fn is_control(&self) -> bool {
        self.messagetype.as_deref().is_some_and(|t| t.eq_ignore_ascii_case("control"))
    }

    /// True for an error message: `messagetype: error` or the drafts' `format: error`.
    pub fn is_error(&self) -> bool {
        self.format == Format::Error
            || self.messagetype.as_deref().is_some_and(|t| t.eq_ignore_ascii_case("error"))
    }

    /// The content of the first conversation token, the conversation this message belongs to.
    pub fn conversation_token(&self) -> Option<&str> {
        self.submessages().iter().find(|s| s.is_conversation_token()).and_then(|s| s.content.as_str())
    }

    /// Every token submessage, in order: what a reply must echo (§6.2).
    pub(crate) fn tokens(&self) -> impl Iterator<Item = &Submessage> {
        self.submessages().iter().filter(|s| s.is_token())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(text: &str) -> RawJson {
        RawJson::new(RawValue::from_string(text.to_owned()).unwrap()).unwrap()
    }

    #[test]
    fn raw_depth_counts_brackets_outside_strings() {
        assert_eq!(raw("1").depth(), 0);
        assert_eq!(raw("{}").depth(), 1);
        assert_eq!(raw(r#"{"a":[{"b":"]}[[\"{"},[]]}"#).depth(), 3);
    }

    #[test]
    fn json_nested_past_the_limit_is_not_kept_raw() {
        let deep = format!("{}{}", "[".repeat(RawJson::MAX_DEPTH + 1), "]".repeat(RawJson::MAX_DEPTH + 1));
        assert!(RawJson::new(RawValue::from_string(deep).unwrap()).is_err());
        let limit = format!("{}{}", "[".repeat(RawJson::MAX_DEPTH), "]".repeat(RawJson::MAX_DEPTH));
        assert_eq!(raw(&limit).value().to_string(), limit);
    }

    #[test]
    fn raw_content_equals_the_same_value_held_parsed() {
        let text = r#"{ "intent": "!A", "n": [1, 2.5] }"#;
        let parsed: Value = serde_json::from_str(text).unwrap();
        assert_eq!(Content::Raw(raw(text)), Content::Json(parsed.clone()));
        assert_ne!(Content::Raw(raw(text)), Content::Json(Value::Null));
        assert_eq!(Content::Raw(raw(text)).json().as_deref(), Some(&parsed));
    }
}
