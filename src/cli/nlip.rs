//! `silpgate nlip ...` and `silpgate gateway ...`: the envelope layer and the gateway core on
//! the command line.

use super::{EXIT_INVALID, input};
use crate::config::Config;
use crate::gateway::{Destination, Gateway, Inbound, MemoryStore, Origin, Status, Store, Transport};
use crate::nlip::{self, Encoding, Limits};
use crate::store::SledStore;
use clap::{Subcommand, ValueEnum};
use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

#[derive(Debug, Subcommand)]
pub(super) enum NlipCommand {
    /// One envelope in, the canonical envelope out (or the NLIP error message, exit 1).
    Normalize {
        #[arg(long, value_enum, default_value_t = Wire::Json)]
        from: Wire,
        #[arg(long, value_enum, default_value_t = Wire::Json)]
        to: Wire,
        /// Input file; stdin when absent or '-'.
        file: Option<PathBuf>,
    },
}

#[derive(Debug, Subcommand)]
pub(super) enum GatewayCommand {
    /// Run the core on one envelope; print each outbound envelope as one JSON line
    /// {"destination": .., "envelope": ..}.
    Handle {
        /// Configuration file (routes, agents, sessions).
        #[arg(long)]
        config: PathBuf,
        /// The source name routes match on.
        #[arg(long, default_value = "cli")]
        source: String,
        #[arg(long, value_enum, default_value_t = Wire::Json)]
        from: Wire,
        /// Keep state in this sled store (default: in memory, gone at exit).
        #[arg(long)]
        store: Option<PathBuf>,
        /// Input file; stdin when absent or '-'.
        file: Option<PathBuf>,
    },
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub(crate) enum Wire {
    Json,
    Cbor,
}

impl From<Wire> for Encoding {
    fn from(w: Wire) -> Encoding {
        match w {
            Wire::Json => Encoding::Json,
            Wire::Cbor => Encoding::Cbor,
        }
    }
}

pub(super) fn run_nlip(command: NlipCommand) -> ExitCode {
    let NlipCommand::Normalize { from, to, file } = command;
    let limits = Limits::default();
    let Some(bytes) = read_bytes(file, limits.max_bytes) else { return ExitCode::from(EXIT_INVALID) };
    match nlip::decode(&bytes, from.into(), &limits) {
        Ok(message) => {
            write_out(&nlip::encode(&message, to.into()), to);
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error[{}]: {e}", e.kind.code());
            let location = e.path.clone().map_or(nlip::reply::Location::None, nlip::reply::Location::Path);
            let reply = nlip::reply::error_message(e.kind.code(), &e.message, &location);
            write_out(&nlip::encode(&reply, to.into()), to);
            ExitCode::from(EXIT_INVALID)
        }
    }
}

pub(super) fn run_gateway(command: GatewayCommand) -> ExitCode {
    let GatewayCommand::Handle { config, source, from, store, file } = command;
    let config = match Config::load(&config) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(super::EXIT_USAGE);
        }
    };
    let limits = config.nlip.limits();
    let store: Arc<dyn Store> = match store {
        None => Arc::new(MemoryStore::new()),
        Some(dir) => match SledStore::open(&dir, None) {
            Ok(s) => Arc::new(s),
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::from(EXIT_INVALID);
            }
        },
    };
    let gateway = Gateway::new(Arc::new(config), store);
    let Some(bytes) = read_bytes(file, limits.max_bytes) else { return ExitCode::from(EXIT_INVALID) };
    let outcome = match nlip::decode(&bytes, from.into(), &limits) {
        Ok(envelope) => gateway.handle(Inbound {
            envelope,
            origin: Origin::new(Transport::Cli, source),
            received_at: crate::util::time::now_millis(),
        }),
        Err(e) => gateway.reject_undecodable(e),
    };
    if let Err(e) = gateway.store().flush() {
        eprintln!("error: {e}");
        return ExitCode::from(EXIT_INVALID);
    }
    for note in &outcome.notes {
        eprintln!("note: {note:?}");
    }
    let mut out = std::io::stdout().lock();
    for o in &outcome.outbound {
        let destination = match &o.destination {
            Destination::Agent(name) => serde_json::Value::String(name.clone()),
            Destination::Reply => serde_json::Value::String("reply".into()),
        };
        let _ =
            writeln!(out, "{{\"destination\":{destination},\"envelope\":{}}}", nlip::to_json(&o.envelope));
    }
    match outcome.status {
        Status::Delivered | Status::Duplicate => ExitCode::SUCCESS,
        Status::Failed(e) => {
            eprintln!("error[{}] ({:?}): {e}", e.code(), e.disposition());
            ExitCode::from(EXIT_INVALID)
        }
    }
}

fn read_bytes(file: Option<PathBuf>, limit: usize) -> Option<Vec<u8>> {
    let mut reader = match input::open(file.as_deref()) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot open input: {e}");
            return None;
        }
    };
    let mut bytes = Vec::new();
    if let Err(e) = reader.by_ref().take(limit as u64 + 1).read_to_end(&mut bytes) {
        eprintln!("error: cannot read input: {e}");
        return None;
    }
    Some(bytes)
}

fn write_out(bytes: &[u8], wire: Wire) {
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(bytes);
    if matches!(wire, Wire::Json) {
        let _ = out.write_all(b"\n");
    }
}
