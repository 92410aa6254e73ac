//! The lexical rules of the code frontend shared by the writer and the parser: which characters
//! make up names, which values can be written bare in each position, and quoted strings.
//!
//! The writer asks "can this value be written bare here?" and quotes it when the answer is no;
//! the parser reads bare text by exactly the same rules. Keeping both sides on these predicates
//! is what makes `decode(compile(ir)) == ir` hold.

use crate::silp::error::SilpError;
use crate::silp::sanitize;
use crate::util::json_text;

/// Characters of a name, as Python's `\w` (letters, digits, underscore, any script).
pub(crate) fn is_word_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// A name that can be written bare and reads back unchanged: `[A-Za-z0-9_]+`.
pub(crate) fn is_ascii_name(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// A constraint type that can be written bare: a name, optionally negated with `!`.
pub(crate) fn is_bare_type(s: &str) -> bool {
    is_ascii_name(s.strip_prefix('!').unwrap_or(s))
}

/// Characters that must never appear raw: controls, the invisible characters the sanitiser
/// strips, and the Unicode line separators.
pub(crate) fn needs_escape(c: char) -> bool {
    c.is_control() || sanitize::is_invisible(c) || c == '\u{2028}' || c == '\u{2029}'
}

/// Characters that make up a comparison operator.
pub(crate) const OPERATOR_CHARS: [char; 5] = ['<', '>', '=', '!', '~'];

/// An operator that can be written in `type<op>value` form.
pub(crate) fn is_operator(s: &str) -> bool {
    !s.is_empty() && s.chars().all(|c| OPERATOR_CHARS.contains(&c))
}

/// The keys of the explicit constraint form `type(value=..,subject=..,time=..,op=..)`.
pub(crate) const CONSTRAINT_KEYS: [&str; 4] = ["value", "subject", "time", "op"];

/// True when a bare argument would be read as `key=value` with a constraint key.
pub(crate) fn looks_like_constraint_key(s: &str) -> bool {
    CONSTRAINT_KEYS.iter().any(|k| s.strip_prefix(k).is_some_and(|rest| rest.starts_with('=')))
}

/// True when a bare argument would be read as a keyword argument `name=value`.
pub(crate) fn looks_like_keyword(s: &str) -> bool {
    let name_len: usize = s.chars().take_while(|c| is_word_char(*c)).map(char::len_utf8).sum();
    name_len > 0 && s[name_len..].starts_with('=') && s.len() > name_len + 1
}

/// A value that can be written bare as a call argument: not empty, no surrounding
/// whitespace, not starting with a quote, nothing invisible, parentheses balanced and no
/// comma outside them.
pub(crate) fn is_bare_argument(s: &str) -> bool {
    let (Some(first), Some(last)) = (s.chars().next(), s.chars().next_back()) else { return false };
    if first.is_whitespace() || last.is_whitespace() || first == '"' {
        return false;
    }
    let mut depth = 0usize;
    for &b in s.as_bytes() {
        match b {
            b'(' => depth += 1,
            b')' if depth == 0 => return false,
            b')' => depth -= 1,
            b',' if depth == 0 => return false,
            0..=0x1f | 0x7f => return false,
            _ => {}
        }
    }
    depth == 0 && (s.is_ascii() || !s.chars().any(needs_escape))
}

/// A value or time that can be written bare in the `type<op>value, time` form: one word with
/// no whitespace, comma or parenthesis, not ending with `:` (which would end the condition).
pub(crate) fn is_bare_word(s: &str) -> bool {
    let Some(first) = s.chars().next() else { return false };
    first != '"'
        && !s.ends_with(':')
        && s.chars().all(|c| !(c.is_whitespace() || matches!(c, ',' | '(' | ')') || needs_escape(c)))
}

/// Writes `s` as a quoted string: JSON string syntax, with every character that
/// [`needs_escape`] written as `\uXXXX`.
pub(crate) fn write_quoted(out: &mut String, s: &str) {
    json_text::write_str_escaping(out, s, needs_escape)
}

/// Writes `s` bare when `bare` says it may be, quoted otherwise.
pub(crate) fn write_value(out: &mut String, s: &str, bare: bool) {
    if bare {
        out.push_str(s);
    } else {
        write_quoted(out, s);
    }
}

/// Reads the quoted string starting at byte `start` (which holds `"`). Returns the string and
/// the offset just past the closing quote.
pub(crate) fn read_quoted(src: &str, start: usize) -> Result<(String, usize), SilpError> {
    let bytes = src.as_bytes();
    let mut i = start + 1;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 2,
            b'"' => {
                let literal = &src[start..=i];
                return serde_json::from_str::<String>(literal).map(|s| (s, i + 1)).map_err(|e| {
                    SilpError::syntax(start..i + 1, format!("invalid quoted string: {}", strip_position(&e)))
                });
            }
            _ => i += 1,
        }
    }
    Err(SilpError::syntax(start..src.len(), "unterminated quoted string: expected a closing '\"'"))
}

fn strip_position(e: &serde_json::Error) -> String {
    let text = e.to_string();
    match text.find(" at line ") {
        Some(i) => text[..i].to_owned(),
        None => text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bare_arguments() {
        for ok in ["flight", "New York", "f(x)", "say \"hi\"", "a; b", "x else: y", "北京", "t+1am"] {
            assert!(is_bare_argument(ok), "{ok:?}");
        }
        for quoted in ["", " padded ", "a,b", "a)b", "(a", "\"x", "a\u{200B}", "a\nb"] {
            assert!(!is_bare_argument(quoted), "{quoted:?}");
        }
    }

    #[test]
    fn keyword_lookalikes() {
        assert!(looks_like_keyword("a=b"));
        assert!(looks_like_keyword("北京=x"));
        assert!(!looks_like_keyword("k="));
        assert!(!looks_like_keyword("x>=5"));
        assert!(looks_like_constraint_key("time=5"));
        assert!(!looks_like_constraint_key("times=5"));
    }

    #[test]
    fn quoted_strings_round_trip() {
        let mut s = String::new();
        write_quoted(&mut s, "a \"b\"\u{200B}\n");
        assert_eq!(s, "\"a \\\"b\\\"\\u200b\\n\"");
        assert_eq!(read_quoted(&s, 0).unwrap(), ("a \"b\"\u{200B}\n".to_owned(), s.len()));
        assert!(read_quoted("\"abc", 0).is_err());
    }
}
