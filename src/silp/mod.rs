//! The SILP payload codec (Semantic Interlingua Layer Protocol, draft-00): the IR, its schema
//! and validator, the sanitiser, and the frontends that compile the IR to text and decode text
//! back. It knows nothing about NLIP or any transport.
//!
//! ```
//! use silpgate::silp::{self, Frontend, DecodeOptions};
//! let decoded = silp::decode("if !rain(t+1): start(hike)", Frontend::Code, &DecodeOptions::default()).unwrap();
//! assert_eq!(decoded.ir.intent, "!START");
//! assert_eq!(silp::compile(&decoded.ir, Frontend::Code), "if !rain(t+1): start(hike)");
//! ```

pub(crate) mod draft02;
pub mod equivalence;
pub(crate) mod error;
pub(crate) mod frontend;
pub mod ir;
pub(crate) mod req_id;
pub mod sanitize;
pub mod schema;
pub mod tokens;
pub mod tree;
pub mod typed;
pub mod validate;
pub mod whitelist;

pub use error::{ErrorCode, SilpError};
pub use frontend::Frontend;
pub use ir::Ir;
pub use req_id::ReqIdMode;
pub use sanitize::Notice;

use ir::{IR_VERSION, Meta, SILP_VERSION};

/// Decoder settings.
#[derive(Debug, Clone, Copy)]
pub struct DecodeOptions {
    /// Strip invisible characters and map look-alike identifiers (default: on).
    pub sanitize: bool,
    /// How `meta.req_id` is derived.
    pub req_id: ReqIdMode,
    /// Payloads longer than this many bytes are refused (default: 1 MiB).
    pub max_input_bytes: usize,
}

impl Default for DecodeOptions {
    fn default() -> Self {
        DecodeOptions { sanitize: true, req_id: ReqIdMode::default(), max_input_bytes: 1 << 20 }
    }
}

/// A decoded payload and what the sanitiser changed on the way.
#[derive(Debug, Clone)]
pub struct Decoded {
    pub ir: Ir,
    pub notices: Vec<Notice>,
}

/// Compiles an IR (already schema-checked) to `frontend`'s text.
pub fn compile(ir: &Ir, frontend: Frontend) -> String {
    match frontend {
        Frontend::Code => frontend::code::write::compile(ir),
        Frontend::Json => frontend::json::compile(ir),
        Frontend::Natural => frontend::natural::compile(ir),
        Frontend::NlJson => frontend::natural::compile_nl_json(ir),
    }
}

/// Decodes `text` written in `frontend` back to an IR.
pub fn decode(text: &str, frontend: Frontend, options: &DecodeOptions) -> Result<Decoded, SilpError> {
    if text.len() > options.max_input_bytes {
        return Err(SilpError::at(
            ErrorCode::InvalidSyntax,
            options.max_input_bytes..text.len(),
            format!("payload is {} bytes; the limit is {} bytes", text.len(), options.max_input_bytes),
        ));
    }
    let mut notices = Vec::new();
    let stripped = if options.sanitize {
        sanitize::strip_invisible(text, &mut notices)
    } else {
        sanitize::Stripped::unchanged(text)
    };
    let to_original = |mut e: SilpError| {
        e.span = e.span.map(|s| stripped.original_offset(s.start)..stripped.original_offset(s.end));
        e
    };
    let first_mapped = notices.len();
    let (ir, hashed) = match frontend {
        Frontend::Code => {
            let parsed = frontend::code::read::parse(&stripped.text, &mut notices).map_err(to_original)?;
            let hashed = match (options.req_id, parsed.else_at) {
                (ReqIdMode::Reference, Some(at)) => text[..stripped.original_offset(at)].trim(),
                (ReqIdMode::Reference, None) => text.trim(),
                (ReqIdMode::Hash { .. }, _) => text.trim(),
            };
            let mut meta = Meta::with_req_id(ir::Text::default());
            if parsed.sequential {
                meta.seq.push(ir::Text::const_new("sequential"));
            }
            (assemble(parsed.intent, parsed.entities, parsed.constraints, parsed.alternatives, meta), hashed)
        }
        Frontend::Json => {
            let parsed = frontend::json::read(&stripped.text, &mut notices).map_err(to_original)?;
            let hashed = match options.req_id {
                ReqIdMode::Reference => text,
                ReqIdMode::Hash { .. } => text.trim(),
            };
            let meta = Meta::with_req_id(ir::Text::default());
            (assemble(parsed.intent, parsed.entities, parsed.constraints, parsed.alternatives, meta), hashed)
        }
        Frontend::Natural | Frontend::NlJson => {
            return Err(SilpError::new(
                ErrorCode::UnsupportedFrontend,
                format!(
                    "frontend '{frontend}' is a compile-only baseline and cannot be decoded; use code or json"
                ),
            ));
        }
    };
    for n in &mut notices[first_mapped..] {
        if let Notice::HomoglyphMapped { offset, .. } = n {
            *offset = stripped.original_offset(*offset);
        }
    }
    let mut ir = ir;
    ir.meta.req_id = match options.req_id {
        ReqIdMode::Hash { len } => req_id::req_id(hashed, len),
        ReqIdMode::Reference => req_id::req_id(hashed, 4),
    };
    Ok(Decoded { ir, notices })
}

fn assemble(
    intent: ir::Text,
    entities: Vec<ir::Entity>,
    constraints: Vec<ir::Constraint>,
    alternatives: Vec<ir::Alternative>,
    meta: Meta,
) -> Ir {
    Ir {
        silp: ir::Text::const_new(SILP_VERSION),
        version: ir::Text::const_new(IR_VERSION),
        intent,
        entities,
        constraints,
        alternatives,
        meta,
    }
}

/// Parses a JSON document; a syntax error becomes `invalid_syntax` with the byte span of the
/// place serde_json stopped at.
pub(crate) fn parse_json(text: &str) -> Result<serde_json::Value, SilpError> {
    serde_json::from_str(text).map_err(|e| {
        let at = offset_of(text, e.line(), e.column());
        SilpError::syntax(char_span(text, at), format!("invalid JSON: {}", json_error_text(&e)))
    })
}

/// The span of the character at byte `at` (empty at the end of `text`), never splitting it.
pub(crate) fn char_span(text: &str, at: usize) -> std::ops::Range<usize> {
    let mut start = at.min(text.len());
    while !text.is_char_boundary(start) {
        start -= 1;
    }
    start..text[start..].chars().next().map_or(start, |c| start + c.len_utf8())
}

/// Byte offset of a 1-based line and column (as serde_json reports them, column in bytes).
pub(crate) fn offset_of(text: &str, line: usize, column: usize) -> usize {
    let line_start: usize = text.split_inclusive('\n').take(line.saturating_sub(1)).map(str::len).sum();
    (line_start + column.saturating_sub(1)).min(text.len())
}

fn json_error_text(e: &serde_json::Error) -> String {
    let text = e.to_string();
    match text.find(" at line ") {
        Some(i) => text[..i].to_owned(),
        None => text,
    }
}
