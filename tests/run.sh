#!/usr/bin/env bash
# The test command (README.md): prepares what the tests need on a fresh machine, then runs
# every test. Safe to run repeatedly.
set -euo pipefail
cd "$(dirname "$0")/.."

command -v cargo >/dev/null || { echo "tests/run.sh: cargo is required (https://rustup.rs)" >&2; exit 1; }

cargo fmt --all -- --check
cargo clippy --locked --all-targets -- -D warnings
cargo test --locked --all-targets
cargo test --locked --doc
