#!/usr/bin/env bash
# Round-trip latency of a small text envelope, sequential over a keep-alive connection, median
# and p99 of 1,000 requests after 200 warm-up ones on each of 5 connections (and the fastest and
# slowest connection's median): silpgate over HTTP and WebSocket, and the
# reference Python server (nlip-server 0.1.3, uvicorn nlip_server.echo:app) on the same machine
# in the same run, and the floor under both: echo servers on silpgate's runtime with nothing
# behind them (benches/latency.rs `floor`). Installs what it needs (a venv in
# target/bench-venv). The last line is
#   median ratio nlip-server/silpgate (fastest connections): http X, ws Y
# SILPGATE_BENCH_BIN=/path/to/an/earlier/silpgate runs that build instead (before/after).
set -euo pipefail
cd "$(dirname "$0")/.."

target=${CARGO_TARGET_DIR:-target}
venv=$target/bench-venv
if ! "$venv/bin/python" -c 'import nlip_server, uvicorn' 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check nlip-server==0.1.3 uvicorn
fi

cargo build --release --quiet --bin silpgate

config=$(mktemp)
store=$(mktemp -d)
logs=$(mktemp -d)
ports="18990 18991 18992 18993 18994"
for port in $ports; do
  if (echo > /dev/tcp/127.0.0.1/$port) 2>/dev/null; then
    echo "bench-latency.sh: port $port is already in use; stop what holds it" >&2
    exit 1
  fi
done
cat > "$config" <<'TOML'
# An echo route: every text message goes back to the sender unchanged.
[[routes]]
name = "echo"
destination = "reply"
mode = "validate"
[http]
plain = true
client_rate = 0.0
connection_rate = 0.0
TOML
"${SILPGATE_BENCH_BIN:-$target/release/silpgate}" run --config "$config" --listen 127.0.0.1:18990 --store "$store" 2>"$logs/silpgate.log" &
silpgate_pid=$!
(cd "$venv" && exec bin/python -m uvicorn nlip_server.echo:app --port 18991 --log-level warning) 2>"$logs/nlip-server.log" &
reference_pid=$!
# benches/latency.rs, built once: the load client, and the floor (echo servers on silpgate's
# runtime with no gateway behind them).
latency=$(cargo bench --quiet --bench latency --no-run --message-format=json 2>/dev/null |
  sed -n 's/.*"executable":"\([^"]*latency[^"]*\)".*/\1/p' | tail -1)
"$latency" floor 127.0.0.1:18992 127.0.0.1:18994 127.0.0.1:18993 2>"$logs/floor.log" &
floor_pid=$!
# On a failure, what the servers said is shown before it is removed.
trap 'status=$?; kill $silpgate_pid $reference_pid $floor_pid 2>/dev/null || true
  if [ $status -ne 0 ]; then tail -n 20 "$logs"/*.log >&2; fi; rm -rf "$config" "$store" "$logs"' EXIT
for port in $ports; do
  for _ in $(seq 100); do (echo > /dev/tcp/127.0.0.1/$port) 2>/dev/null && break; sleep 0.1; done
done
# Accepting is not ready: each server must echo an envelope before it is timed.
envelope='{"format":"text","subformat":"english","content":"hello"}'
for url in http://127.0.0.1:18990/nlip http://127.0.0.1:18991/nlip/ http://127.0.0.1:18992/nlip http://127.0.0.1:18994/nlip; do
  answer=$(curl -sS --max-time 10 -H 'Content-Type: application/json' -d "$envelope" "$url")
  case $answer in
    *'"hello"'*) ;;
    *) echo "bench-latency.sh: $url answered '$answer', not the echo" >&2; exit 1 ;;
  esac
done

# The client checks every answer is the echo, and fails, and with it this script, when one is
# not (an assignment from a failed command substitution stops a `set -e` script).
load() { "$latency" "$@" 2>>"$logs/client.log" | tail -1; }
out=$(load http 127.0.0.1:18990 /nlip); read -r s_http_med s_http_p99 s_http_fast s_http_slow <<< "$out"
out=$(load ws ws://127.0.0.1:18990/nlip/ws/text); read -r s_ws_med s_ws_p99 s_ws_fast s_ws_slow <<< "$out"
out=$(load http 127.0.0.1:18991 /nlip/); read -r r_http_med r_http_p99 r_http_fast r_http_slow <<< "$out"
out=$(load http 127.0.0.1:18992 /nlip); read -r f_http_med f_http_p99 f_http_fast f_http_slow <<< "$out"
out=$(load http 127.0.0.1:18994 /nlip); read -r f_hyper_med f_hyper_p99 f_hyper_fast f_hyper_slow <<< "$out"
out=$(load ws ws://127.0.0.1:18993/); read -r f_ws_med f_ws_p99 f_ws_fast f_ws_slow <<< "$out"

row='%-28s %12s %12s %24s\n'
printf "$row" "round trip (µs)" median p99 "connections' medians"
printf "$row" "silpgate HTTP" "$s_http_med" "$s_http_p99" "$s_http_fast-$s_http_slow"
printf "$row" "silpgate WebSocket" "$s_ws_med" "$s_ws_p99" "$s_ws_fast-$s_ws_slow"
printf "$row" "nlip-server 0.1.3 HTTP" "$r_http_med" "$r_http_p99" "$r_http_fast-$r_http_slow"
printf "$row" "floor: tokio echo, HTTP" "$f_http_med" "$f_http_p99" "$f_http_fast-$f_http_slow"
printf "$row" "floor: hyper echo, HTTP" "$f_hyper_med" "$f_hyper_p99" "$f_hyper_fast-$f_hyper_slow"
printf "$row" "floor: tokio echo, WebSocket" "$f_ws_med" "$f_ws_p99" "$f_ws_fast-$f_ws_slow"
# A connection keeps one of two speeds for its life on this VM (benches/latency.rs), for every
# server alike: the comparisons use each server's fastest connection.
awk -v fh="$f_http_fast" -v fy="$f_hyper_fast" -v fw="$f_ws_fast" -v h="$s_http_fast" -v w="$s_ws_fast" \
  'BEGIN { printf "silpgate above the floor (fastest connections): http %.1f µs (above hyper %.1f µs), ws %.1f µs\n", h - fh, h - fy, w - fw }'
awk -v r="$r_http_fast" -v h="$s_http_fast" -v w="$s_ws_fast" \
  'BEGIN { printf "median ratio nlip-server/silpgate (fastest connections): http %.1f, ws %.1f\n", r / h, r / w }'
