//! `silpgate silp ...`: the codec on the command line, for people and for other tools.

use super::lines::{Common, OkForm, Outcome, drive, read_document};
use super::{EXIT_INVALID, EXIT_USAGE};
use crate::gateway::store::{Changes, Freeze, Store};
use crate::silp::validate::{self, ValidateOptions};
use crate::silp::{self, DecodeOptions, ErrorCode, Frontend, ReqIdMode, SilpError, schema};
use crate::store::SledStore;
use clap::{Subcommand, ValueEnum};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Debug, Subcommand)]
pub(super) enum SilpCommand {
    /// IR JSON in, surface text out.
    Compile {
        #[command(flatten)]
        common: Common,
        /// Compile without enforcing the verb whitelist.
        #[arg(long)]
        no_whitelist: bool,
        /// Compile through the compile.lock in this store: the first compile of an IR is
        /// frozen, later ones print the frozen text.
        #[arg(long)]
        lock: Option<PathBuf>,
        /// Environment variable holding the HMAC key of a keyed chain.
        #[arg(long, requires = "lock")]
        key_env: Option<String>,
    },
    /// Surface text in, canonical compact IR JSON out.
    Decode {
        #[command(flatten)]
        common: Common,
        /// Length of the derived meta.req_id in hex characters (4..=8).
        #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u8).range(4..=8))]
        req_id_len: u8,
        /// Reproduce a reference implementation's behaviour (req_id derivation).
        #[arg(long, value_enum)]
        compat: Option<Compat>,
        /// Do not strip invisible characters or map look-alike identifiers.
        #[arg(long)]
        no_sanitize: bool,
    },
    /// Check an IR against the schema and the validator rules.
    Validate {
        /// Do not enforce the verb whitelist.
        #[arg(long)]
        no_whitelist: bool,
        /// Input file; stdin when absent or '-'.
        file: Option<PathBuf>,
    },
    /// Print sha256:<hex> of the canonical compact IR.
    Hash {
        /// Input file; stdin when absent or '-'.
        file: Option<PathBuf>,
    },
    /// Bytes and tokens of every frontend's output for an IR, or of a text as it is.
    Tokens(super::tokens::TokensArgs),
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub(super) enum Compat {
    /// The SILP reference implementation: 4-hex req_id over the text it hashes.
    Reference,
}

pub(super) fn run(command: SilpCommand) -> ExitCode {
    match command {
        SilpCommand::Compile { common, no_whitelist, lock, key_env } => {
            let rules = ValidateOptions { enforce_whitelist: !no_whitelist };
            let store = match lock.map(|dir| {
                let key = crate::store::chain::key_from_env(key_env.as_deref())?;
                SledStore::open(&dir, key).map_err(|e| e.to_string())
            }) {
                None => None,
                Some(Ok(store)) => Some(store),
                Some(Err(e)) => {
                    eprintln!("error: {e}");
                    return ExitCode::from(EXIT_INVALID);
                }
            };
            with_frontend(&common, |frontend| {
                // `--lines` writes no warnings, so none are worked out.
                let warn = !common.lines;
                let each = |text: &str| compile_one(text, frontend, rules, store.as_ref(), warn);
                let code = drive(&common, each, OkForm::Text);
                if let Some(store) = &store
                    && let Err(e) = store.flush()
                {
                    eprintln!("error: {e}");
                    return ExitCode::from(EXIT_INVALID);
                }
                code
            })
        }
        SilpCommand::Decode { common, req_id_len, compat, no_sanitize } => {
            let options = DecodeOptions {
                sanitize: !no_sanitize,
                req_id: match compat {
                    Some(Compat::Reference) => ReqIdMode::Reference,
                    None => ReqIdMode::Hash { len: usize::from(req_id_len) },
                },
                max_input_bytes: common.max_input_bytes,
            };
            with_frontend(&common, |frontend| {
                if !frontend.is_lossless() {
                    let err = silp::decode("", frontend, &options).expect_err("baselines do not decode");
                    eprintln!("{}", err.render(""));
                    return ExitCode::from(EXIT_USAGE);
                }
                let warn = !common.lines;
                drive(&common, |text| decode_one(text, frontend, &options, warn), OkForm::IrJson)
            })
        }
        SilpCommand::Validate { no_whitelist, file } => {
            let Some(text) = read_document(file, 1 << 20) else { return ExitCode::from(EXIT_INVALID) };
            let (mut report, ir) = match silp::parse_json(&text) {
                Ok(value) => (
                    validate::validate_value(&value, ValidateOptions { enforce_whitelist: !no_whitelist }),
                    schema::parse_ir(&value).ok(),
                ),
                Err(e) => {
                    (validate::Report { valid: false, errors: vec![e.message], warnings: vec![] }, None)
                }
            };
            if report.valid
                && let Some(ir) = &ir
            {
                report.warnings.extend(silp::draft02::warnings(ir));
            }
            // Each warning names the draft revision it comes from, in the same order.
            let revisions: Vec<&str> =
                report.warnings.iter().map(|w| silp::draft02::revision_of(w)).collect();
            let mut shown = serde_json::to_value(&report).expect("report serialises");
            shown["warning_revisions"] = serde_json::json!(revisions);
            println!("{shown}");
            if report.valid { ExitCode::SUCCESS } else { ExitCode::from(EXIT_INVALID) }
        }
        SilpCommand::Tokens(args) => super::tokens::run(args),
        SilpCommand::Hash { file } => {
            let Some(text) = read_document(file, 1 << 20) else { return ExitCode::from(EXIT_INVALID) };
            match schema::parse_ir_text(&text) {
                Ok(ir) => {
                    println!("{}", ir.ir_hash());
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("{}", e.render(&text));
                    ExitCode::from(EXIT_INVALID)
                }
            }
        }
    }
}

fn with_frontend(common: &Common, f: impl FnOnce(Frontend) -> ExitCode) -> ExitCode {
    match common.frontend.parse::<Frontend>() {
        Ok(frontend) => f(frontend),
        Err(e) => {
            eprintln!("{}", e.render(""));
            ExitCode::from(EXIT_USAGE)
        }
    }
}

/// Compiles one IR text; `warn` says whether the validator's warnings are wanted.
fn compile_one(
    text: &str,
    frontend: Frontend,
    rules: ValidateOptions,
    lock: Option<&SledStore>,
    warn: bool,
) -> Outcome {
    let ir = schema::parse_ir_text(text)?;
    let errors = validate::errors(&ir, rules);
    if !errors.is_empty() {
        return Err(SilpError::new(
            ErrorCode::DecodeFailed,
            format!("IR is not valid: {}", errors.join("; ")),
        ));
    }
    let output = silp::compile(&ir, frontend);
    let mut warnings = Vec::new();
    if warn {
        warnings = validate::warnings(&ir);
        warnings.extend(silp::draft02::warnings(&ir));
    }
    let Some(store) = lock else { return Ok((output, warnings)) };
    let freeze = Freeze { ir_hash: ir.ir_hash(), frontend, output, principal: None };
    let changes = Changes { freezes: vec![freeze], ..Changes::default() };
    let frozen = store
        .commit(&changes, crate::util::time::now_millis())
        .map_err(|e| SilpError::new(ErrorCode::DecodeFailed, format!("compile.lock: {e}")))?
        .pop()
        .expect("one frozen entry per freeze");
    if frozen.drift {
        warnings.push(format!(
            "compile.lock drift: {} compiles differently today; the frozen text is printed",
            ir.ir_hash()
        ));
    }
    Ok((frozen.output, warnings))
}

/// Decodes one text; `warn` says whether its notices are wanted.
fn decode_one(text: &str, frontend: Frontend, options: &DecodeOptions, warn: bool) -> Outcome {
    let decoded = silp::decode(text, frontend, options)?;
    let notices = if warn { decoded.notices.iter().map(ToString::to_string).collect() } else { Vec::new() };
    Ok((decoded.ir.to_compact_json(), notices))
}
