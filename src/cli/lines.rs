//! The contract every `silpgate silp` command keeps: one document in and one result out, or
//! with `--lines` one JSON value per input line and one `{"ok":..}` or `{"error":..}` per
//! output line, each input bounded in size.

use super::EXIT_INVALID;
use super::input::{self, InputError};
use crate::silp::{ErrorCode, SilpError};
use crate::util::json_text;
use clap::Args;
use serde_json::Value;
use std::io::{self, Write};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Debug, Args)]
pub(super) struct Common {
    /// Frontend: code, json, natural or nl_json.
    #[arg(long, short)]
    pub(super) frontend: String,
    /// One JSON value per input line, one {"ok":..} or {"error":..} per output line.
    #[arg(long)]
    pub(super) lines: bool,
    /// Refuse inputs (or lines) larger than this many bytes.
    #[arg(long, default_value_t = 1 << 20)]
    pub(super) max_input_bytes: usize,
    /// Input file; stdin when absent or '-'.
    pub(super) file: Option<PathBuf>,
}

/// What one input produced: the output, warnings for stderr, or an error.
pub(super) type Outcome = Result<(String, Vec<String>), SilpError>;

/// Runs `each` over the whole input or over every line, writing results as the command
/// contract says.
pub(super) fn drive(common: &Common, each: impl Fn(&str) -> Outcome, ok: OkForm) -> ExitCode {
    let mut reader = match input::open(common.file.as_deref()) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot open input: {e}");
            return ExitCode::from(EXIT_INVALID);
        }
    };
    if !common.lines {
        let text = match input::read_all(&mut *reader, common.max_input_bytes) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::from(EXIT_INVALID);
            }
        };
        let text = text.strip_suffix('\n').map(|t| t.strip_suffix('\r').unwrap_or(t)).unwrap_or(&text);
        return match each(text) {
            Ok((out, warnings)) => {
                for w in warnings {
                    eprintln!("warning: {w}");
                }
                println!("{out}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("{}", e.render(text));
                ExitCode::from(EXIT_INVALID)
            }
        };
    }
    // Result lines are assembled in one buffer and written in large chunks: no syscall and no
    // formatting machinery per line.
    let stdout = io::stdout();
    let mut out = stdout.lock();
    let mut buffer = String::with_capacity(OUTPUT_CHUNK + 4096);
    let mut lines = input::Lines::new(reader, common.max_input_bytes);
    while let Some(line) = lines.next_line() {
        match line {
            Ok(line) => one_line(&mut buffer, line, &each, ok),
            Err(InputError::Io(e)) => {
                eprintln!("error: cannot read input: {e}");
                return ExitCode::from(EXIT_INVALID);
            }
            Err(e) => error_line(&mut buffer, ErrorCode::InvalidSyntax, &e.to_string()),
        }
        buffer.push('\n');
        if buffer.len() >= OUTPUT_CHUNK {
            if out.write_all(buffer.as_bytes()).is_err() {
                return ExitCode::from(EXIT_INVALID);
            }
            buffer.clear();
        }
    }
    if out.write_all(buffer.as_bytes()).and_then(|()| out.flush()).is_err() {
        return ExitCode::from(EXIT_INVALID);
    }
    ExitCode::SUCCESS
}

/// Output is handed to stdout once this many bytes have gathered.
const OUTPUT_CHUNK: usize = 64 * 1024;

/// What a command's `ok` output is, which also says how it reads a line that is not a string.
#[derive(Debug, Clone, Copy)]
pub(super) enum OkForm {
    /// Surface text, written as a JSON string; the input is an IR, read from the line as is.
    Text,
    /// A canonical compact IR; the input's exact bytes matter (they are hashed).
    IrJson,
    /// A JSON document serde_json printed; the input's exact bytes matter (they are counted).
    Json,
}

/// One `--lines` line: compile takes an IR object, decode a JSON string holding the text.
///
/// The line is judged as it stands, with no JSON tree: a string is unescaped (borrowed when it
/// has no escapes); compile reads an object line's own text, which means the same as the
/// tree's re-serialisation. Decode hashes its input for `meta.req_id`, so a non-string line
/// goes through the tree there, as does any line the command refuses, so that the error says
/// what it always said.
fn one_line(buffer: &mut String, line: &str, each: &impl Fn(&str) -> Outcome, ok: OkForm) {
    let result = if line.trim_start().starts_with('"') {
        match serde_json::from_str::<std::borrow::Cow<str>>(line) {
            Ok(text) => each(&text),
            Err(e) => return error_line(buffer, ErrorCode::InvalidSyntax, &format!("line is not JSON: {e}")),
        }
    } else if matches!(ok, OkForm::Text) {
        match each(line) {
            Ok(done) => Ok(done),
            Err(e) => match serde_json::from_str::<serde::de::IgnoredAny>(line) {
                Ok(_) => Err(e),
                Err(e) => {
                    return error_line(buffer, ErrorCode::InvalidSyntax, &format!("line is not JSON: {e}"));
                }
            },
        }
    } else {
        let value: Value = match serde_json::from_str(line) {
            Ok(v) => v,
            Err(e) => return error_line(buffer, ErrorCode::InvalidSyntax, &format!("line is not JSON: {e}")),
        };
        each(&value.to_string())
    };
    match result {
        Ok((output, _)) => {
            buffer.push_str("{\"ok\":");
            match ok {
                OkForm::Text => json_text::write_str(buffer, &output),
                OkForm::IrJson => write_ir_json(buffer, &output),
                OkForm::Json => buffer.push_str(&output),
            }
            buffer.push('}');
        }
        Err(e) => error_line(buffer, e.code, &e.message),
    }
}

/// Writes a compact IR as serde_json prints it. The canonical form spells floats as pydantic
/// does; the two differ only in exponent notation, so a text with an exponent is reprinted.
fn write_ir_json(buffer: &mut String, compact: &str) {
    if has_exponent(compact) {
        let value: Value = serde_json::from_str(compact).expect("compact IR is JSON");
        buffer.push_str(&value.to_string());
    } else {
        buffer.push_str(compact);
    }
}

/// True when a number outside the strings of JSON `text` has an exponent.
fn has_exponent(text: &str) -> bool {
    let mut in_string = false;
    let mut escaped = false;
    for b in text.bytes() {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
        } else {
            match b {
                b'"' => in_string = true,
                b'e' | b'E' => return true,
                _ => {}
            }
        }
    }
    false
}

fn error_line(buffer: &mut String, code: ErrorCode, message: &str) {
    buffer.push_str("{\"error\":{\"code\":\"");
    buffer.push_str(code.as_str());
    buffer.push_str("\",\"message\":");
    json_text::write_str(buffer, message);
    buffer.push_str("}}");
}

pub(super) fn read_document(file: Option<PathBuf>, limit: usize) -> Option<String> {
    let mut reader = match input::open(file.as_deref()) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot open input: {e}");
            return None;
        }
    };
    match input::read_all(&mut *reader, limit) {
        Ok(t) => Some(t),
        Err(e) => {
            eprintln!("error: {e}");
            None
        }
    }
}
