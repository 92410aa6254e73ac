#!/usr/bin/env bash
# The agent round trip at a fixed rate, through silpgate and without it, in the same run: an
# HTTP client -> silpgate -> an AMQP echo agent (examples/echo_agent.rs) -> silpgate -> the
# HTTP response, beside the same agent reached straight over AMQP request/reply. Needs RabbitMQ
# at 127.0.0.1:5672 (guest/guest). The last line is
#   silpgate adds: median X µs, p99 Y µs
# SILPGATE_BENCH_BIN=/path/to/an/earlier/silpgate runs that build instead (before/after).
set -euo pipefail
cd "$(dirname "$0")/.."
rate=${RATE:-500}
count=${COUNT:-10000}
broker=amqp://guest:guest@127.0.0.1:5672/%2f

cargo build --release --quiet --bin silpgate --example echo_agent
cargo bench --quiet --bench roundtrip --no-run 2>/dev/null

config=$(mktemp)
store=$(mktemp -d)
cat > "$config" <<TOML
# Every HTTP request goes to the echo agent and waits for its answer.
[[agents]]
name = "echo"
frontends = []
queue = "bench.roundtrip.agent"
[[routes]]
name = "to-echo"
destination = "echo"
mode = "validate"
[http]
plain = true
client_rate = 0.0
connection_rate = 0.0
[amqp]
url = "$broker"
inbound = ["bench.roundtrip.in"]
inbound_exchange = "bench.roundtrip.in"
reply_queue = "bench.roundtrip.replies"
TOML
"${SILPGATE_BENCH_BIN:-target/release/silpgate}" run --config "$config" --listen 127.0.0.1:18992 --store "$store" 2>/dev/null &
silpgate_pid=$!
agent_pid=
trap 'kill $silpgate_pid $agent_pid 2>/dev/null || true; rm -rf "$config" "$store"' EXIT
# The agent's queue exists once silpgate has declared its topology.
for _ in $(seq 300); do
  curl -sf http://127.0.0.1:18992/readyz >/dev/null 2>&1 && break
  sleep 0.1
done
target/release/examples/echo_agent --queue bench.roundtrip.agent --url "$broker" 2>/dev/null &
agent_pid=$!
sleep 0.5

load() { cargo bench --quiet --bench roundtrip -- "$@" 2>/dev/null | tail -1; }
read -r direct_med direct_p99 < <(load amqp "$broker" bench.roundtrip.agent "$rate" "$count")
read -r gate_med gate_p99 < <(load http http://127.0.0.1:18992/nlip "$rate" "$count")

printf '%-36s %12s %12s\n' "round trip at $rate/s (µs)" median p99
printf '%-36s %12s %12s\n' "AMQP request/reply, no silpgate" "$direct_med" "$direct_p99"
printf '%-36s %12s %12s\n' "HTTP -> silpgate -> AMQP agent" "$gate_med" "$gate_p99"
awk -v dm="$direct_med" -v dp="$direct_p99" -v gm="$gate_med" -v gp="$gate_p99" \
  'BEGIN { printf "silpgate adds: median %.0f µs, p99 %.0f µs\n", gm - dm, gp - dp }'
