//! The SILP-in-NLIP convention (DESIGN.md): which submessages hold SILP payloads, how each is
//! read into an IR, and how an IR is written back in the form a receiver gets. A `silp-*`
//! subformat is SILP under any `format` (it is read and validated, or refused).
//!
//! | payload          | format       | subformat   | content        |
//! |------------------|--------------|-------------|----------------|
//! | IR               | `structured` | `silp-ir`   | IR JSON object |
//! | code frontend    | `structured` | `silp-code` | string         |
//! | json frontend    | `structured` | `silp-json` | JSON object    |
//! | natural frontend | `text`       | `english`   | string         |
//! | nl_json frontend | `structured` | `json`      | `{"task_description": ..}` |

use crate::nlip::{Content, Format};
use crate::silp::ir::Ir;
use crate::silp::{
    self, DecodeOptions, ErrorCode, Frontend, Notice, SilpError, sanitize, schema, tree, typed,
};
use crate::util::hash::sha256_hex;
use serde_json::Value;

/// A SILP payload form silpgate can read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SilpForm {
    Ir,
    Code,
    Json,
}

/// What a receiver gets: the IR itself or one frontend's text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OutputForm {
    Ir,
    Surface(Frontend),
}

/// Subformats with this prefix are SILP, whatever the `format` beside them says.
const SILP_PREFIX: &str = "silp-";

/// The SILP form a (sub)message holds, by its subformat: a `silp-*` subformat is SILP under any
/// `format`, so that it cannot be slipped past the validator as `text` or `generic`; the format
/// is left as sent, since the form is what decides how the content is read.
///
/// # Errors
/// `unsupported_frontend` for a `silp-*` subformat silpgate cannot read: forwarding it
/// unchecked would let a payload past the validator under a name nobody reads.
pub(crate) fn silp_form(subformat: &str) -> Result<Option<SilpForm>, SilpError> {
    // Read as a receiver would read it: `" silp-code"` is SILP code, and is validated as such.
    let subformat = subformat.trim();
    let is_silp = subformat.get(..SILP_PREFIX.len()).is_some_and(|p| p.eq_ignore_ascii_case(SILP_PREFIX));
    if !is_silp {
        return Ok(None);
    }
    if subformat.eq_ignore_ascii_case("silp-ir") {
        Ok(Some(SilpForm::Ir))
    } else if subformat.eq_ignore_ascii_case("silp-code") {
        Ok(Some(SilpForm::Code))
    } else if subformat.eq_ignore_ascii_case("silp-json") {
        Ok(Some(SilpForm::Json))
    } else {
        let shown: String = subformat.chars().take(64).collect();
        Err(SilpError::new(
            ErrorCode::UnsupportedFrontend,
            format!("subformat '{shown}' is not a SILP form silpgate reads (silp-ir, silp-code, silp-json)"),
        ))
    }
}

/// The form an asker reads answers in: the form of its request's first SILP payload, or the
/// natural-language rendering when it sent none (plain NLIP text).
pub(crate) fn answer_form(request: &crate::nlip::Message) -> OutputForm {
    let top = std::iter::once(request.subformat.as_str());
    let subs = request.submessages().iter().map(|s| s.subformat.as_str());
    match top.chain(subs).find_map(|subformat| silp_form(subformat).ok().flatten()) {
        Some(SilpForm::Ir) => OutputForm::Ir,
        Some(SilpForm::Code) => OutputForm::Surface(Frontend::Code),
        Some(SilpForm::Json) => OutputForm::Surface(Frontend::Json),
        None => OutputForm::Surface(Frontend::Natural),
    }
}

/// A payload read into an IR.
pub struct ReadPayload {
    pub ir: Ir,
    pub notices: Vec<Notice>,
    /// The sender set `meta.out` explicitly (only an IR payload can).
    pub explicit_out: Option<Frontend>,
    /// When the sanitiser changed the payload: its text before and after the change (for an
    /// IR, its JSON), so that what the change did to tokenization can be counted.
    pub sanitized: Option<(String, String)>,
}

/// Reads the payload `content` in `form`. `req_id_len` is used when an IR arrives without a
/// `meta.req_id`.
pub fn read(
    form: SilpForm,
    content: &Content,
    options: &DecodeOptions,
    req_id_len: usize,
) -> Result<ReadPayload, SilpError> {
    if let (SilpForm::Ir, Content::Raw(raw)) = (form, content)
        && let Some(read) = read_plain_ir_text(raw.get())?
    {
        return Ok(read);
    }
    let Some(value) = content.json() else {
        return Err(SilpError::new(ErrorCode::InvalidSyntax, "a SILP payload cannot be binary content"));
    };
    let value = &*value;
    match form {
        SilpForm::Ir => {
            if let Some(read) = read_plain_ir(value)? {
                return Ok(read);
            }
            if !value.is_object() {
                return Err(SilpError::new(
                    ErrorCode::InvalidSyntax,
                    "a silp-ir payload must be a JSON object",
                ));
            }
            // The IR has no text to strip before it is parsed: its keys and strings are
            // sanitised instead, so that no form carries invisible characters past the sanitiser.
            let mut notices = Vec::new();
            let sanitized =
                if options.sanitize { sanitize::strip_invisible_json(value, &mut notices)? } else { None };
            let value = sanitized.as_ref().unwrap_or(value);
            let meta = value.get("meta");
            let explicit_out =
                meta.and_then(|m| m.get("out")).and_then(Value::as_str).and_then(|o| o.parse().ok());
            let ir = parse_ir(value, req_id_len)?;
            let sanitized = sanitized.as_ref().map(|after| (value.to_string(), after.to_string()));
            Ok(ReadPayload { ir, notices, explicit_out, sanitized })
        }
        SilpForm::Code => {
            let Value::String(text) = value else {
                return Err(SilpError::new(ErrorCode::InvalidSyntax, "a silp-code payload must be a string"));
            };
            let decoded = silp::decode(text, Frontend::Code, options)?;
            let sanitized = changed_text(text, &decoded.notices);
            Ok(ReadPayload { ir: decoded.ir, notices: decoded.notices, explicit_out: None, sanitized })
        }
        SilpForm::Json => {
            if !value.is_object() {
                return Err(SilpError::new(
                    ErrorCode::InvalidSyntax,
                    "a silp-json payload must be a JSON object",
                ));
            }
            // Re-serialised raw, so the sanitiser sees every invisible character.
            let text = serde_json::to_string(value).expect("a JSON value serialises");
            let decoded = silp::decode(&text, Frontend::Json, options)?;
            let sanitized = changed_text(&text, &decoded.notices);
            Ok(ReadPayload { ir: decoded.ir, notices: decoded.notices, explicit_out: None, sanitized })
        }
    }
}

