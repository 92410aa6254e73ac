//! Byte-exact JSON writing for the two serialisers the reference implementation relies on:
//! pydantic's `model_dump_json` (canonical compact IR, the basis of `ir_hash`) and Python's
//! `json.dumps(..., ensure_ascii=False, separators=(",", ":"))` (the json and nl_json frontends).
//!
//! Both write non-ASCII raw, escape `"`, `\` and C0 controls (named where JSON has a name, else
//! `\u00xx` in lower case), and differ only in how floats are spelled.

use serde_json::{Map, Number, Value};
use std::fmt::Write;

/// How a float is spelled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FloatStyle {
    /// pydantic-core: `1.0`, `0.9`, `1e-7`, `1.5e+300` (scientific below 1e-5 and from 1e16).
    Pydantic,
    /// Python `repr`: `1.0`, `1e-07`, `1.5e+300` (scientific below 1e-4 and from 1e16).
    Python,
}

/// How values are written: the float spelling, and whether the invisible characters the
/// sanitiser strips are escaped (so that they survive a later sanitised decode).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Style {
    pub float: FloatStyle,
    pub escape_invisible: bool,
}

impl Style {
    /// pydantic's `model_dump_json`: the canonical compact IR.
    pub(crate) const CANONICAL: Style = Style { float: FloatStyle::Pydantic, escape_invisible: false };
    /// Python's `json.dumps`, as the json frontend writes, with invisible characters escaped.
    pub(crate) const FRONTEND: Style = Style { float: FloatStyle::Python, escape_invisible: true };
}

/// Writes `s` as a JSON string literal.
pub fn write_str(out: &mut String, s: &str) {
    // Most strings need no escape at all: copy them whole.
    if !s.bytes().any(|b| b < 0x20 || b == b'"' || b == b'\\') {
        out.reserve(s.len() + 2);
        out.push('"');
        out.push_str(s);
        out.push('"');
        return;
    }
    write_str_escaping(out, s, |_| false)
}

/// Writes `s` as a JSON string literal in `style`.
pub(crate) fn write_text(out: &mut String, s: &str, style: Style) {
    if style.escape_invisible {
        write_str_escaping(out, s, super::unicode::is_invisible)
    } else {
        write_str(out, s)
    }
}

/// Writes `s` as a JSON string literal, additionally escaping every char for which
/// `escape_extra` is true as `\uXXXX` (used to keep invisible characters visible).
pub(crate) fn write_str_escaping(out: &mut String, s: &str, escape_extra: impl Fn(char) -> bool) {
    out.reserve(s.len() + 2);
    out.push('"');
    let bytes = s.as_bytes();
    let mut start = 0;
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        let (escape, len): (Option<&str>, usize) = match b {
            b'"' => (Some("\\\""), 1),
            b'\\' => (Some("\\\\"), 1),
            b'\n' => (Some("\\n"), 1),
            b'\r' => (Some("\\r"), 1),
            b'\t' => (Some("\\t"), 1),
            0x08 => (Some("\\b"), 1),
            0x0c => (Some("\\f"), 1),
            0..=0x1f => (None, 1),
            0x20..=0x7e => {
                i += 1;
                continue;
            }
            _ => {
                let c = s[i..].chars().next().expect("a char starts at every non-continuation byte");
                if !escape_extra(c) {
                    i += c.len_utf8();
                    continue;
                }
                (None, c.len_utf8())
            }
        };
        out.push_str(&s[start..i]);
        match escape {
            Some(e) => out.push_str(e),
            None => {
                let c = s[i..].chars().next().expect("char boundary");
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
        }
        i += len;
        start = i;
    }
    out.push_str(&s[start..]);
    out.push('"');
}

/// Writes any JSON value compactly, floats in `style`, object keys in their stored order.
pub(crate) fn write_value(out: &mut String, value: &Value, style: Style) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => write_number(out, n, style),
        Value::String(s) => write_text(out, s, style),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_value(out, item, style);
            }
            out.push(']');
        }
        Value::Object(map) => write_object(out, map, style),
    }
}

fn write_object(out: &mut String, map: &Map<String, Value>, style: Style) {
    out.push('{');
    for (i, (k, v)) in map.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        write_text(out, k, style);
        out.push(':');
        write_value(out, v, style);
    }
    out.push('}');
}

/// Writes `"key":value` pairs of `extras` whose value is not null, each preceded by a comma:
/// how both serialisers append a model's unknown fields after its declared ones.
pub(crate) fn write_extras(out: &mut String, extras: &Map<String, Value>, style: Style) {
    for (k, v) in extras {
        if v.is_null() {
            continue;
        }
        out.push(',');
        write_text(out, k, style);
        out.push(':');
        write_value(out, v, style);
    }
}

fn write_number(out: &mut String, n: &Number, style: Style) {
    match n.as_f64() {
        Some(f) if !(n.is_i64() || n.is_u64()) => write_float(out, f, style.float),
        _ => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => out.push_str(itoa::Buffer::new().format(i)),
            (None, Some(u)) => out.push_str(itoa::Buffer::new().format(u)),
            (None, None) => out.push_str(&n.to_string()),
        },
    }
}

