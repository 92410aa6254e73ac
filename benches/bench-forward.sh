#!/usr/bin/env bash
# What a front-door turn pays for being served by its partition's owner in cluster mode: two
# instances on the local RabbitMQ, and round trips of a small text envelope through instance
# a's HTTP and WebSocket doors (benches/latency.rs: sequential, one keep-alive connection,
# median and p99 of 1,000 after 200 warm-up), without a conversation token (taken by a itself)
# and with one (forwarded through the partition exchange to its owner, the reply back on
# RabbitMQ's direct reply-to). The echo route answers at once, so the difference is the
# forwarding.
# The last line is
#   front door round trip median us: http local X forwarded Y, ws local Z forwarded W
set -euo pipefail
cd "$(dirname "$0")/.."
rabbitmqctl -q await_startup --timeout 10 >/dev/null 2>&1 || {
  echo "bench-forward.sh: RabbitMQ is not running on this machine; start it with: rabbitmq-server -detached" >&2
  exit 1
}
rabbitmq-plugins enable -q rabbitmq_consistent_hash_exchange >/dev/null

target=${CARGO_TARGET_DIR:-target}
cargo build --release --quiet --bin silpgate
# SILPGATE_BENCH_BIN=PATH runs another build of silpgate (an earlier one, for a before/after).
silpgate=${SILPGATE_BENCH_BIN:-$target/release/silpgate}
cargo bench --quiet --bench latency --no-run 2>/dev/null

prefix="silpgate-bench-forward.$$"
work=$(mktemp -d)
pids=()
forget_broker_objects() {
  rabbitmqctl -q list_queues name 2>/dev/null | grep "^$prefix\." | while read -r queue; do
    rabbitmqctl -q delete_queue "$queue" >/dev/null </dev/null || true
  done
  rabbitmqctl -q list_exchanges name 2>/dev/null | grep "^$prefix\." | while read -r exchange; do
    rabbitmqctl -q eval "rabbit_exchange:delete(rabbit_misc:r(<<\"/\">>, exchange, <<\"$exchange\">>), false, <<\"bench\">>)." >/dev/null </dev/null || true
  done
}
finish() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  forget_broker_objects
  rm -rf "$work"
}
trap finish EXIT

start() {
  local instance=$1 port=$2
  # No renewal notices: each turn has exactly one reply.
  cat > "$work/$instance.toml" <<TOML
[sessions]
heartbeat = 9999
[[routes]]
name = "echo"
destination = "reply"
mode = "validate"
[http]
plain = true
client_rate = 0.0
connection_rate = 0.0
[amqp]
url = "amqp://guest:guest@127.0.0.1:5672/%2f"
inbound = ["$prefix.in"]
inbound_exchange = "$prefix.in"
agents_exchange = "$prefix.agents"
dead_letter_exchange = "$prefix.dlx"
dead_letter_queue = "$prefix.dead"
reply_queue = "$prefix.replies"
[cluster]
partitions = 4
exchange = "$prefix.partitions"
queue_prefix = "$prefix.p"
changelog_prefix = "$prefix.log"
lock_stream = "$prefix.lock"
instance = "$instance"
TOML
  "$silpgate" run --config "$work/$instance.toml" --listen "127.0.0.1:$port" \
    --store "$work/$instance-store" 2>"$work/$instance.log" &
  pids+=($!)
}
start a 18994
start b 18995
for port in 18994 18995; do
  for _ in $(seq 300); do
    curl -sf "http://127.0.0.1:$port/readyz" >/dev/null 2>&1 && break
    sleep 0.1
  done
  curl -sf "http://127.0.0.1:$port/readyz" >/dev/null || {
    echo "bench-forward.sh: the instance on $port is not ready; its log:" >&2
    tail -20 "$work"/*.log >&2
    exit 1
  }
done
# The partitions are served once their owners have taken them over: a few forwarded turns
# answer when that is done.
for _ in $(seq 100); do
  curl -sf -H 'Content-Type: application/json' -o /dev/null \
    -d '{"format":"text","subformat":"english","content":"hi","submessages":[{"format":"token","subformat":"conversation","content":"bench-conversation"}]}' \
    http://127.0.0.1:18994/nlip && break
  sleep 0.2
done

load() { cargo bench --quiet --bench latency -- "$@" 2>/dev/null | tail -1; }
read -r http_local http_local_p99 _ < <(load http 127.0.0.1:18994 /nlip)
read -r ws_local ws_local_p99 _ < <(load ws ws://127.0.0.1:18994/nlip/ws/text)
export LATENCY_CONVERSATION=bench-conversation
read -r http_fwd http_fwd_p99 _ < <(load http 127.0.0.1:18994 /nlip)
read -r ws_fwd ws_fwd_p99 _ < <(load ws ws://127.0.0.1:18994/nlip/ws/text)

printf '%-36s %12s %12s\n' "round trip through instance a (µs)" median p99
printf '%-36s %12s %12s\n' "HTTP, no conversation (local)" "$http_local" "$http_local_p99"
printf '%-36s %12s %12s\n' "HTTP, conversation (forwarded)" "$http_fwd" "$http_fwd_p99"
printf '%-36s %12s %12s\n' "WebSocket, no conversation (local)" "$ws_local" "$ws_local_p99"
printf '%-36s %12s %12s\n' "WebSocket, conversation (forwarded)" "$ws_fwd" "$ws_fwd_p99"
echo "front door round trip median us: http local $http_local forwarded $http_fwd, ws local $ws_local forwarded $ws_fwd"
