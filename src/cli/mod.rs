//! The command line: argument definitions (clap) and dispatch. Exit codes: 0 success, 1 an
//! input was invalid, 2 usage error.

mod input;
mod nlip;
mod silp;
mod store;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Debug, Parser)]
#[command(
    name = "silpgate",
    version,
    about = "Carries SILP payloads inside NLIP envelopes between AI agents"
)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Compile, decode, validate and hash SILP payloads.
    #[command(subcommand)]
    Silp(silp::SilpCommand),
    /// Read and write NLIP envelopes.
    #[command(subcommand)]
    Nlip(nlip::NlipCommand),
    /// Run the gateway core.
    #[command(subcommand)]
    Gateway(nlip::GatewayCommand),
    /// Verify, export and inspect the compile.lock.
    #[command(subcommand)]
    Lock(store::LockCommand),
    /// Inspect conversation sessions.
    #[command(subcommand)]
    Sessions(store::SessionsCommand),
}

/// Exit status for an invalid input.
pub const EXIT_INVALID: u8 = 1;
/// Exit status for a usage error (clap uses the same).
pub const EXIT_USAGE: u8 = 2;

pub fn run(cli: Cli) -> ExitCode {
    match cli.command {
        Command::Silp(command) => silp::run(command),
        Command::Nlip(command) => nlip::run_nlip(command),
        Command::Gateway(command) => nlip::run_gateway(command),
        Command::Lock(command) => store::run_lock(command),
        Command::Sessions(command) => store::run_sessions(command),
    }
}
