//! Input sanitising (draft §8.1): invisible characters are stripped and identifiers are mapped
//! to ASCII through Unicode compatibility normalisation and the UTS #39 confusables table.
//! Nothing is changed silently: every strip and every mapping becomes a [`Notice`].
//!
//! "Invisible" is wider than the draft's four zero-width characters: it is every
//! default-ignorable code point (Unicode's `Default_Ignorable_Code_Point`), which covers the
//! zero-width characters, every bidi control (embeddings, overrides, isolates, marks, the
//! Arabic letter mark), the soft hyphen, both variation-selector blocks, the tag characters,
//! the invisible operators, the Hangul fillers and the code points reserved as
//! default-ignorable. The data is unicode-security's (the table UTS #39's skeleton drops), not a
//! hand-written list.

use super::error::{ErrorCode, SilpError};
use serde_json::{Map, Value};
use std::borrow::Cow;
use std::fmt::{self, Write as _};
use unicode_normalization::UnicodeNormalization;
use unicode_security::confusable_detection::skeleton;

pub use crate::util::unicode::is_invisible;

/// Something the sanitiser changed, reported to the caller (and counted by operators: it is a
/// security signal).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notice {
    /// An invisible character was removed at byte `offset` of the input text, or, for an IR
    /// payload, at byte `offset` of the string at the JSON path `field` (`entities[0].value`;
    /// an object key's notice names the member, `entities[0].note (key)`).
    InvisibleStripped { ch: char, offset: usize, field: Option<String> },
    /// An identifier with look-alike characters was read as its ASCII skeleton.
    HomoglyphMapped { from: String, to: String, offset: usize },
}

impl fmt::Display for Notice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Notice::InvisibleStripped { ch, offset, field } => {
                write!(f, "stripped invisible character U+{:04X} at byte {offset}", *ch as u32)?;
                match field {
                    Some(field) => write!(f, " of {field}"),
                    None => Ok(()),
                }
            }
            Notice::HomoglyphMapped { from, to, offset } => {
                write!(
                    f,
                    "identifier '{from}' at byte {offset} contains look-alike characters; read as '{to}'"
                )
            }
        }
    }
}

/// A text with its invisible characters removed, and the way back to offsets in the original.
#[derive(Debug)]
pub(crate) struct Stripped<'a> {
    pub text: Cow<'a, str>,
    /// `(offset in stripped text, bytes removed before it)`, one entry per removal.
    shifts: Vec<(usize, usize)>,
}

impl<'a> Stripped<'a> {
    /// The text as it is, for when sanitising is off.
    pub(crate) fn unchanged(text: &'a str) -> Self {
        Stripped { text: Cow::Borrowed(text), shifts: Vec::new() }
    }

    /// The original offset of a byte offset in the stripped text.
    pub(crate) fn original_offset(&self, offset: usize) -> usize {
        let i = self.shifts.partition_point(|(at, _)| *at <= offset);
        offset + if i == 0 { 0 } else { self.shifts[i - 1].1 }
    }
}

/// Removes every invisible character, recording a notice for each.
pub(crate) fn strip_invisible<'a>(text: &'a str, notices: &mut Vec<Notice>) -> Stripped<'a> {
    let first = if text.is_ascii() { None } else { text.char_indices().find(|(_, c)| is_invisible(*c)) };
    let Some((first, _)) = first else {
        return Stripped { text: Cow::Borrowed(text), shifts: Vec::new() };
    };
    let mut out = String::with_capacity(text.len());
    out.push_str(&text[..first]);
    let mut shifts = Vec::new();
    let mut removed = 0;
    for (i, c) in text[first..].char_indices() {
        if is_invisible(c) {
            notices.push(Notice::InvisibleStripped { ch: c, offset: first + i, field: None });
            removed += c.len_utf8();
            shifts.push((out.len(), removed));
        } else {
            out.push(c);
        }
    }
    Stripped { text: Cow::Owned(out), shifts }
}

/// Strips every invisible character from the object keys and string values of a JSON value
/// (an IR payload, which has no text of its own to strip), recording a notice with the JSON
/// path of each. `None` when there was nothing to strip.
///
/// # Errors
/// `decode_failed` when a key, once stripped, equals another key of its object: which of the
/// two members is meant cannot be decided.
pub(crate) fn strip_invisible_json(
    value: &Value,
    notices: &mut Vec<Notice>,
) -> Result<Option<Value>, SilpError> {
    if !has_invisible(value) {
        return Ok(None);
    }
    strip_value(value, &mut String::new(), notices).map(Some)
}

