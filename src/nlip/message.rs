//! The NLIP message model of ECMA-430: a first submessage (`messagetype`, `format`,
//! `subformat`, `content`) with an ordered list of submessages. Unknown fields are kept, in
//! their original spelling, so that a forwarded message loses nothing.

use serde_json::{Map, Value};
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

    pub fn as_str(self) -> &'static str {
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
    pub fn parse(s: &str) -> Option<Format> {
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
#[derive(Debug, Clone, PartialEq)]
pub enum Content {
    Json(Value),
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

    pub fn with_label(mut self, label: impl Into<String>) -> Self {
        self.label = Some(label.into());
        self
    }

    pub fn is_token(&self) -> bool {
        self.format == Format::Token
    }

    /// A conversation token: subformat `conversation` or `conversation_<suffix>` (§6.2.1).
    pub fn is_conversation_token(&self) -> bool {
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
    pub fn text(content: impl Into<String>) -> Self {
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
    pub fn tokens(&self) -> impl Iterator<Item = &Submessage> {
        self.submessages().iter().filter(|s| s.is_token())
    }
}
