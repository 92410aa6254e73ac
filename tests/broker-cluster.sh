#!/usr/bin/env bash
# A three-node RabbitMQ cluster on this machine, for the multi-node tests: the local broker
# (rabbit@localhost on 5672) and two extra nodes, rabbit2@localhost on 5673 and
# rabbit3@localhost on 5674, joined to it.
#
#   tests/broker-cluster.sh up           start the extra nodes and join them (idempotent)
#   tests/broker-cluster.sh down         delete the tests' leftover sgtest.* queues, stop the extra
#                                        nodes and make the local node forget them
#   tests/broker-cluster.sh stop N       stop node N (2 or 3) gracefully
#   tests/broker-cluster.sh start N      start node N again (it rejoins the cluster)
#   tests/broker-cluster.sh kill N       SIGKILL node N (a crash)
#   tests/broker-cluster.sh pid N        print node N's OS pid
#
# Each extra node needs its own listener, distribution port and directories: the local
# broker's config file pins 5672, so a node port alone is not enough.
set -euo pipefail

root=${SILPGATE_BROKER_CLUSTER_DIR:-/tmp/silpgate-broker-cluster}
plugins='[rabbitmq_consistent_hash_exchange].'

node_name() { echo "rabbit$1@localhost"; }

node_env() {
  local n=$1 dir="$root/rabbit$1"
  export RABBITMQ_NODENAME
  RABBITMQ_NODENAME=$(node_name "$n")
  export RABBITMQ_CONFIG_FILE="$dir/rabbitmq"
  export RABBITMQ_DIST_PORT=$((25680 + n))
  export RABBITMQ_MNESIA_BASE="$dir/mnesia"
  export RABBITMQ_MNESIA_DIR="$dir/mnesia/node"
  export RABBITMQ_LOG_BASE="$dir/log"
  export RABBITMQ_PID_FILE="$dir/node.pid"
  export RABBITMQ_ENABLED_PLUGINS_FILE="$dir/enabled_plugins"
  export RABBITMQ_FEATURE_FLAGS_FILE="$dir/feature_flags"
  export RABBITMQ_PLUGINS_EXPAND_DIR="$dir/plugins-expand"
  export RABBITMQ_QUORUM_DIR="$dir/mnesia/node/quorum"
  export RABBITMQ_STREAM_DIR="$dir/mnesia/node/stream"
}

# Starts node N from its directory (created on first use) and waits until it runs.
start_node() {
  local n=$1 dir="$root/rabbit$1"
  mkdir -p "$dir/mnesia" "$dir/log" "$dir/plugins-expand"
  printf 'listeners.tcp.local = 127.0.0.1:%s\n' $((5671 + n)) >"$dir/rabbitmq.conf"
  echo "$plugins" >"$dir/enabled_plugins"
  chown -R rabbitmq:rabbitmq "$dir"
  if alive "$n"; then
    # Its VM outlived a stopped application (an interrupted run): start the application.
    rabbitmqctl -q -n "$(node_name "$n")" start_app
  else
    ( node_env "$n"; rabbitmq-server -detached )
  fi
  # A detached node registers with epmd only after a while; until then it cannot be asked.
  for _ in $(seq 120); do
    running "$n" && return 0
    sleep 0.5
  done
  echo "broker-cluster: rabbit$n did not start (log: $dir/log)" >&2
  exit 1
}

joined() { rabbitmqctl -q cluster_status --formatter json | grep -q "\"$(node_name "$1")\""; }
# The node's RabbitMQ application runs.
running() { rabbitmqctl -q -n "$(node_name "$1")" await_startup --timeout 2 >/dev/null 2>&1; }
# The node's Erlang VM answers (its application may be stopped).
alive() { rabbitmq-diagnostics -q -n "$(node_name "$1")" ping -t 3 >/dev/null 2>&1; }

up() {
  rabbitmqctl -q await_startup --timeout 10 >/dev/null \
    || { echo "broker-cluster: the local broker rabbit@localhost is not running" >&2; exit 1; }
  mkdir -p "$root"
  for n in 2 3; do
    running "$n" || start_node "$n"
    if ! joined "$n"; then
      local node
      node=$(node_name "$n")
      rabbitmqctl -q -n "$node" stop_app
      rabbitmqctl -q -n "$node" reset
      rabbitmqctl -q -n "$node" join_cluster rabbit@localhost
      rabbitmqctl -q -n "$node" start_app
    fi
  done
  # A running stream coordinator takes the new nodes in on its next tick. Streams declared
  # before that would be placed by a coordinator that does not know them yet.
  if rabbitmqctl -q eval 'ra:members({rabbit_stream_coordinator, node()}).' 2>/dev/null | grep -q '^{ok'; then
    for round in 1 2 3; do
      for _ in $(seq 60); do
        coordinator_complete && break 2
        sleep 0.5
      done
      [ "$round" -lt 3 ] || break
      # Still not taken in after 30 s: a node's application starting again makes the
      # coordinator look at its members again.
      for n in 2 3; do
        coordinator_has "$n" && continue
        echo "broker-cluster: the stream coordinator has not taken in rabbit$n; restarting its application" >&2
        rabbitmqctl -q -n "$(node_name "$n")" stop_app
        rabbitmqctl -q -n "$(node_name "$n")" start_app
      done
    done
    coordinator_complete || {
      echo "broker-cluster: the stream coordinator did not take in the extra nodes:" >&2
      rabbitmqctl -q eval 'ra:members({rabbit_stream_coordinator, node()}).' >&2 || true
      exit 1
    }
  fi
  rabbitmqctl -q cluster_status
}

