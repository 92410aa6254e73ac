#!/usr/bin/env bash
# The relay's per-message state writes on sled (keyed, and as a journal with checkpoints),
# fjall and redb, each in windows of 64 made durable at once (benches/engines). Alternates the
# engines; prints CPU and wall time per message. Usage: bash benches/bench-engines.sh [RUNS=2] [MESSAGES=64000]
set -euo pipefail
cd "$(dirname "$0")/engines"
cargo build --release -q
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
for run in $(seq "${1:-2}"); do
  for engine in sled-keys sled-journal fjall redb; do
    target/release/silpgate-bench-engines "$engine" "$dir/$engine" "${2:-64000}"
  done
done
