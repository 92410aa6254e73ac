#!/usr/bin/env bash
# A rolling restart of three cluster instances under paced traffic (benches/rollout.rs): what
# was lost, published twice or out of order, the waits, SIGTERM to exit and start to ready.
# Usage: bash benches/bench-rollout.sh [RATE=40]
# SILPGATE_BENCH_BIN=/path/to/an/earlier/silpgate runs that build instead (before/after);
# SILPGATE_BENCH_LOG=info shows the instances' logs.
set -euo pipefail
cd "$(dirname "$0")/.."
rabbitmqctl -q await_startup --timeout 10 >/dev/null 2>&1 || {
  echo "bench-rollout.sh: RabbitMQ is not running on this machine; start it with: rabbitmq-server -detached" >&2
  exit 1
}
rabbitmq-plugins enable -q rabbitmq_consistent_hash_exchange >/dev/null
cargo bench --bench rollout -- "${1:-40}"
