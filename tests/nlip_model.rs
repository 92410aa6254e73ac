//! The NLIP envelope layer: the public example messages (tests/vectors/nlip-examples.json)
//! accepted or rejected as ECMA-430 says, the reading rules, limits, and JSON <-> CBOR.

use proptest::prelude::*;
use serde_json::{Value, json};
use silpgate::nlip::{self, Content, Encoding, Format, Limits, Message, NlipErrorKind, Submessage};

fn decode_json(text: &str) -> Result<Message, nlip::NlipError> {
    nlip::decode(text.as_bytes(), Encoding::Json, &Limits::default())
}

fn canonical(m: &Message) -> Value {
    serde_json::from_str(&nlip::to_json(m)).expect("canonical JSON parses")
}

/// What ECMA-430 says of each public example, and why.
fn expectation(name: &str) -> Result<(), &'static str> {
    match name {
        "malformed-missing-subformat-nlip-swarm-curl" => Err("subformat"),
        // Capitalised keys (ECMA-432 style) are valid: "Capitalization is not relevant to the
        // name or value of the field" (ECMA-430 §5). The SDK rejects them; silpgate does not.
        // `Format: error` is the drafts' error format, still understood. Every other example
        // is a well-formed message.
        _ => Ok(()),
    }
}

#[test]
fn public_examples_are_accepted_or_rejected_as_the_standard_says() {
    let examples: Vec<Value> =
        serde_json::from_str(include_str!("vectors/nlip-examples.json")).expect("examples parse");
    assert_eq!(examples.len(), 17);
    for example in &examples {
        let name = example["name"].as_str().expect("name");
        let text = example["message"].to_string();
        match (decode_json(&text), expectation(name)) {
            (Ok(message), Ok(())) => {
                let out = canonical(&message);
                for key in out.as_object().expect("object").keys() {
                    assert!(!key.chars().any(|c| c.is_ascii_uppercase()), "{name}: key {key} not lower case");
                }
                // Where the SDK accepted the example, silpgate writes what the SDK writes.
                if example["nlip_sdk_0_1_3"]["accepted"] == true {
                    let sdk = &example["nlip_sdk_0_1_3"]["to_json"];
                    let mut ours = out.clone();
                    if let (Some(o), Some(s)) = (ours.get_mut("format"), sdk.get("format")) {
                        // The SDK keeps the top-level format as sent; silpgate lower-cases it.
                        assert_eq!(
                            o.as_str().map(str::to_lowercase),
                            s.as_str().map(str::to_lowercase),
                            "{name}"
                        );
                        *o = s.clone();
                    }
                    assert_eq!(&ours, sdk, "{name}");
                }
            }
            (Err(e), Err(field)) => {
                assert_eq!(e.kind, NlipErrorKind::InvalidEnvelope, "{name}: {e}");
                assert_eq!(e.path.as_deref(), Some(field), "{name}: {e}");
                assert!(e.message.contains("missing required field"), "{name}: {e}");
            }
            (Ok(_), Err(field)) => panic!("{name}: accepted, but '{field}' is missing"),
            (Err(e), Ok(())) => panic!("{name}: rejected: {e}"),
        }
    }
}