/// Writes a float with the shortest digits that round-trip, laid out as `style` does.
pub(crate) fn write_float(out: &mut String, f: f64, style: FloatStyle) {
    if !f.is_finite() {
        // Neither serialiser can produce these from JSON input; JSON has no spelling for them.
        out.push_str("null");
        return;
    }
    // The default confidence, written for nearly every IR, needs no formatting.
    if f.to_bits() == 1f64.to_bits() {
        out.push_str("1.0");
        return;
    }
    // `{:e}` gives the shortest round-trip digits, the nearest where several are shortest, as
    // Python's repr does: "-1.5e300", "1e-7", "0e0". It is written into a stack buffer: at
    // most 17 digits, a point, a sign and a 4-character exponent.
    let mut buf = [0u8; 32];
    let len = {
        let mut cursor = std::io::Cursor::new(&mut buf[..]);
        std::io::Write::write_fmt(&mut cursor, format_args!("{f:e}")).expect("a float fits in 32 bytes");
        cursor.position() as usize
    };
    let sci = std::str::from_utf8(&buf[..len]).expect("{:e} writes ASCII");
    let (mantissa, exp) = sci.split_once('e').expect("{:e} always has an exponent");
    let exp: i32 = exp.parse().expect("{:e} exponent is an integer");
    let (sign, mantissa) = mantissa.strip_prefix('-').map_or(("", mantissa), |m| ("-", m));
    let mut digit_buf = [0u8; 24];
    let mut n = 0;
    for b in mantissa.bytes().filter(|b| *b != b'.') {
        digit_buf[n] = b;
        n += 1;
    }
    let digits = std::str::from_utf8(&digit_buf[..n]).expect("ASCII digits");
    let fixed = match style {
        FloatStyle::Pydantic => (-5..16).contains(&exp),
        FloatStyle::Python => (-4..16).contains(&exp),
    };
    out.push_str(sign);
    if fixed {
        if exp < 0 {
            out.push_str("0.");
            out.extend(std::iter::repeat_n('0', (-exp - 1) as usize));
            out.push_str(digits);
        } else {
            let point = exp as usize + 1;
            if digits.len() > point {
                out.push_str(&digits[..point]);
                out.push('.');
                out.push_str(&digits[point..]);
            } else {
                out.push_str(digits);
                out.extend(std::iter::repeat_n('0', point - digits.len()));
                out.push_str(".0");
            }
        }
        return;
    }
    out.push_str(&digits[..1]);
    if digits.len() > 1 {
        out.push('.');
        out.push_str(&digits[1..]);
    }
    out.push('e');
    out.push(if exp < 0 { '-' } else { '+' });
    if style == FloatStyle::Python && exp.abs() < 10 {
        out.push('0');
    }
    out.push_str(itoa::Buffer::new().format(exp.abs()));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn float(f: f64, style: FloatStyle) -> String {
        let mut s = String::new();
        write_float(&mut s, f, style);
        s
    }

    #[test]
    fn floats_are_spelled_like_the_reference() {
        use FloatStyle::*;
        assert_eq!(float(1.0, Pydantic), "1.0");
        assert_eq!(float(0.9, Pydantic), "0.9");
        assert_eq!(float(0.1 + 0.2, Pydantic), "0.30000000000000004");
        assert_eq!(float(1e-7, Pydantic), "1e-7");
        assert_eq!(float(1.5e300, Pydantic), "1.5e+300");
        assert_eq!(float(0.0, Pydantic), "0.0");
        assert_eq!(float(1e-7, Python), "1e-07");
        assert_eq!(float(0.0001, Python), "0.0001");
        assert_eq!(float(123456.5, Python), "123456.5");
        assert_eq!(float(-2.5e16, Python), "-2.5e+16");
        assert_eq!(float(5e-324, Pydantic), "5e-324");
        assert_eq!(float(1.7976931348623157e308, Pydantic), "1.7976931348623157e+308");
        assert_eq!(float(1e16, Pydantic), "1e+16");
        assert_eq!(float(9999999999999998.0, Pydantic), "9999999999999998.0");
        assert_eq!(float(0.00001, Pydantic), "0.00001");
        assert_eq!(float(0.0001, Pydantic), "0.0001");
        assert_eq!(float(-0.0, Pydantic), "-0.0");
        assert_eq!(float(120.0, Python), "120.0");
        assert_eq!(float(1.25e-5, Python), "1.25e-05");
    }

    #[test]
    fn every_float_reads_back_as_itself() {
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let f = f64::from_bits(x);
            if !f.is_finite() {
                continue;
            }
            for style in [FloatStyle::Pydantic, FloatStyle::Python] {
                let written = float(f, style);
                assert_eq!(written.parse::<f64>().unwrap().to_bits(), f.to_bits(), "{f:e} -> {written}");
            }
        }
    }

    #[test]
    fn strings_escape_controls_in_lower_case_hex() {
        let mut s = String::new();
        write_str(&mut s, "a\"b\\c\nd\u{1}\u{7f}é\u{2028}");
        assert_eq!(s, "\"a\\\"b\\\\c\\nd\\u0001\u{7f}é\u{2028}\"");
    }
}
