//! `silpgate lock ...` and `silpgate sessions ...`: the durable store on the command line.

use super::{EXIT_INVALID, EXIT_USAGE};
use crate::store::SledStore;
use crate::store::chain::{self, Sealer};
use clap::{Subcommand, ValueEnum};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(Debug, Subcommand)]
pub(super) enum LockCommand {
    /// Check the compile.lock chain: exit 0 when intact, else name the first bad record.
    Verify {
        /// The store directory.
        #[arg(long, conflicts_with = "file", required_unless_present = "file")]
        store: Option<PathBuf>,
        /// A `lock export --format chain` file.
        #[arg(long)]
        file: Option<PathBuf>,
        /// Environment variable holding the HMAC key of a keyed chain.
        #[arg(long)]
        key_env: Option<String>,
    },
    /// Write the chain: every field (`chain`, verifiable) or the reference CLI's lines.
    Export {
        #[arg(long)]
        store: PathBuf,
        #[arg(long, value_enum, default_value_t = ExportFormat::Chain)]
        format: ExportFormat,
        /// Only the records frozen by this principal's messages (its subject), once the whole
        /// chain has verified; each keeps its seal, and no head line follows (the selection is
        /// not the chain).
        #[arg(long)]
        principal: Option<String>,
        /// Output file; stdout when absent.
        #[arg(short, long)]
        output: Option<PathBuf>,
        #[arg(long)]
        key_env: Option<String>,
    },
    /// Print the lock records of one IR hash (`sha256:<hex>` or the hex alone).
    Show {
        #[arg(long)]
        store: PathBuf,
        ir_hash: String,
    },
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub(super) enum ExportFormat {
    Chain,
    Reference,
}

#[derive(Debug, Subcommand)]
pub(super) enum SessionsCommand {
    /// One JSON line per session.
    List {
        #[arg(long)]
        store: PathBuf,
    },
}

fn open(dir: &Path, key: Option<Vec<u8>>) -> Result<SledStore, ExitCode> {
    SledStore::open(dir, key).map_err(report)
}

/// Opens a store to read its sessions or lock records, which needs no key.
fn open_to_read(dir: &Path) -> Result<SledStore, ExitCode> {
    SledStore::open_to_read(dir).map_err(report)
}

fn report(e: impl std::fmt::Display) -> ExitCode {
    eprintln!("error: {e}");
    ExitCode::from(EXIT_INVALID)
}

pub(super) fn run_lock(command: LockCommand) -> ExitCode {
    match command {
        LockCommand::Verify { store, file, key_env } => {
            let key = match chain::key_from_env(key_env.as_deref()) {
                Ok(k) => k,
                Err(e) => {
                    eprintln!("error: {e}");
                    return ExitCode::from(EXIT_USAGE);
                }
            };
            let keyed = key.is_some();
            let result = match (store, file) {
                (Some(dir), _) => match open(&dir, key) {
                    Ok(store) => store.verify_lock(),
                    Err(code) => return code,
                },
                (None, Some(file)) => match std::fs::read_to_string(&file) {
                    Ok(text) => {
                        let (records, head) = chain::read_export(&text);
                        match head {
                            Some(head) => match Sealer::new(key) {
                                Ok(sealer) => chain::verify(records, Some(&head), &sealer),
                                Err(e) => return report(e),
                            },
                            None => Err(chain::ChainError {
                                position: records.len() as u64,
                                reason: "no head line: the export is truncated, or not a chain export".into(),
                            }),
                        }
                    }
                    Err(e) => {
                        eprintln!("error: cannot read {}: {e}", file.display());
                        return ExitCode::from(EXIT_INVALID);
                    }
                },
                (None, None) => unreachable!("clap requires --store or --file"),
            };
            match result {
                Ok(n) => {
                    println!("ok: {n} records, chain intact ({})", if keyed { "keyed" } else { "unkeyed" });
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    println!("tampered: {e}");
                    ExitCode::from(EXIT_INVALID)
                }
            }
        }
        LockCommand::Export { store, format, principal, output, key_env } => {
            let key = match chain::key_from_env(key_env.as_deref()) {
                Ok(k) => k,
                Err(e) => {
                    eprintln!("error: {e}");
                    return ExitCode::from(EXIT_USAGE);
                }
            };
            let store = match open(&store, key) {
                Ok(s) => s,
                Err(code) => return code,
            };
            if principal.is_some()
                && let Err(e) = store.verify_lock()
            {
                eprintln!("error: the chain does not verify, so no selection of it is exported: {e}");
                return ExitCode::from(EXIT_INVALID);
            }
            let mut text = String::new();
            for record in store.lock_records() {
                let record = match record {
                    Ok(r) => r,
                    Err(e) => {
                        eprintln!("error: {e}");
                        return ExitCode::from(EXIT_INVALID);
                    }
                };
                if principal.as_ref().is_some_and(|subject| record.principal.as_ref() != Some(subject)) {
                    continue;
                }
                match format {
                    ExportFormat::Chain => {
                        text.push_str(&serde_json::to_string(&record).expect("records serialise"))
                    }
                    ExportFormat::Reference => text.push_str(&chain::reference_line(&record)),
                }
                text.push('\n');
            }
            if let (ExportFormat::Chain, None) = (format, &principal) {
                match store.lock_head() {
                    Ok(head) => {
                        let line = chain::HeadLine { head };
                        text.push_str(&serde_json::to_string(&line).expect("head serialises"));
                        text.push('\n');
                    }
                    Err(e) => {
                        eprintln!("error: {e}");
                        return ExitCode::from(EXIT_INVALID);
                    }
                }
            }
            let written = match output {
                Some(path) => std::fs::write(&path, text),
                None => std::io::stdout().write_all(text.as_bytes()),
            };
            match written {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("error: cannot write the export: {e}");
                    ExitCode::from(EXIT_INVALID)
                }
            }
        }
        LockCommand::Show { store, ir_hash } => {
            let store = match open_to_read(&store) {
                Ok(s) => s,
                Err(code) => return code,
            };
            let ir_hash = if ir_hash.starts_with("sha256:") { ir_hash } else { format!("sha256:{ir_hash}") };
            match store.lock_for(&ir_hash) {
                Ok(records) if records.is_empty() => {
                    eprintln!("no lock records for {ir_hash}");
                    ExitCode::from(EXIT_INVALID)
                }
                Ok(records) => {
                    for r in records {
                        println!("{}", serde_json::to_string(&r).expect("records serialise"));
                    }
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::from(EXIT_INVALID)
                }
            }
        }
    }
}