/// The usual IR, read in one pass over its tree: schema-valid as sent, naming its own
/// `req_id`, every string ASCII (so nothing for the sanitiser to strip, on or off). `None`
/// for any other IR: the general path reads it, and words what is wrong with it.
fn read_plain_ir(value: &Value) -> Result<Option<ReadPayload>, SilpError> {
    let Ok(read) = tree::from_value_noting(value) else { return Ok(None) };
    plain(read)
}

/// [`read_plain_ir`] for an IR still in its text, read by the typed reader without a tree.
fn read_plain_ir_text(text: &str) -> Result<Option<ReadPayload>, SilpError> {
    let Ok(read) = typed::read_noting(text) else { return Ok(None) };
    plain(read)
}

fn plain((ir, noted): (Ir, tree::Noted)) -> Result<Option<ReadPayload>, SilpError> {
    if !ir.is_ascii() {
        return Ok(None);
    }
    schema::check_version(&ir)?;
    let explicit_out = if noted.out_given { ir.meta.out.parse().ok() } else { None };
    Ok(Some(ReadPayload { ir, notices: Vec::new(), explicit_out, sanitized: None }))
}

/// `text` before and after what the sanitiser's `notices` say it did: invisible characters
/// stripped, look-alike identifiers replaced by their ASCII reading. `None` when it did nothing.
fn changed_text(text: &str, notices: &[Notice]) -> Option<(String, String)> {
    if notices.is_empty() {
        return None;
    }
    let mut after = sanitize::strip_invisible(text, &mut Vec::new()).text.into_owned();
    for notice in notices {
        if let Notice::HomoglyphMapped { from, to, .. } = notice {
            after = after.replacen(from.as_str(), to, 1);
        }
    }
    Some((text.to_owned(), after))
}

/// The `req_id` given to an IR that names none: the first `len` hex digits of the SHA-256 of
/// the IR as received, so that a redelivered message gets the same one.
/// The IR `value`; one without `meta.req_id` gets one of `req_id_len` characters, derived from
/// the IR, so that the same IR gets the same id on every instance and every redelivery.
pub(crate) fn parse_ir(value: &Value, req_id_len: usize) -> Result<Ir, SilpError> {
    // A meta that is not an object is left for the schema to name.
    let meta = value.get("meta");
    let has_req_id = meta.is_some_and(|m| !m.is_object() || m.get("req_id").is_some());
    if has_req_id {
        schema::parse_ir(value)
    } else {
        schema::parse_ir_assigning(value, &derived_req_id(value, req_id_len))
    }
}

fn derived_req_id(value: &Value, len: usize) -> String {
    let mut hex = sha256_hex(value.to_string().as_bytes());
    hex.truncate(len);
    hex
}

/// `(format, subformat, content)` of an IR written in `form`; `text` is the compiled surface
/// text (through the compile.lock) for surface forms.
pub(crate) fn render(ir: &Ir, form: OutputForm, text: Option<String>) -> (Format, &'static str, Content) {
    match form {
        OutputForm::Ir => (Format::Structured, "silp-ir", Content::Json(ir.to_value())),
        OutputForm::Surface(frontend) => {
            let text = text.unwrap_or_else(|| silp::compile(ir, frontend));
            match frontend {
                Frontend::Code => (Format::Structured, "silp-code", Content::text(text)),
                Frontend::Natural => (Format::Text, "english", Content::text(text)),
                Frontend::Json => (Format::Structured, "silp-json", Content::Json(parse_own_json(&text))),
                Frontend::NlJson => (Format::Structured, "json", Content::Json(parse_own_json(&text))),
            }
        }
    }
}

fn parse_own_json(text: &str) -> Value {
    serde_json::from_str(text).expect("the json frontends write valid JSON")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_silp_subformat_with_surrounding_whitespace_is_still_silp_and_read_as_such() {
        assert!(matches!(silp_form(" silp-code"), Ok(Some(SilpForm::Code))));
        assert!(matches!(silp_form("\tsilp-ir\n"), Ok(Some(SilpForm::Ir))));
        assert!(silp_form(" silp-unknown").is_err(), "an unreadable silp-* is refused, spaces or not");
        assert!(matches!(silp_form(" english"), Ok(None)));
    }
}
