//! The draft's normative JSON Schema for the IR (shipped as `schema/silp-ir.schema.json`) and
//! the check every IR passes before it is processed, as draft §3.9 requires.

use super::error::{ErrorCode, SilpError};
use super::ir::{Ir, SILP_VERSION};
use serde_json::Value;
use std::sync::OnceLock;

/// The schema text, as shipped.
pub(crate) const SCHEMA_JSON: &str = include_str!("schema/silp-ir.schema.json");

/// One way an IR breaks the schema: where (`meta.req_id`, `entities[0].id`) and what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub path: String,
    pub message: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

fn validator() -> &'static jsonschema::Validator {
    static VALIDATOR: OnceLock<jsonschema::Validator> = OnceLock::new();
    VALIDATOR.get_or_init(|| {
        let schema: Value = serde_json::from_str(SCHEMA_JSON).expect("shipped schema is JSON");
        jsonschema::validator_for(&schema).expect("shipped schema compiles")
    })
}

/// Every schema violation of `value`, in document order.
pub fn violations(value: &Value) -> Vec<Violation> {
    validator()
        .iter_errors(value)
        .map(|e| Violation { path: dotted_path(e.instance_path().as_str()), message: e.to_string() })
        .collect()
}

/// Checks `value` against the schema and the supported version, then builds the IR: the typed
/// reader ([`super::typed`]) when it accepts the value, else the schema validator, which
/// decides and names the first violation by its JSON path.
pub fn parse_ir(value: &Value) -> Result<Ir, SilpError> {
    match super::tree::from_value(value) {
        Ok(ir) => {
            check_version(&ir)?;
            Ok(ir)
        }
        Err(_) => parse_ir_checked(value),
    }
}

/// [`parse_ir`] for an IR that names no `meta.req_id`, with `req_id` assigned to it: the typed
/// reader takes it as it is; only an IR it refuses is copied, given the `req_id`, and checked
/// by the schema validator (so that the error is the one the IR with its `req_id` has).
pub(crate) fn parse_ir_assigning(value: &Value, req_id: &str) -> Result<Ir, SilpError> {
    match super::tree::from_value_assigning(value, req_id) {
        Ok(ir) => {
            check_version(&ir)?;
            Ok(ir)
        }
        Err(_) => {
            let mut value = value.clone();
            if let Some(object) = value.as_object_mut() {
                let meta = object.entry("meta").or_insert_with(|| Value::Object(Default::default()));
                if let Value::Object(meta) = meta {
                    meta.insert("req_id".into(), Value::String(req_id.into()));
                }
            }
            parse_ir_checked(&value)
        }
    }
}

/// Reads and checks an IR from JSON text: the typed reader ([`super::typed`]) when it accepts
/// the text, otherwise the JSON tree and the schema validator, which decide and word the error
/// (a syntax error with its span, or the first violation with its JSON path).
pub fn parse_ir_text(text: &str) -> Result<Ir, SilpError> {
    match super::typed::read(text) {
        Ok(ir) => {
            check_version(&ir)?;
            Ok(ir)
        }
        Err(_) => parse_ir_checked(&super::parse_json(text)?),
    }
}

/// The tree path alone: the schema validator decides, the IR is built from the checked tree.
fn parse_ir_checked(value: &Value) -> Result<Ir, SilpError> {
    // The boolean check stops at the first failure and builds no error values.
    if !validator().is_valid(value)
        && let Some(first) = violations(value).into_iter().next()
    {
        return Err(SilpError::new(
            ErrorCode::DecodeFailed,
            format!("IR does not match the SILP schema at {first}"),
        ));
    }
    let ir = Ir::from_schema_valid(value);
    check_version(&ir)?;
    Ok(ir)
}

/// `unsupported_version` for any `silp` other than the one this crate speaks.
pub(crate) fn check_version(ir: &Ir) -> Result<(), SilpError> {
    if ir.silp == SILP_VERSION {
        return Ok(());
    }
    Err(SilpError::new(
        ErrorCode::UnsupportedVersion,
        format!("silp version '{}' is not supported; this receiver speaks '{SILP_VERSION}'", ir.silp),
    ))
}

/// `/entities/0/id` -> `entities[0].id`; the root is `(root)`.
fn dotted_path(pointer: &str) -> String {
    let mut out = String::new();
    for segment in pointer.split('/').skip(1) {
        let segment = segment.replace("~1", "/").replace("~0", "~");
        if !segment.is_empty() && segment.bytes().all(|b| b.is_ascii_digit()) {
            out.push('[');
            out.push_str(&segment);
            out.push(']');
        } else {
            if !out.is_empty() {
                out.push('.');
            }
            out.push_str(&segment);
        }
    }
    if out.is_empty() { "(root)".to_owned() } else { out }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn violations_name_the_json_path() {
        let v = violations(
            &json!({"intent": "!CANCEL", "entities": [{"id": 5, "value": "x"}], "meta": {"req_id": "ab"}}),
        );
        let paths: Vec<_> = v.iter().map(|v| v.path.as_str()).collect();
        assert!(paths.contains(&"entities[0].id"), "{v:?}");
        assert!(paths.contains(&"meta.req_id"), "{v:?}");
    }

    #[test]
    fn unknown_root_fields_are_rejected() {
        let v = violations(&json!({"intent": "!CANCEL", "meta": {"req_id": "abcd"}, "extra": 1}));
        assert_eq!(v.len(), 1);
        assert!(v[0].message.contains("extra"), "{}", v[0]);
    }

    #[test]
    fn other_versions_are_unsupported() {
        let err =
            parse_ir(&json!({"silp": "v2", "intent": "!CANCEL", "meta": {"req_id": "abcd"}})).unwrap_err();
        assert_eq!(err.code, ErrorCode::UnsupportedVersion);
    }
}