pub(super) fn run_sessions(command: SessionsCommand) -> ExitCode {
    let SessionsCommand::List { store } = command;
    let store = match open_to_read(&store) {
        Ok(s) => s,
        Err(code) => return code,
    };
    match session_lines(&store) {
        Ok(lines) => {
            for line in lines {
                println!("{line}");
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(EXIT_INVALID)
        }
    }
}

/// One JSON object per session. In cluster mode a session belongs to a partition, and only
/// the partition's owner's store is current: each line says whether this store's instance
/// served the partition when it last wrote here (`"held": "served"`), or holds a replica as
/// of the changelog entry it last applied (`"held": "replica"`, `changelog_applied_offset`).
fn session_lines(store: &SledStore) -> Result<Vec<String>, crate::gateway::store::StoreError> {
    let served = store.served()?;
    // Read once per partition, not once per session.
    let mut offsets: std::collections::BTreeMap<u16, Option<u64>> = std::collections::BTreeMap::new();
    let mut lines = Vec::new();
    for session in store.sessions()? {
        let mut line = serde_json::to_value(&session).expect("sessions serialise");
        if let Some(partition) = session.partition {
            let held = if served.contains(&partition) { "served" } else { "replica" };
            line["held"] = held.into();
            if held == "replica" {
                let offset = match offsets.get(&partition) {
                    Some(&offset) => offset,
                    None => *offsets.entry(partition).or_insert(store.partition_offset(partition)?),
                };
                line["changelog_applied_offset"] = offset.into();
            }
        }
        lines.push(line.to_string());
    }
    Ok(lines)
}