fn has_invisible(value: &Value) -> bool {
    let visible = |s: &str| s.is_ascii() || !s.chars().any(is_invisible);
    match value {
        Value::String(s) => !visible(s),
        Value::Array(items) => items.iter().any(has_invisible),
        Value::Object(map) => map.iter().any(|(k, v)| !visible(k) || has_invisible(v)),
        Value::Null | Value::Bool(_) | Value::Number(_) => false,
    }
}

fn strip_value(value: &Value, path: &mut String, notices: &mut Vec<Notice>) -> Result<Value, SilpError> {
    Ok(match value {
        Value::String(s) => Value::String(strip_string(s, path, notices)),
        Value::Array(items) => {
            let mut out = Vec::with_capacity(items.len());
            for (i, item) in items.iter().enumerate() {
                let len = path.len();
                let _ = write!(path, "[{i}]");
                out.push(strip_value(item, path, notices)?);
                path.truncate(len);
            }
            Value::Array(out)
        }
        Value::Object(map) => {
            let mut out = Map::with_capacity(map.len());
            for (key, item) in map {
                let len = path.len();
                if !path.is_empty() {
                    path.push('.');
                }
                let stripped = strip_string(key, &format!("{path}{} (key)", key_shown(key)), notices);
                path.push_str(&stripped);
                if out.contains_key(&stripped) {
                    return Err(SilpError::new(
                        ErrorCode::DecodeFailed,
                        format!("two members are named '{path}' once invisible characters are stripped"),
                    ));
                }
                let item = strip_value(item, path, notices)?;
                path.truncate(len);
                out.insert(stripped, item);
            }
            Value::Object(out)
        }
        Value::Null | Value::Bool(_) | Value::Number(_) => value.clone(),
    })
}

/// A key as a notice shows it: stripped, so that the notice itself carries nothing invisible.
fn key_shown(key: &str) -> String {
    key.chars().filter(|c| !is_invisible(*c)).collect()
}

fn strip_string(s: &str, field: &str, notices: &mut Vec<Notice>) -> String {
    if s.is_ascii() {
        return s.to_owned();
    }
    let mut out = String::with_capacity(s.len());
    for (i, c) in s.char_indices() {
        if is_invisible(c) {
            notices.push(Notice::InvisibleStripped { ch: c, offset: i, field: Some(field.to_owned()) });
        } else {
            out.push(c);
        }
    }
    out
}