#[test]
fn keys_and_format_values_ignore_case_and_output_is_canonical() {
    let m = decode_json(r#"{"MessageType":"Request","FORMAT":"Text","SubFormat":"English","Content":"hi","Submessages":[{"LABEL":"x","Format":"TOKEN","subformat":"conversation","content":"c1"}]}"#).unwrap();
    assert_eq!(m.format, Format::Text);
    assert_eq!(m.conversation_token(), Some("c1"));
    assert_eq!(
        nlip::to_json(&m),
        r#"{"messagetype":"Request","format":"text","subformat":"English","content":"hi","submessages":[{"format":"token","subformat":"conversation","content":"c1","label":"x"}]}"#
    );
}

/// silpgate and the agent must read one conversation token: a message with two (whatever
/// their suffixes), or with one that is not text, is refused naming the submessage, where
/// silpgate would otherwise key its session on one token and the agent read another.
#[test]
fn a_message_has_at_most_one_conversation_token_and_it_is_text() {
    let with = |subs: &str| {
        decode_json(&format!(
            r#"{{"format":"text","subformat":"english","content":"hi","submessages":[{subs}]}}"#
        ))
    };
    let token = |subformat: &str, content: &str| {
        format!(r#"{{"format":"token","subformat":"{subformat}","content":{content}}}"#)
    };
    for (content, found) in
        [("{}", "an object"), ("7", "a number"), ("null", "null"), ("[\"a\"]", "an array")]
    {
        let e = with(&token("conversation", content)).unwrap_err();
        assert_eq!(
            (e.kind, e.path.as_deref()),
            (NlipErrorKind::InvalidEnvelope, Some("submessages[0].content")),
            "{content}"
        );
        assert!(e.message.contains(&format!("found {found}")), "{e}");
    }
    let two = format!("{},{}", token("conversation", r#""mine""#), token("conversation", r#""theirs""#));
    let e = with(&two).unwrap_err();
    assert_eq!((e.kind, e.path.as_deref()), (NlipErrorKind::InvalidEnvelope, Some("submessages[1]")));
    assert!(e.message.contains("second conversation token"), "{e}");
    let suffixed = format!("{},{}", token("conversation_alt", r#""a""#), token("Conversation", r#""b""#));
    assert_eq!(with(&suffixed).unwrap_err().path.as_deref(), Some("submessages[1]"));
    let after_object = format!("{},{}", token("conversation", "{}"), token("conversation", r#""b""#));
    assert_eq!(with(&after_object).unwrap_err().path.as_deref(), Some("submessages[0].content"));
    // One string token, among other tokens, is the conversation.
    let fine = format!("{},{}", token("authentication", r#""jwt""#), token("conversation_v2", r#""c9""#));
    assert_eq!(with(&fine).unwrap().conversation_token(), Some("c9"));
    let mut binary = Message::new(Format::Text, "english", Content::text("hi"));
    binary.push(Submessage::new(Format::Token, "conversation", Content::Binary(b"c1".to_vec())));
    let cbor = nlip::encode(&binary, Encoding::Cbor);
    let e = nlip::decode(&cbor, Encoding::Cbor, &Limits::default()).unwrap_err();
    assert_eq!(e.path.as_deref(), Some("submessages[0].content"), "{e}");
}

#[test]
fn a_field_given_twice_in_different_case_is_an_error() {
    let e = decode_json(r#"{"format":"text","Format":"binary","subformat":"x","content":"y"}"#).unwrap_err();
    assert_eq!(e.path.as_deref(), Some("format"));
    assert!(e.message.contains("given twice"), "{e}");
}

/// Two readers of a message with two `content` fields may each act on a different one; the
/// message is refused instead of read as whichever came last (JSON and CBOR alike).
#[test]
fn a_field_given_twice_in_the_same_spelling_is_an_error_at_any_level() {
    let e =
        decode_json(r#"{"format":"text","subformat":"x","content":"safe","content":"other"}"#).unwrap_err();
    assert_eq!(e.path.as_deref(), Some("content"), "{e}");
    assert!(e.message.contains("given twice"), "{e}");
    let e = decode_json(
        r#"{"format":"text","subformat":"x","content":"y","submessages":[{"format":"text","format":"binary","subformat":"x","content":"y"}]}"#,
    )
    .unwrap_err();
    assert_eq!(e.path.as_deref(), Some("submessages[0].format"), "{e}");
    assert!(e.message.contains("given twice"), "{e}");
}

#[test]
fn unknown_fields_are_kept_in_their_spelling_and_order() {
    let text = r#"{"format":"text","subformat":"english","content":"hi","X-Trace":{"a":1},"zeta":null,"submessages":[{"format":"text","subformat":"english","content":"s","Weight":0.5,"messagetype":"odd"}]}"#;
    let m = decode_json(text).unwrap();
    assert_eq!(
        nlip::to_json(&m),
        r#"{"format":"text","subformat":"english","content":"hi","submessages":[{"format":"text","subformat":"english","content":"s","Weight":0.5,"messagetype":"odd"}],"X-Trace":{"a":1}}"#
    );
}

#[test]
fn legacy_input_is_understood() {
    let m = decode_json(r#"{"control":true,"format":"text","subformat":"english","content":"c"}"#).unwrap();
    assert!(m.is_control());
    assert_eq!(
        nlip::to_json(&m),
        r#"{"messagetype":"control","format":"text","subformat":"english","content":"c"}"#
    );
    let m = decode_json(r#"{"control":false,"format":"error","subformat":"text","content":"boom"}"#).unwrap();
    assert!(!m.is_control() && m.is_error());
    let m = decode_json(r#"{"format":"text","subformat":"english","content":"c","submessages":[{"format":"token","subformat":"authorization","content":"t"}]}"#).unwrap();
    assert!(m.submessages()[0].is_authentication_token());
    let e =
        decode_json(r#"{"control":"yes","format":"text","subformat":"english","content":"c"}"#).unwrap_err();
    assert_eq!(e.path.as_deref(), Some("control"));
}

#[test]
fn missing_and_mistyped_fields_name_their_path() {
    let cases = [
        (r#"{"subformat":"english","content":"c"}"#, "format", "missing required field 'format'"),
        (r#"{"format":"text","content":"c"}"#, "subformat", "missing required field 'subformat'"),
        (r#"{"format":"text","subformat":"english"}"#, "content", "missing required field 'content'"),
        (
            r#"{"format":"text","subformat":"english","content":"c","submessages":[{"format":"text","subformat":"e","content":1},{"format":"text","subformat":"e"}]}"#,
            "submessages[1].content",
            "missing",
        ),
        (
            r#"{"format":"text","subformat":"english","content":"c","submessages":[{},{},{"format":"foo","subformat":"x","content":1}]}"#,
            "submessages[0].format",
            "missing",
        ),
        (
            r#"{"format":"text","subformat":"english","content":"c","submessages":[{"format":"foo","subformat":"x","content":1}]}"#,
            "submessages[0].format",
            "unknown format 'foo'",
        ),
        (r#"{"format":"text","subformat":5,"content":"c"}"#, "subformat", "must be a string, found a number"),
        (
            r#"{"format":"text","subformat":"e","content":"c","submessages":{"a":1}}"#,
            "submessages",
            "must be an array",
        ),
        (r#"{"format":"text","subformat":"e","content":"c","label":5}"#, "label", "must be a string"),
    ];
    for (text, path, message) in cases {
        let e = decode_json(text).unwrap_err();
        assert_eq!(e.kind, NlipErrorKind::InvalidEnvelope, "{text}: {e}");
        assert_eq!(e.path.as_deref(), Some(path), "{text}: {e}");
        assert!(e.message.contains(message), "{text}: {e}");
    }
    let e = decode_json("[1,2]").unwrap_err();
    assert!(e.message.contains("an NLIP message is an object, found an array"), "{e}");
    let e = decode_json("not json").unwrap_err();
    assert_eq!(e.kind, NlipErrorKind::InvalidEncoding);
}

#[test]
fn nulls_mean_absent_except_for_content() {
    let m = decode_json(r#"{"messagetype":null,"format":"text","subformat":"english","content":null,"label":null,"submessages":null}"#).unwrap();
    assert_eq!(nlip::to_json(&m), r#"{"format":"text","subformat":"english","content":null}"#);
}

#[test]
fn limits_are_enforced_with_clear_errors() {
    let limits = Limits { max_bytes: 200, max_depth: 4, max_submessages: 2, ..Limits::default() };
    let big = format!(r#"{{"format":"text","subformat":"english","content":"{}"}}"#, "x".repeat(300));
    let e = nlip::decode(big.as_bytes(), Encoding::Json, &limits).unwrap_err();
    assert_eq!(e.kind, NlipErrorKind::TooLarge);
    assert!(e.message.contains("limit is 200 bytes"), "{e}");
    let deep = r#"{"format":"text","subformat":"json","content":[[[[[1]]]]]}"#;
    let e = nlip::decode(deep.as_bytes(), Encoding::Json, &limits).unwrap_err();
    assert_eq!(e.kind, NlipErrorKind::TooComplex, "{e}");
    let many = r#"{"format":"text","subformat":"e","content":"c","submessages":[{"format":"text","subformat":"e","content":1},{"format":"text","subformat":"e","content":2},{"format":"text","subformat":"e","content":3}]}"#;
    let e = nlip::decode(many.as_bytes(), Encoding::Json, &Limits { max_bytes: 1000, ..limits }).unwrap_err();
    assert_eq!((e.kind, e.path.as_deref()), (NlipErrorKind::TooComplex, Some("submessages")));
    let cbor_deep = nlip::encode(
        &Message::new(Format::Structured, "json", Content::Json(json!([[[[[[1]]]]]]))),
        Encoding::Cbor,
    );
    assert_eq!(
        nlip::decode(&cbor_deep, Encoding::Cbor, &limits).unwrap_err().kind,
        NlipErrorKind::TooComplex
    );
}

#[test]
fn the_depth_limit_counts_every_level_alike_in_json_and_cbor() {
    let limits = Limits { max_depth: 4, ..Limits::default() };
    let cases = [
        (r#"{"format":"text","subformat":"json","content":[[[1]]]}"#, true),
        (r#"{"format":"text","subformat":"json","content":[[[[1]]]]}"#, false),
        (r#"{"format":"text","subformat":"json","content":"c","x-extra":{"a":{"b":{"c":{"d":1}}}}}"#, false),
        (r#"{"format":"text","subformat":"json","content":"c","x-extra":{"a":{"b":{"c":1}}}}"#, true),
        (
            r#"{"format":"text","subformat":"e","content":"c","submessages":[{"format":"text","subformat":"json","content":[1]}]}"#,
            true,
        ),
        (
            r#"{"format":"text","subformat":"e","content":"c","submessages":[{"format":"text","subformat":"json","content":{"a":[1]}}]}"#,
            false,
        ), // A `silp-ir` content is kept as its text, and counted all the same.
        (r#"{"format":"structured","subformat":"silp-ir","content":{"a":{"b":[1]}}}"#, true),
        (r#"{"format":"structured","subformat":"silp-ir","content":{"a":{"b":[["]]]]"]]}}}"#, false),
        (
            r#"{"format":"text","subformat":"e","content":"c","submessages":[{"format":"structured","subformat":"silp-ir","content":{"a":1}}]}"#,
            true,
        ),
        (
            r#"{"format":"text","subformat":"e","content":"c","submessages":[{"format":"structured","subformat":"silp-ir","content":{"a":[1]}}]}"#,
            false,
        ),
    ];
    for (text, accepted) in cases {
        let json = nlip::decode(text.as_bytes(), Encoding::Json, &limits);
        assert_eq!(json.is_ok(), accepted, "{text}: {json:?}");
        let whole = nlip::decode(text.as_bytes(), Encoding::Json, &Limits::default()).unwrap();
        let cbor = nlip::decode(&nlip::encode(&whole, Encoding::Cbor), Encoding::Cbor, &limits);
        assert_eq!(cbor.is_ok(), accepted, "{text} in CBOR: {cbor:?}");
        if let Err(e) = json {
            assert_eq!(e.kind, NlipErrorKind::TooComplex, "{e}");
        }
    }
}

#[test]
fn a_silp_ir_content_is_kept_as_written_and_written_back_canonical() {
    let text = r#"{"format":"structured","subformat":"SILP-IR","content":{ "intent" : "!A",  "meta":{"req_id":"abcd"} },"submessages":[{"content":{"x":1},"format":"structured","subformat":"silp-ir"},{"format":"structured","subformat":"silp-ir","content":"not an object"}]}"#;
    let m = decode_json(text).unwrap();
    let Content::Raw(raw) = &m.content else { panic!("not kept as written: {:?}", m.content) };
    assert_eq!(raw.get(), r#"{ "intent" : "!A",  "meta":{"req_id":"abcd"} }"#);
    // A content written before its subformat is built as a tree; it reads the same.
    assert_eq!(m.submessages()[0].content, Content::Json(json!({"x": 1})));
    assert_eq!(m.submessages()[1].content, Content::text("not an object"));
    assert_eq!(
        nlip::to_json(&m),
        r#"{"format":"structured","subformat":"SILP-IR","content":{"intent":"!A","meta":{"req_id":"abcd"}},"submessages":[{"format":"structured","subformat":"silp-ir","content":{"x":1}},{"format":"structured","subformat":"silp-ir","content":"not an object"}]}"#
    );
    let back = nlip::decode(&nlip::encode(&m, Encoding::Cbor), Encoding::Cbor, &Limits::default()).unwrap();
    assert_eq!(back, m);
    let broken = r#"{"format":"structured","subformat":"silp-ir","content":{"intent":"!A",}}"#;
    assert_eq!(decode_json(broken).unwrap_err().kind, NlipErrorKind::InvalidEncoding);
}

#[test]
fn binary_content_is_a_byte_string_in_cbor_and_base64_in_json() {
    let json_text = r#"{"MessageType":"Request","Format":"binary","Subformat":"audio/wav;base64","Content":"UklGRg==","Submessages":[{"Label":"description","Format":"text","Subformat":"en","Content":"a clip"}]}"#;
    let m = decode_json(json_text).unwrap();
    assert_eq!(m.content, Content::Binary(b"RIFF".to_vec()));
    assert_eq!(m.subformat, "audio/wav");
    let cbor = nlip::encode(&m, Encoding::Cbor);
    let back: ciborium::Value = ciborium::de::from_reader(cbor.as_slice()).unwrap();
    let content =
        back.as_map().unwrap().iter().find(|(k, _)| k.as_text() == Some("content")).map(|(_, v)| v.clone());
    assert_eq!(content, Some(ciborium::Value::Bytes(b"RIFF".to_vec())));
    let again = nlip::decode(&cbor, Encoding::Cbor, &Limits::default()).unwrap();
    assert_eq!(again, m);
    assert_eq!(
        nlip::to_json(&again),
        r#"{"messagetype":"Request","format":"binary","subformat":"audio/wav;base64","content":"UklGRg==","submessages":[{"format":"text","subformat":"en","content":"a clip","label":"description"}]}"#
    );
    // Text that is not base64 under a ;base64 subformat is passed on as text.
    let m = decode_json(r#"{"format":"binary","subformat":"audio/wav;base64","content":"UklG.."}"#).unwrap();
    assert_eq!(m.content, Content::text("UklG.."));
}

#[test]
fn ecma_432_cbor_with_capitalised_keys_is_read() {
    use ciborium::Value as C;
    let map = C::Map(vec![
        (C::Text("MessageType".into()), C::Text("Request".into())),
        (C::Text("Format".into()), C::Text("binary".into())),
        (C::Text("Subformat".into()), C::Text("image/jpeg".into())),
        (C::Text("Content".into()), C::Bytes(vec![0xff, 0xd8, 0xff, 0xe0])),
        (
            C::Text("Submessages".into()),
            C::Array(vec![C::Map(vec![
                (C::Text("Label".into()), C::Text("description".into())),
                (C::Text("Format".into()), C::Text("text".into())),
                (C::Text("Subformat".into()), C::Text("English".into())),
                (C::Text("Content".into()), C::Text("A photo".into())),
            ])]),
        ),
    ]);
    let mut bytes = Vec::new();
    ciborium::ser::into_writer(&map, &mut bytes).unwrap();
    let m = nlip::decode(&bytes, Encoding::Cbor, &Limits::default()).unwrap();
    assert_eq!(m.content, Content::Binary(vec![0xff, 0xd8, 0xff, 0xe0]));
    assert_eq!(m.submessages()[0].label.as_deref(), Some("description"));
    let e = nlip::decode(&[0xff, 0x00], Encoding::Cbor, &Limits::default()).unwrap_err();
    assert_eq!(e.kind, NlipErrorKind::InvalidEncoding);
}

fn text() -> impl Strategy<Value = String> {
    prop_oneof!["[a-zA-Z0-9 _;/.-]{0,12}", any::<String>()]
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|i| json!(i)),
        (-1e9f64..1e9).prop_map(|f| json!(f)),
        text().prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..3).prop_map(Value::Array),
            prop::collection::vec(("[a-z]{1,5}", inner), 0..3)
                .prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

fn content() -> impl Strategy<Value = Content> {
    prop_oneof![3 => json_value().prop_map(Content::Json), 1 => prop::collection::vec(any::<u8>(), 0..16).prop_map(Content::Binary)]
}

fn format() -> impl Strategy<Value = Format> {
    prop::sample::select(Format::ALL.to_vec())
}

fn extras() -> impl Strategy<Value = serde_json::Map<String, Value>> {
    prop::collection::vec(("x-[a-z]{1,4}", json_value()), 0..2).prop_map(|kv| kv.into_iter().collect())
}

fn message() -> impl Strategy<Value = Message> {
    let sub = (format(), "[a-z/]{1,8}", content(), prop::option::of(text()), extras()).prop_map(
        |(format, subformat, content, label, extra)| Submessage { format, subformat, content, label, extra },
    );
    (
        prop::option::of(prop::sample::select(vec!["control", "Request", "error"])),
        format(),
        "[a-z/]{1,8}",
        content(),
        prop::option::of(text()),
        prop::option::of(prop::collection::vec(sub, 0..4)),
        extras(),
    )
        .prop_map(|(messagetype, format, subformat, content, label, submessages, extra)| Message {
            messagetype: messagetype.map(str::to_owned),
            format,
            subformat,
            content,
            label,
            submessages,
            extra,
        })
}

proptest! {
    #[test]
    fn json_to_cbor_to_json_is_lossless(m in message()) {
        let json1 = nlip::to_json(&m);
        let read = decode_json(&json1).unwrap();
        let cbor = nlip::encode(&read, Encoding::Cbor);
        let from_cbor = nlip::decode(&cbor, Encoding::Cbor, &Limits::default()).unwrap();
        // The decoded messages themselves, not their renderings: a writer that hid a
        // difference would hide it on both sides.
        prop_assert_eq!(&from_cbor, &read);
        prop_assert_eq!(nlip::to_json(&from_cbor), json1);
    }

    #[test]
    fn decoders_never_panic_on_arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        let _ = nlip::decode(&bytes, Encoding::Json, &Limits::default());
        let _ = nlip::decode(&bytes, Encoding::Cbor, &Limits::default());
    }

    #[test]
    fn decoders_never_panic_on_mangled_messages(m in message(), cut in any::<prop::sample::Index>(), flip in any::<u8>()) {
        for encoding in [Encoding::Json, Encoding::Cbor] {
            let mut bytes = nlip::encode(&m, encoding);
            if !bytes.is_empty() {
                let i = cut.index(bytes.len());
                bytes[i] ^= flip;
                let _ = nlip::decode(&bytes, encoding, &Limits::default());
                let _ = nlip::decode(&bytes[..i], encoding, &Limits::default());
            }
        }
    }
}

/// A message whose content is `n` nulls in one array, in CBOR: one byte per null.
fn cbor_nulls(n: usize) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(n + 64);
    let value = ciborium::Value::Map(vec![
        (ciborium::Value::Text("format".into()), ciborium::Value::Text("structured".into())),
        (ciborium::Value::Text("subformat".into()), ciborium::Value::Text("json".into())),
        (ciborium::Value::Text("content".into()), ciborium::Value::Array(vec![ciborium::Value::Null; n])),
    ]);
    ciborium::ser::into_writer(&value, &mut bytes).unwrap();
    bytes
}

#[test]
fn the_values_of_a_message_are_counted_before_it_is_decoded() {
    let limits = Limits::default();
    let small = cbor_nulls(1_000);
    assert!(nlip::decode(&small, Encoding::Cbor, &limits).is_ok());
    let e = nlip::decode(&cbor_nulls(1_000_000), Encoding::Cbor, &limits).unwrap_err();
    assert_eq!(e.kind, NlipErrorKind::TooLarge, "{e}");
    assert!(e.message.contains("more than 100000 values (nlip.max_items)"), "{e}");
    let json_nulls =
        format!(r#"{{"format":"structured","subformat":"json","content":[{}0]}}"#, "0,".repeat(200_000));
    let e = nlip::decode(json_nulls.as_bytes(), Encoding::Json, &limits).unwrap_err();
    assert_eq!(e.kind, NlipErrorKind::TooLarge, "{e}");
    let tight = Limits { max_items: 7, ..limits };
    let seven = r#"{"format":"text","subformat":"english","content":"a,b:[c]"}"#;
    assert!(nlip::decode(seven.as_bytes(), Encoding::Json, &tight).is_ok(), "the map, 3 keys, 3 strings");
    let nine = r#"{"format":"text","subformat":"english","content":"a","label":"l"}"#;
    assert!(nlip::decode(nine.as_bytes(), Encoding::Json, &tight).is_err());
}

#[test]
fn a_small_cbor_message_of_a_million_nulls_is_refused_on_the_command_line() {
    use std::io::Write;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_silpgate"))
        .args(["nlip", "normalize", "--from", "cbor"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let bytes = cbor_nulls(1_000_000);
    assert!(bytes.len() <= 1 << 20, "within the byte limit: {}", bytes.len());
    child.stdin.take().unwrap().write_all(&bytes).unwrap();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("too_large") && err.contains("nlip.max_items"), "{err}");
}
