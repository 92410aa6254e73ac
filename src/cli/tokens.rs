//! `silpgate silp tokens ...`: what a payload costs in a model's tokens, per frontend, next to
//! its bytes and its natural-language baseline; and the draft's single-token verb claim.

use super::lines::{Common, OkForm, Outcome, drive};
use super::{EXIT_INVALID, EXIT_USAGE};
use crate::silp::tokens::{self, Tokenizer};
use crate::silp::{self, DecodeOptions, Frontend, schema};
use clap::Args;
use serde_json::{Map, Value, json};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Debug, Args)]
pub(super) struct TokensArgs {
    /// Tokenizer: o200k_base (GPT-4o family) or cl100k_base (GPT-3.5/4).
    #[arg(long)]
    tokenizer: String,
    /// `all`: the input is an IR and every frontend's output is measured. A lossless frontend
    /// (code, json): the input is text in it, decoded to its IR, and that IR is measured too.
    #[arg(long, short, default_value = "all")]
    frontend: String,
    /// Count the input exactly as it is, without parsing it (one final line ending aside, which
    /// every `silp` command drops from a whole-file input).
    #[arg(long, conflicts_with = "frontend")]
    text: bool,
    /// Check that every whitelisted verb is one token; print those that are not.
    #[arg(long, conflicts_with_all = ["text", "frontend", "lines", "file"])]
    verbs: bool,
    /// One JSON value per input line (an IR object, or a JSON string holding the text), one
    /// {"ok":..} or {"error":..} per output line.
    #[arg(long)]
    lines: bool,
    /// Refuse inputs (or lines) larger than this many bytes.
    #[arg(long, default_value_t = 1 << 20)]
    max_input_bytes: usize,
    /// Input file; stdin when absent or '-'.
    file: Option<PathBuf>,
}

/// What the input is.
#[derive(Clone, Copy)]
enum Input {
    Ir,
    Surface(Frontend),
    Text,
}

pub(super) fn run(args: TokensArgs) -> ExitCode {
    let tokenizer = match args.tokenizer.parse::<Tokenizer>() {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: --tokenizer: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    if args.verbs {
        return verbs(tokenizer);
    }
    let input = if args.text {
        Input::Text
    } else if args.frontend == "all" {
        Input::Ir
    } else {
        match args.frontend.parse::<Frontend>() {
            Ok(f) if f.is_lossless() => Input::Surface(f),
            Ok(f) => {
                eprintln!(
                    "error[unsupported_frontend]: frontend '{f}' cannot be decoded; measure its text with --text"
                );
                return ExitCode::from(EXIT_USAGE);
            }
            Err(e) => {
                eprintln!("{}", e.render(""));
                return ExitCode::from(EXIT_USAGE);
            }
        }
    };
    let common = Common {
        frontend: args.frontend,
        lines: args.lines,
        max_input_bytes: args.max_input_bytes,
        file: args.file,
    };
    let options = DecodeOptions { max_input_bytes: args.max_input_bytes, ..DecodeOptions::default() };
    drive(&common, |text| measure(text, input, tokenizer, &options), OkForm::Json)
}

fn measure(text: &str, input: Input, tokenizer: Tokenizer, options: &DecodeOptions) -> Outcome {
    let mut report = Map::new();
    report.insert("tokenizer".into(), tokenizer.name().into());
    let (ir, notices) = match input {
        Input::Text => {
            report.insert("bytes".into(), text.len().into());
            report.insert("tokens".into(), tokenizer.count(text).into());
            return Ok((Value::Object(report).to_string(), Vec::new()));
        }
        Input::Ir => (schema::parse_ir_text(text)?, Vec::new()),
        Input::Surface(frontend) => {
            let decoded = silp::decode(text, frontend, options)?;
            let input = json!({
                "frontend": frontend.name(),
                "bytes": text.len(),
                "tokens": tokenizer.count(text),
            });
            report.insert("input".into(), input);
            (decoded.ir, decoded.notices.iter().map(ToString::to_string).collect())
        }
    };
    let natural = silp::compile(&ir, Frontend::Natural);
    let (natural_bytes, natural_tokens) = (natural.len(), tokenizer.count(&natural));
    for frontend in Frontend::ALL {
        let out = silp::compile(&ir, frontend);
        let tokens = tokenizer.count(&out);
        let entry = json!({
            "bytes": out.len(),
            "tokens": tokens,
            "bytes_vs_natural": ratio(out.len(), natural_bytes),
            "tokens_vs_natural": ratio(tokens, natural_tokens),
        });
        report.insert(frontend.name().into(), entry);
    }
    Ok((Value::Object(report).to_string(), notices))
}

/// `part / whole` to three decimals; `null` when the baseline is empty.
fn ratio(part: usize, whole: usize) -> Value {
    if whole == 0 {
        return Value::Null;
    }
    let r = (part as f64 / whole as f64 * 1000.0).round() / 1000.0;
    json!(r)
}

fn verbs(tokenizer: Tokenizer) -> ExitCode {
    let multi = tokens::multi_token_verbs(tokenizer);
    if multi.is_empty() {
        println!(
            "all {} whitelisted verbs are one token in {tokenizer}",
            crate::silp::whitelist::APPROVED.len()
        );
        return ExitCode::SUCCESS;
    }
    for (verb, n) in &multi {
        println!("{verb}: {n} tokens in {tokenizer}");
    }
    eprintln!("error: {} whitelisted verbs are not one token in {tokenizer}", multi.len());
    ExitCode::from(EXIT_INVALID)
}
