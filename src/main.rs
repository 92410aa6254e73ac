//! The `silpgate` binary: see `silpgate --help`.

use clap::Parser;
use std::process::ExitCode;

/// glibc's allocator, shared by the runtime's threads, sled's and lapin's I/O threads, costs
/// about a fifth of the relay's CPU in its locks and chunk bookkeeping (docs/performance.md);
/// mimalloc's per-thread heaps do the same work for much less.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = silpgate::cli::Cli::parse();
    silpgate::cli::run(cli)
}
