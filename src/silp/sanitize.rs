//! Input sanitising (draft §8.1): invisible characters are stripped and identifiers are mapped
//! to ASCII through Unicode compatibility normalisation and the UTS #39 confusables table.
//! Nothing is changed silently: every strip and every mapping becomes a [`Notice`].

use std::borrow::Cow;
use std::fmt;
use unicode_normalization::UnicodeNormalization;
use unicode_security::confusable_detection::skeleton;

/// The zero-width characters the draft names: ZWSP, ZWNJ, ZWJ and BOM.
pub const INVISIBLE: [char; 4] = ['\u{200B}', '\u{200C}', '\u{200D}', '\u{FEFF}'];

/// True for a character the sanitiser strips.
pub fn is_invisible(c: char) -> bool {
    INVISIBLE.contains(&c)
}

/// Something the sanitiser changed, reported to the caller (and counted by operators: it is a
/// security signal).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notice {
    /// An invisible character was removed at this byte offset of the input.
    InvisibleStripped { ch: char, offset: usize },
    /// An identifier with look-alike characters was read as its ASCII skeleton.
    HomoglyphMapped { from: String, to: String, offset: usize },
}

impl fmt::Display for Notice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Notice::InvisibleStripped { ch, offset } => {
                write!(f, "stripped invisible character U+{:04X} at byte {offset}", *ch as u32)
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
pub struct Stripped<'a> {
    pub text: Cow<'a, str>,
    /// `(offset in stripped text, bytes removed before it)`, one entry per removal.
    shifts: Vec<(usize, usize)>,
}

impl<'a> Stripped<'a> {
    /// The text as it is, for when sanitising is off.
    pub fn unchanged(text: &'a str) -> Self {
        Stripped { text: Cow::Borrowed(text), shifts: Vec::new() }
    }

    /// The original offset of a byte offset in the stripped text.
    pub fn original_offset(&self, offset: usize) -> usize {
        let i = self.shifts.partition_point(|(at, _)| *at <= offset);
        offset + if i == 0 { 0 } else { self.shifts[i - 1].1 }
    }
}

/// Removes every invisible character, recording a notice for each.
pub fn strip_invisible<'a>(text: &'a str, notices: &mut Vec<Notice>) -> Stripped<'a> {
    if text.is_ascii() || !text.contains(INVISIBLE) {
        return Stripped { text: Cow::Borrowed(text), shifts: Vec::new() };
    }
    let mut out = String::with_capacity(text.len());
    let mut shifts = Vec::new();
    let mut removed = 0;
    for (i, c) in text.char_indices() {
        if is_invisible(c) {
            notices.push(Notice::InvisibleStripped { ch: c, offset: i });
            removed += c.len_utf8();
            shifts.push((out.len(), removed));
        } else {
            out.push(c);
        }
    }
    Stripped { text: Cow::Owned(out), shifts }
}

/// Maps an identifier to ASCII. Compatibility forms (long s, ligatures, full-width letters) are
/// normalised with NFKC; the remaining non-ASCII characters are replaced by their confusable
/// skeleton (Cyrillic `а` -> `a`, dotless `ı` -> `i`). Returns the first character that has no
/// ASCII reading when the mapping fails.
pub fn ascii_identifier(raw: &str) -> Result<Cow<'_, str>, char> {
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
}
