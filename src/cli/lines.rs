//! The contract every `silpgate silp` command keeps: one document in and one result out, or
//! with `--lines` one JSON value per input line and one `{"ok":..}` or `{"error":..}` per
//! output line, each input bounded in size.

use super::EXIT_INVALID;
use super::input::{self, InputError};
use crate::silp::{ErrorCode, SilpError};
use clap::Args;
use serde_json::{Value, json};
use std::io::{self, Write};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Debug, Args)]
pub struct Common {
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
pub(super) fn drive(
    common: &Common,
    each: impl Fn(&str) -> Outcome,
    ok_value: impl Fn(String) -> Value,
) -> ExitCode {
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
    let stdout = io::stdout();
    let mut out = io::BufWriter::new(stdout.lock());
    while let Some(line) = input::next_line(&mut *reader, common.max_input_bytes) {
        let result = match line {
            Ok(line) => one_line(&line, &each, &ok_value),
            Err(InputError::Io(e)) => {
                eprintln!("error: cannot read input: {e}");
                return ExitCode::from(EXIT_INVALID);
            }
            Err(e) => error_line(ErrorCode::InvalidSyntax, &e.to_string()),
        };
        if writeln!(out, "{result}").is_err() {
            return ExitCode::from(EXIT_INVALID);
        }
    }
    if out.flush().is_err() {
        return ExitCode::from(EXIT_INVALID);
    }
    ExitCode::SUCCESS
}

/// One `--lines` line: compile takes an IR object, decode a JSON string holding the text.
fn one_line(line: &str, each: &impl Fn(&str) -> Outcome, ok_value: &impl Fn(String) -> Value) -> Value {
    let value: Value = match serde_json::from_str(line) {
        Ok(v) => v,
        Err(e) => return error_line(ErrorCode::InvalidSyntax, &format!("line is not JSON: {e}")),
    };
    let text = match &value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    match each(&text) {
        Ok((out, _)) => json!({ "ok": ok_value(out) }),
        Err(e) => error_line(e.code, &e.message),
    }
}

fn error_line(code: ErrorCode, message: &str) -> Value {
    json!({ "error": { "code": code.as_str(), "message": message } })
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