/// Maps an identifier to ASCII. Compatibility forms (long s, ligatures, full-width letters) are
/// normalised with NFKC; the remaining non-ASCII characters are replaced by their confusable
/// skeleton (Cyrillic `а` -> `a`, dotless `ı` -> `i`). Returns the first character that has no
/// ASCII reading when the mapping fails.
pub(crate) fn ascii_identifier(raw: &str) -> Result<Cow<'_, str>, char> {
    if raw.is_ascii() {
        return Ok(Cow::Borrowed(raw));
    }
    let mut out = String::with_capacity(raw.len());
    for c in raw.nfkc() {
        if c.is_ascii() {
            out.push(c);
            continue;
        }
        let mut buf = [0u8; 4];
        let mapped: String = skeleton(c.encode_utf8(&mut buf)).collect();
        if mapped.is_empty() || !mapped.is_ascii() {
            return Err(c);
        }
        out.push_str(&mapped);
    }
    Ok(Cow::Owned(out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn identifiers_map_to_ascii() {
        assert_eq!(ascii_identifier("cancel").unwrap(), "cancel");
        assert_eq!(ascii_identifier("с\u{0430}ncel").unwrap(), "cancel"); // Cyrillic es, a
        assert_eq!(ascii_identifier("ſtart").unwrap(), "start"); // long s
        assert_eq!(ascii_identifier("swıtch").unwrap(), "switch"); // dotless i
        assert_eq!(ascii_identifier("ﬁx").unwrap(), "fix"); // ligature
        assert_eq!(ascii_identifier("straße"), Err('ß'));
        assert_eq!(ascii_identifier("北京"), Err('北'));
    }

    #[test]
    fn stripping_keeps_a_map_to_original_offsets() {
        let mut notices = Vec::new();
        let s = strip_invisible("\u{FEFF}can\u{200B}cel(x)", &mut notices);
        assert_eq!(s.text, "cancel(x)");
        assert_eq!(notices.len(), 2);
        assert_eq!(s.original_offset(0), 3);
        assert_eq!(s.original_offset(3), 9);
        assert_eq!(s.original_offset(6), 12);
    }

    /// Unicode's `Default_Ignorable_Code_Point` (DerivedCoreProperties.txt, unchanged from
    /// Unicode 15 to 17 and in unicode-security's 18.0 data).
    const DEFAULT_IGNORABLE: &[(u32, u32)] = &[
        (0x00AD, 0x00AD),
        (0x034F, 0x034F),
        (0x061C, 0x061C),
        (0x115F, 0x1160),
        (0x17B4, 0x17B5),
        (0x180B, 0x180F),
        (0x200B, 0x200F),
        (0x202A, 0x202E),
        (0x2060, 0x206F),
        (0x3164, 0x3164),
        (0xFE00, 0xFE0F),
        (0xFEFF, 0xFEFF),
        (0xFFA0, 0xFFA0),
        (0xFFF0, 0xFFF8),
        (0x1BCA0, 0x1BCA3),
        (0x1D173, 0x1D17A),
        (0xE0000, 0xE0FFF),
    ];

    /// Unicode's `Bidi_Control` (PropList.txt).
    const BIDI_CONTROL: &[(u32, u32)] =
        &[(0x061C, 0x061C), (0x200E, 0x200F), (0x202A, 0x202E), (0x2066, 0x2069)];

    fn in_table(table: &[(u32, u32)], c: char) -> bool {
        table.iter().any(|(lo, hi)| (*lo..=*hi).contains(&(c as u32)))
    }

    #[test]
    fn invisible_is_exactly_default_ignorable_and_covers_every_bidi_control() {
        let mut wrong = Vec::new();
        for c in (0..=0x10FFFF).filter_map(char::from_u32) {
            if is_invisible(c) != in_table(DEFAULT_IGNORABLE, c) {
                wrong.push(format!("U+{:04X}", c as u32));
            }
            if in_table(BIDI_CONTROL, c) {
                assert!(is_invisible(c), "bidi control U+{:04X}", c as u32);
            }
        }
        assert!(wrong.is_empty(), "disagree with Default_Ignorable_Code_Point: {wrong:?}");
        for draft in ['\u{200B}', '\u{200C}', '\u{200D}', '\u{FEFF}'] {
            assert!(is_invisible(draft));
        }
        for visible in ['a', ' ', '\u{A0}', 'é', '北', '\u{2028}', '\u{0600}', '\u{FFF9}', '\u{1F600}'] {
            assert!(!is_invisible(visible), "U+{:04X}", visible as u32);
        }
    }

    #[test]
    fn json_strings_and_keys_are_stripped_with_their_paths() {
        let value = json!({
            "intent": "!CAN\u{202E}CEL",
            "entities": [{"id": "act", "value": "a\u{E0041}b\u{AD}", "no\u{2066}te": [1, "\u{FE0F}x"]}],
            "meta": {"req_id": "abcd"},
        });
        let mut notices = Vec::new();
        let stripped = strip_invisible_json(&value, &mut notices).unwrap().expect("changed");
        assert_eq!(
            stripped,
            json!({
                "intent": "!CANCEL",
                "entities": [{"id": "act", "value": "ab", "note": [1, "x"]}],
                "meta": {"req_id": "abcd"},
            })
        );
        let shown: Vec<String> = notices.iter().map(ToString::to_string).collect();
        assert_eq!(
            shown,
            [
                "stripped invisible character U+202E at byte 4 of intent",
                "stripped invisible character U+E0041 at byte 1 of entities[0].value",
                "stripped invisible character U+00AD at byte 6 of entities[0].value",
                "stripped invisible character U+2066 at byte 2 of entities[0].note (key)",
                "stripped invisible character U+FE0F at byte 0 of entities[0].note[1]",
            ]
        );

        let mut notices = Vec::new();
        assert!(
            strip_invisible_json(&json!({"intent": "!CANCEL", "x": ["北京"]}), &mut notices)
                .unwrap()
                .is_none()
        );
        assert!(notices.is_empty());

        let clash = json!({"intent": "!CANCEL", "meta": {"req_id": "abcd", "req\u{200B}_id": "ffff"}});
        let err = strip_invisible_json(&clash, &mut Vec::new()).unwrap_err();
        assert_eq!(err.code, ErrorCode::DecodeFailed);
        assert!(err.message.contains("meta.req_id"), "{err}");
    }

    #[test]
    fn stripping_reports_every_class_at_its_offset() {
        let mut notices = Vec::new();
        let s = strip_invisible("a\u{AD}b\u{202E}c\u{E0041}d\u{FE0F}", &mut notices);
        assert_eq!(s.text, "abcd");
        let at: Vec<(char, usize)> = notices
            .iter()
            .map(|n| match n {
                Notice::InvisibleStripped { ch, offset, field: None } => (*ch, *offset),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(at, [('\u{AD}', 1), ('\u{202E}', 4), ('\u{E0041}', 8), ('\u{FE0F}', 13)]);
        assert_eq!(s.original_offset(3), 12);
    }
}
