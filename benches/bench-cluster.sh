#!/usr/bin/env bash
# Cluster mode on the local RabbitMQ, in one run (benches/cluster.rs): throughput of 1, 2 and 3
# instances, and the hand-over time after a SIGKILL.
# Usage: bash benches/bench-cluster.sh [N=20000] [RATE=320]
# The last line: cluster throughput msg/s: 1 instance X, 2 instances Y, 3 instances Z; handover after
# SIGKILL W ms; cpu per message over all instances: A / B / C us
# SILPGATE_BENCH_BIN=/path/to/an/earlier/silpgate runs that build instead (before/after).
set -euo pipefail
cd "$(dirname "$0")/.."
rabbitmqctl -q await_startup --timeout 10 >/dev/null 2>&1 || {
  echo "bench-cluster.sh: RabbitMQ is not running on this machine; start it with: rabbitmq-server -detached" >&2
  exit 1
}
rabbitmq-plugins enable -q rabbitmq_consistent_hash_exchange >/dev/null
cargo bench --bench cluster -- "${1:-20000}" "${2:-320}"
