#!/usr/bin/env bash
# What the durable store costs the AMQP relay: benches/bench-amqp.sh on a build whose core keeps
# its state in memory (feature bench-memory-store: nothing survives a restart), then on the
# normal build, alternating. Usage: bash benches/bench-amqp-memory.sh [PAIRS=2]
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --features bench-memory-store --bin silpgate
cp target/release/silpgate target/release/silpgate-memory-store
cargo build --release --bin silpgate
for pair in $(seq "${1:-2}"); do
  echo "== pair $pair: state in memory"
  SILPGATE_BENCH_BIN=target/release/silpgate-memory-store bash benches/bench-amqp.sh | tail -1
  echo "== pair $pair: state in sled"
  bash benches/bench-amqp.sh | tail -1
done
