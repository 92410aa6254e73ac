#!/usr/bin/env bash
# silpgate against a bare lapin relay on the local RabbitMQ, in one run (benches/amqp.rs).
# Usage: bash benches/bench-amqp.sh [N=50000] [RATE=1000] [SECONDS=15]
# The last line: throughput ratio silpgate/bare: X, p99 at 1000/s silpgate Y ms bare Z ms,
# cpu per message silpgate A us bare B us
set -euo pipefail
cd "$(dirname "$0")/.."
rabbitmqctl -q await_startup --timeout 10 >/dev/null 2>&1 || {
  echo "bench-amqp.sh: RabbitMQ is not running on this machine; start it with: rabbitmq-server -detached" >&2
  exit 1
}
cargo bench --bench amqp -- "${1:-50000}" "${2:-1000}" "${3:-15}"
