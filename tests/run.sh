#!/usr/bin/env bash
# The test command (README.md): prepares what the tests need on a fresh machine, then runs
# every test. Safe to run repeatedly.
set -euo pipefail
cd "$(dirname "$0")/.."

command -v cargo >/dev/null || { echo "tests/run.sh: cargo is required (https://rustup.rs)" >&2; exit 1; }
command -v python3 >/dev/null || { echo "tests/run.sh: python3 is required for the NLIP SDK interop test" >&2; exit 1; }

# The real Python NLIP SDK and the websockets client, for the interop tests, the reference NLIP
# server (an HTTP agent behind silpgate), the A2A and MCP SDKs (agents and tools behind
# silpgate, clients of its A2A and MCP endpoints), the OpenTelemetry protos for the OTLP receiver of the
# telemetry test, and a YAML reader for the deployment test.
venv=target/pyenv
if ! "$venv/bin/python" -c 'import nlip_sdk, nlip_server, uvicorn, websockets, opentelemetry.proto, yaml, a2a, mcp' 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check nlip-sdk==0.1.3 nlip-server==0.1.3 \
    uvicorn==0.34.3 websockets==15.0.1 opentelemetry-proto==1.45.2 pyyaml==6.0.3 \
    'a2a-sdk[http-server]==1.3.0' mcp==2.3.0
fi
export SILPGATE_PYTHON="$PWD/$venv/bin/python"

# A RabbitMQ broker on 127.0.0.1:5672 (guest/guest) for the AMQP tests: installed when absent,
# started when down, and waited for (the node answers `await_startup` only once registered).
if ! command -v rabbitmq-server >/dev/null; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq rabbitmq-server >/dev/null
fi
if ! rabbitmqctl -q await_startup --timeout 5 >/dev/null 2>&1; then
  rabbitmq-server -detached
  for _ in $(seq 120); do
    rabbitmqctl -q await_startup --timeout 60 >/dev/null 2>&1 && break
    sleep 0.5
  done
fi
rabbitmqctl -q await_startup --timeout 10 || { echo "tests/run.sh: RabbitMQ did not start" >&2; exit 1; }
# Cluster mode's partitions sit behind a consistent-hash exchange (a plugin shipped with RabbitMQ).
rabbitmq-plugins enable -q rabbitmq_consistent_hash_exchange >/dev/null

cargo fmt --all -- --check
cargo clippy --locked --all-targets --test broker_cluster -- -D warnings
# The example agent runs as a program in the README quick-start test.
cargo build --locked --examples
cargo test --locked --all-targets
# Last: the three-node broker tests (Cargo.toml says why).
cargo test --locked --test broker_cluster
cargo test --locked --doc
