//! The SILP codec as MCP tools: `silp_compile`, `silp_decode`, `silp_validate`, `silp_hash`,
//! their JSON Schemas, and one call of each. A tool's failure is a tool error (`isError`) that
//! says `{code, message, span}`, as JSON in its text and in `_meta` under [`ERROR_META`]: the
//! SILP error code of draft §5.1 (or `invalid_arguments` for arguments the schema refuses), the
//! byte span in the text the caller gave (`null` when the error has no place), and what went
//! wrong. It has no structured content: that is held to the tool's `outputSchema`, which
//! describes what a tool returns when it works.

use crate::silp::validate::{self, ValidateOptions};
use crate::silp::{self, DecodeOptions, ErrorCode, Frontend, SilpError, schema};
use serde_json::{Map, Value, json};

/// The `_meta` key of a failed call's `{code, message, span}`.
pub(crate) const ERROR_META: &str = "silpgate/error";

/// Why a tool call failed, as its caller reads it.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub(crate) enum ToolError {
    #[error("{0}")]
    Silp(SilpError),
    #[error("invalid_arguments: {0}")]
    Arguments(String),
}

impl ToolError {
    /// The structured content of the tool error.
    pub(crate) fn to_value(&self) -> Value {
        match self {
            ToolError::Silp(e) => json!({
                "code": e.code.as_str(),
                "message": e.message,
                "span": e.span.as_ref().map(|s| json!([s.start, s.end])),
            }),
            ToolError::Arguments(why) => json!({"code": "invalid_arguments", "message": why, "span": null}),
        }
    }
}

/// The IR: a JSON object, or a JSON text of one (then error spans point into that text).
const IR_SCHEMA: &str =
    r#"{"description": "The SILP IR: a JSON object, or its JSON text", "type": ["object", "string"]}"#;

/// Every tool, as `tools/list` lists them.
pub(crate) fn list() -> Value {
    let ir: Value = serde_json::from_str(IR_SCHEMA).expect("the IR schema is JSON");
    let whitelist = json!({"type": "boolean", "default": true, "description": "refuse verbs outside the draft's whitelist"});
    let report = json!({"type": "object", "properties": {
        "valid": {"type": "boolean"}, "errors": {"type": "array", "items": {"type": "string"}},
        "warnings": {"type": "array", "items": {"type": "string"}},
        "warning_revisions": {"type": "array", "items": {"type": "string"}, "description": "the draft revision each warning comes from"}},
        "required": ["valid", "errors", "warnings", "warning_revisions"]});
    json!([
        {
            "name": "silp_compile",
            "description": "Compiles a SILP IR to a frontend's text (code, json, natural, nl_json) after validating it.",
            "inputSchema": {"type": "object", "properties": {
                "ir": ir,
                "frontend": {"type": "string", "enum": ["code", "json", "natural", "nl_json"], "default": "code"},
                "whitelist": whitelist,
            }, "required": ["ir"]},
            "outputSchema": {"type": "object", "properties": {
                "output": {"type": "string"}, "frontend": {"type": "string"}, "ir_hash": {"type": "string"},
                "warnings": {"type": "array", "items": {"type": "string"}}}, "required": ["output", "frontend", "ir_hash", "warnings"]},
        },
        {
            "name": "silp_decode",
            "description": "Decodes SILP text (code or json frontend) to the IR, sanitising it first; reports what the sanitiser changed.",
            "inputSchema": {"type": "object", "properties": {
                "text": {"type": "string"},
                "frontend": {"type": "string", "enum": ["code", "json"], "default": "code"},
            }, "required": ["text"]},
            "outputSchema": {"type": "object", "properties": {
                "ir": {"type": "object"}, "notices": {"type": "array", "items": {"type": "string"}}}, "required": ["ir", "notices"]},
        },
        {
            "name": "silp_validate",
            "description": "Validates a SILP IR: the schema, then the draft's rules; errors make it invalid, warnings do not.",
            "inputSchema": {"type": "object", "properties": {"ir": ir, "whitelist": whitelist}, "required": ["ir"]},
            "outputSchema": report,
        },
        {
            "name": "silp_hash",
            "description": "The IR hash of a schema-valid SILP IR (SHA-256 of its canonical JSON).",
            "inputSchema": {"type": "object", "properties": {"ir": ir}, "required": ["ir"]},
            "outputSchema": {"type": "object", "properties": {"ir_hash": {"type": "string"}}, "required": ["ir_hash"]},
        },
    ])
}

/// Calls tool `name`: its structured result, or why it failed. `None`: no such tool. An IR
/// without `meta.req_id` gets one of `req_id_len` characters, as the NLIP door gives it.
pub(crate) fn call(
    name: &str,
    arguments: &Map<String, Value>,
    req_id_len: usize,
) -> Option<Result<Value, ToolError>> {
    Some(match name {
        "silp_compile" => compile(arguments, req_id_len),
        "silp_decode" => decode(arguments),
        "silp_validate" => validate(arguments),
        "silp_hash" => hash(arguments),
        _ => return None,
    })
}

fn compile(arguments: &Map<String, Value>, req_id_len: usize) -> Result<Value, ToolError> {
    let ir = crate::gateway::payload::parse_ir(&ir_of(arguments)?, req_id_len).map_err(ToolError::Silp)?;
    let frontend = frontend_of(arguments)?;
    let mut report = validate::validate(&ir, rules_of(arguments)?);
    report.warnings.extend(silp::draft02::warnings(&ir));
    if !report.valid {
        let message = format!("IR is not valid: {}", report.errors.join("; "));
        return Err(ToolError::Silp(SilpError::new(ErrorCode::DecodeFailed, message)));
    }
    let output = silp::compile(&ir, frontend);
    Ok(
        json!({"output": output, "frontend": frontend.to_string(), "ir_hash": ir.ir_hash(), "warnings": report.warnings}),
    )
}

