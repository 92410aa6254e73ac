//! Counting the values of an encoded message before it is decoded. A decoded value costs tens
//! of bytes however few bytes encode it (a CBOR `null` is one byte), so a byte limit alone lets
//! a small message claim a large tree: the count is checked first, without allocating.
//!
//! A value is anything a document holds: every string (map keys included), number, boolean,
//! null, byte string, array and map. The scans are linear, stop once past the limit, and leave
//! malformed input to the real decoder (which refuses it).

/// Values in the JSON text `bytes`, counting no further than `stop_above + 1`.
pub(super) fn json(bytes: &[u8], stop_above: usize) -> usize {
    let mut items = 0;
    let mut i = 0;
    while i < bytes.len() && items <= stop_above {
        match bytes[i] {
            b'"' => {
                items += 1;
                i = skip_json_string(bytes, i + 1);
                continue;
            }
            b'[' | b'{' => items += 1,
            b't' | b'f' | b'n' | b'-' | b'0'..=b'9' => {
                items += 1;
                // The rest of the literal or number is one value.
                while i + 1 < bytes.len()
                    && matches!(bytes[i + 1], b'a'..=b'z' | b'0'..=b'9' | b'.' | b'+' | b'-' | b'E')
                {
                    i += 1;
                }
            }
            _ => {}
        }
        i += 1;
    }
    items
}

/// The position after the string whose body starts at `i`. Most of a message's bytes are in
/// its strings, so the scan jumps to the next quote or backslash instead of stepping.
fn skip_json_string(bytes: &[u8], mut i: usize) -> usize {
    while let Some(at) = bytes.get(i..).and_then(|rest| memchr::memchr2(b'"', b'\\', rest)) {
        i += at;
        if bytes[i] == b'"' {
            return i + 1;
        }
        i += 2;
    }
    bytes.len()
}

/// Data items in the CBOR bytes, counting no further than `stop_above + 1`. Tags and the
/// break code are not values; chunks of an indefinite-length string each count (a bound, not
/// an exact figure).
pub(super) fn cbor(bytes: &[u8], stop_above: usize) -> usize {
    let mut items = 0;
    let mut i = 0;
    while i < bytes.len() && items <= stop_above {
        let initial = bytes[i];
        i += 1;
        let (major, info) = (initial >> 5, initial & 0x1f);
        let width = match info {
            0..=23 | 31 => 0,
            24 => 1,
            25 => 2,
            26 => 4,
            27 => 8,
            _ => return items,
        };
        let Some(argument) = bytes.get(i..i + width) else { return items };
        i += width;
        let length = match info {
            0..=23 => u64::from(info),
            _ => argument.iter().fold(0u64, |n, b| (n << 8) | u64::from(*b)),
        };
        match major {
            // Byte and text strings: their bytes are content, not items.
            2 | 3 => {
                items += 1;
                if info != 31 {
                    match usize::try_from(length).ok().and_then(|n| i.checked_add(n)) {
                        Some(end) if end <= bytes.len() => i = end,
                        _ => return items,
                    }
                }
            }
            6 => {}
            7 if info == 31 => {}
            _ => items += 1,
        }
    }
    items
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_values_are_counted_keys_included_and_strings_skipped() {
        assert_eq!(json(br#"{"a":[1,-2.5e3,true,null],"b":"x,[{\"]"}"#, 100), 9);
        assert_eq!(json(b"[]", 100), 1);
        assert_eq!(json(b"[null,null,null,null]", 2), 3, "stops once past the limit");
    }

    #[test]
    fn cbor_items_are_counted_and_string_bytes_skipped() {
        let mut doc = Vec::new();
        let value = ciborium::Value::Map(vec![(
            ciborium::Value::Text("content".into()),
            ciborium::Value::Array(vec![
                ciborium::Value::Null,
                ciborium::Value::Bytes(vec![0xf6; 40]),
                ciborium::Value::Tag(1, Box::new(ciborium::Value::Float(1.5))),
            ]),
        )]);
        ciborium::ser::into_writer(&value, &mut doc).unwrap();
        assert_eq!(cbor(&doc, 100), 6);
        assert_eq!(cbor(&[0x9f, 0xf6, 0xf6, 0xff], 100), 3, "indefinite array, break not counted");
        assert_eq!(cbor(&[0x5a, 0xff, 0xff, 0xff, 0xff], 100), 1, "a length past the end stops the scan");
    }
}