# The stream coordinator's members are all three nodes.
coordinator_complete() { coordinator_has 2 && coordinator_has 3; }

# Node N is a member of the stream coordinator.
coordinator_has() {
  local members
  members=$(rabbitmqctl -q eval 'ra:members({rabbit_stream_coordinator, node()}).' 2>/dev/null) || return 1
  grep -q "$(node_name "$1")" <<<"$members"
}

# Deletes what tests left on the broker (a failed test does not clean up after itself), while
# every node still runs: a stream left behind is recovered by a node joining later, which can
# then start a stream coordinator of its own beside the cluster's.
forget_leftovers() {
  local queue
  # With a node down a quorum queue may have no majority to agree on its deletion.
  running 2 && running 3 || return 0
  for queue in $(rabbitmqctl -q list_queues --no-table-headers name 2>/dev/null | grep '^sgtest\.' || true); do
    timeout 60 rabbitmqctl -q delete_queue "$queue" >/dev/null 2>&1 || echo "broker-cluster: could not delete $queue" >&2
  done
}

down() {
  # One node at a time, each while the others still form a majority: its quorum-queue replicas
  # and its stream-coordinator membership are removed, then it is stopped and forgotten. Stopping
  # both extra nodes first would leave Raft clusters (the stream coordinator above all) with one
  # of three members, unable to agree even on removing the other two: every later stream
  # declaration on the local node then fails with `coordinator_unavailable`.
  # A node a failed test left stopped or killed comes back first: without it the Raft clusters
  # it belongs to may have no majority to let it (or anything else) go.
  for n in 2 3; do
    if [ -d "$root/rabbit$n" ] && joined "$n" && ! running "$n"; then
      start_node "$n"
    fi
  done
  forget_leftovers
  for n in 3 2; do
    local node
    node=$(node_name "$n")
    if joined "$n" && running "$n"; then
      rabbitmq-queues -q shrink "$node" >/dev/null 2>&1 || true
      rabbitmqctl -q eval "ra:remove_member({rabbit_stream_coordinator, node()}, {rabbit_stream_coordinator, '$node'})." \
        >/dev/null 2>&1 || true
    fi
    if alive "$n"; then
      rabbitmqctl -q -n "$node" stop >/dev/null 2>&1 || kill -9 "$(node_pid "$n")" 2>/dev/null || true
    elif [ -f "$root/rabbit$n/node.pid" ]; then
      kill -9 "$(cat "$root/rabbit$n/node.pid")" 2>/dev/null || true
    fi
    if joined "$n"; then
      rabbitmqctl -q forget_cluster_node "$node" >/dev/null
    fi
  done
  # The extra nodes' logs outlive them, for a failed run to be read afterwards.
  if [ -d "$root" ]; then
    rm -rf "$root.logs"
    mkdir -p "$root.logs"
    for n in 2 3; do
      [ -d "$root/rabbit$n/log" ] && cp -r "$root/rabbit$n/log" "$root.logs/rabbit$n"
    done
  fi
  rm -rf "$root"
  # The local node must be able to declare streams again (cluster mode's tests need it).
  for _ in $(seq 40); do
    coordinator_alone && return 0
    sleep 0.5
  done
  echo "broker-cluster: the stream coordinator on rabbit@localhost still names a forgotten node:" >&2
  rabbitmqctl -q eval 'ra:members({rabbit_stream_coordinator, node()}).' >&2 || true
  exit 1
}

# The stream coordinator has no members but the local node (or has never been started).
coordinator_alone() {
  local members
  members=$(rabbitmqctl -q eval 'ra:members({rabbit_stream_coordinator, node()}).' 2>/dev/null) || return 1
  ! grep -q 'rabbit[23]@localhost' <<<"$members"
}

node_pid() { cat "$root/rabbit$1/node.pid"; }

case "${1:-}" in
  up) up ;;
  down) down ;;
  stop) rabbitmqctl -q -n "$(node_name "$2")" stop ;;
  start) start_node "$2" ;;
  kill) kill -9 "$(node_pid "$2")" ;;
  pid) node_pid "$2" ;;
  *) echo "usage: $0 up|down|stop N|start N|kill N|pid N" >&2; exit 2 ;;
esac
