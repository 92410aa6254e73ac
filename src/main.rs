//! The `silpgate` binary: see `silpgate --help`.

use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = silpgate::cli::Cli::parse();
    silpgate::cli::run(cli)
}
