#!/usr/bin/env bash
# Added latency of the A2A and MCP hops: the test A2A agent (a2a-sdk) and MCP server (mcp) of
# tests/interop/, each timed straight from a Python client and through silpgate (release build,
# its HTTP door routing text to that agent), same client, same run. Then a streamed task: the
# streaming A2A agent works three steps of half a second, and the time to the first streamed
# event and to the last is timed straight to it and through silpgate's A2A door (a route
# from source a2a to it), and the time from SubscribeToTask to its first event for a task whose
# stream was dropped. Needs the test venv (tests/run.sh makes it in target/pyenv;
# SILPGATE_PYTHON overrides). COUNT=1000 by default; STREAMS=20 streamed tasks each way.
# SILPGATE_BENCH_BIN=/path/to/an/earlier/silpgate runs that build instead (before/after).
set -euo pipefail
cd "$(dirname "$0")/.."
python="${SILPGATE_PYTHON:-target/pyenv/bin/python}"
target="${CARGO_TARGET_DIR:-target}"
count="${COUNT:-1000}"
streams="${STREAMS:-20}"
cargo build --release --quiet --bin silpgate

dir=$(mktemp -d)
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; rm -rf "$dir"' EXIT
"$python" tests/interop/a2a_agent.py 18981 & pids+=($!)
"$python" tests/interop/mcp_tool.py 18982 & pids+=($!)
"$python" tests/interop/a2a_agent_streaming.py 18985 & pids+=($!)
for name in a2a mcp stream; do
  case $name in a2a) port=18983 ;; mcp) port=18984 ;; stream) port=18986 ;; esac
  cat > "$dir/$name.toml" <<TOML
[gateway]
name = "bench-$name"
[store]
path = "$dir/store-$name"
[http]
listen = "127.0.0.1:$port"
plain = true
client_rate = 0.0
connection_rate = 0.0
[[agents]]
name = "agent"
frontends = []
$(case $name in
  a2a) echo 'protocol = "a2a"'; echo 'url = "http://127.0.0.1:18981"' ;;
  mcp) echo 'protocol = "mcp"'; echo 'url = "http://127.0.0.1:18982/mcp"'; echo 'tool = "inspect"'; echo 'arguments = { priority = "high" }' ;;
  stream) echo 'protocol = "a2a"'; echo 'url = "http://127.0.0.1:18985"' ;;
esac)
[[routes]]
name = "to-agent"
destination = "agent"
mode = "validate"
TOML
  SILPGATE_LOG=warn "${SILPGATE_BENCH_BIN:-$target/release/silpgate}" run --config "$dir/$name.toml" 2>/dev/null & pids+=($!)
done
for port in 18981 18982 18983 18984 18985 18986; do
  for _ in $(seq 300); do (echo > /dev/tcp/127.0.0.1/$port) 2>/dev/null && break; sleep 0.1; done
done
"$python" benches/agent_protocols.py http://127.0.0.1:18981/ http://127.0.0.1:18982/mcp \
  http://127.0.0.1:18983/nlip http://127.0.0.1:18984/nlip "$count"
"$python" benches/agent_protocols.py --streamed http://127.0.0.1:18985/ http://127.0.0.1:18986/a2a "$streams"