fn decode(arguments: &Map<String, Value>) -> Result<Value, ToolError> {
    let text = string_of(arguments, "text")?.ok_or_else(|| missing("text"))?;
    let frontend = frontend_of(arguments)?;
    let decoded = silp::decode(text, frontend, &DecodeOptions::default()).map_err(ToolError::Silp)?;
    let notices: Vec<String> = decoded.notices.iter().map(ToString::to_string).collect();
    Ok(json!({"ir": decoded.ir.to_value(), "notices": notices}))
}

fn validate(arguments: &Map<String, Value>) -> Result<Value, ToolError> {
    let value = ir_of(arguments)?;
    let mut report = validate::validate_value(&value, rules_of(arguments)?);
    if report.valid
        && let Ok(ir) = schema::parse_ir(&value)
    {
        report.warnings.extend(silp::draft02::warnings(&ir));
    }
    let revisions: Vec<&str> = report.warnings.iter().map(|w| silp::draft02::revision_of(w)).collect();
    let mut shown = serde_json::to_value(&report).map_err(|e| ToolError::Arguments(e.to_string()))?;
    shown["warning_revisions"] = json!(revisions);
    Ok(shown)
}

fn hash(arguments: &Map<String, Value>) -> Result<Value, ToolError> {
    let ir = schema::parse_ir(&ir_of(arguments)?).map_err(ToolError::Silp)?;
    Ok(json!({"ir_hash": ir.ir_hash()}))
}

fn missing(name: &str) -> ToolError {
    ToolError::Arguments(format!("the argument '{name}' is required"))
}

fn string_of<'a>(arguments: &'a Map<String, Value>, name: &str) -> Result<Option<&'a str>, ToolError> {
    match arguments.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(ToolError::Arguments(format!("the argument '{name}' must be a string"))),
    }
}

/// The `ir` argument as JSON; a JSON text is parsed, with error spans into it.
fn ir_of(arguments: &Map<String, Value>) -> Result<Value, ToolError> {
    match arguments.get("ir") {
        None | Some(Value::Null) => Err(missing("ir")),
        Some(Value::String(text)) => silp::parse_json(text).map_err(ToolError::Silp),
        Some(value @ Value::Object(_)) => Ok(value.clone()),
        Some(_) => Err(ToolError::Arguments("the argument 'ir' must be an object or its JSON text".into())),
    }
}

fn frontend_of(arguments: &Map<String, Value>) -> Result<Frontend, ToolError> {
    let name = string_of(arguments, "frontend")?.unwrap_or("code");
    name.parse::<Frontend>().map_err(ToolError::Silp)
}

fn rules_of(arguments: &Map<String, Value>) -> Result<ValidateOptions, ToolError> {
    match arguments.get("whitelist") {
        None | Some(Value::Null) => Ok(ValidateOptions::default()),
        Some(Value::Bool(on)) => Ok(ValidateOptions { enforce_whitelist: *on }),
        Some(_) => Err(ToolError::Arguments("the argument 'whitelist' must be true or false".into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(value: Value) -> Map<String, Value> {
        value.as_object().cloned().unwrap()
    }

    /// As on the NLIP door, an IR without `meta.req_id` is given one (derived from the IR):
    /// it compiles.
    #[test]
    fn an_ir_without_a_req_id_compiles_as_at_the_nlip_door() {
        let decoded = call("silp_decode", &args(json!({"text": "cancel(order1)"})), 8).unwrap().unwrap();
        let mut ir = decoded["ir"].clone();
        ir["meta"].as_object_mut().unwrap().remove("req_id");
        let compiled = call("silp_compile", &args(json!({ "ir": ir })), 8).unwrap();
        assert_eq!(compiled.unwrap()["output"], "cancel(order1)");
    }

    #[test]
    fn decode_then_compile_then_hash_agree() {
        let decoded = call("silp_decode", &args(json!({"text": "cancel(order1)"})), 8).unwrap().unwrap();
        let compiled = call("silp_compile", &args(json!({"ir": decoded["ir"]})), 8).unwrap().unwrap();
        assert_eq!(compiled["output"], "cancel(order1)");
        let hashed = call("silp_hash", &args(json!({"ir": decoded["ir"].to_string()})), 8).unwrap().unwrap();
        assert_eq!(hashed["ir_hash"], compiled["ir_hash"]);
        let report = call("silp_validate", &args(json!({"ir": decoded["ir"]})), 8).unwrap().unwrap();
        assert_eq!(report["valid"], true);
    }

    #[test]
    fn failures_carry_the_silp_code_and_span() {
        let error = call("silp_decode", &args(json!({"text": "cancel(order1"})), 8).unwrap().unwrap_err();
        assert_eq!(error.to_value()["code"], "invalid_syntax");
        assert!(error.to_value()["span"].is_array(), "{:?}", error.to_value());
        let error = call("silp_hash", &args(json!({"ir": "{\"silp\": "})), 8).unwrap().unwrap_err();
        assert_eq!(error.to_value()["code"], "invalid_syntax");
        let error =
            call("silp_compile", &args(json!({"ir": {}, "frontend": "klingon"})), 8).unwrap().unwrap_err();
        assert!(
            ["decode_failed", "unsupported_frontend"].contains(&error.to_value()["code"].as_str().unwrap())
        );
        let error = call("silp_validate", &args(json!({"ir": 5})), 8).unwrap().unwrap_err();
        assert_eq!(error.to_value()["code"], "invalid_arguments");
        assert!(call("silp_nothing", &Map::new(), 8).is_none());
        assert_eq!(list().as_array().unwrap().len(), 4);
    }
}
