#!/usr/bin/env bash
# silpgate against a bare lapin relay on the local RabbitMQ, in one run (benches/amqp.rs).
# Usage: bash benches/bench-amqp.sh [N=50000] [RATE=1000] [SECONDS=15]
# OTLP_SAMPLE=0.1 exports silpgate's spans, sampled at that ratio, to a local OTLP receiver
# (tests/interop/otlp_sink.py in the venv tests/run.sh makes) and says how many arrived.
# The last line: throughput ratio silpgate/bare: X, p99 at 1000/s silpgate Y ms bare Z ms,
# cpu per message silpgate A us bare B us
set -euo pipefail
cd "$(dirname "$0")/.."
rabbitmqctl -q await_startup --timeout 10 >/dev/null 2>&1 || {
  echo "bench-amqp.sh: RabbitMQ is not running on this machine; start it with: rabbitmq-server -detached" >&2
  exit 1
}
if [ -n "${OTLP_SAMPLE:-}" ]; then
  python=target/pyenv/bin/python
  "$python" -c 'import opentelemetry.proto' 2>/dev/null || {
    echo "bench-amqp.sh: OTLP_SAMPLE needs the venv of tests/run.sh (target/pyenv)" >&2
    exit 1
  }
  spans=$(mktemp)
  coproc SINK { exec "$python" tests/interop/otlp_sink.py 0 "$spans"; }
  trap 'kill "$SINK_PID" 2>/dev/null; rm -f "$spans"' EXIT
  read -r -t 30 _ port <&"${SINK[0]}"
  export SILPGATE_BENCH_TELEMETRY="otlp_endpoint = \"http://127.0.0.1:$port/v1/traces\"; sample_ratio = $OTLP_SAMPLE"
fi
cargo bench --bench amqp -- "${1:-50000}" "${2:-1000}" "${3:-15}"
if [ -n "${OTLP_SAMPLE:-}" ]; then
  sleep 6 # the exporter's last batch
  echo "spans received by the OTLP receiver: $(wc -l <"$spans")"
fi
