#!/usr/bin/env bash
# The README's quick start, run as a newcomer runs it: every command of its "Quick start"
# section up to the test command, exactly as written, in a fresh copy of the project. The
# daemon's command runs in the background (the README runs it in a shell of its own); a
# command followed by a `# <output>` line must print that output. The broker connection
# goes to a virtual host of this check's own, through the environment both the daemon and
# the example agent read (SILPGATE_AMQP_URL); the HTTP port is the README's, 8787, which must
# be free. Needs RabbitMQ (tests/run.sh starts it).
#
# What is checked is that the commands run and answer as written, not the optimiser: the
# release profile is built without optimisation and incrementally (through cargo's
# environment, CARGO_PROFILE_RELEASE_*), which takes a fresh copy minutes less to build.
set -euo pipefail
cd "$(dirname "$0")/.."

command -v curl >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq curl >/dev/null; }
readme=README.md
port=8787
vhost=silpgate-quickstart
if (echo >/dev/tcp/127.0.0.1/$port) 2>/dev/null; then
  echo "tests/quickstart.sh: 127.0.0.1:$port is taken; the README's commands need it" >&2
  exit 1
fi

# The commands: the lines of the ```sh blocks between "## Quick start" and the test command.
mapfile -t lines < <(awk '
  /^## Quick start/ { inside = 1; next }
  inside && /^## / { exit }
  inside && /^bash tests\/run.sh/ { exit }
  inside && /^```sh/ { code = 1; next }
  inside && /^```/ { if (code) print "---"; code = 0; next }
  # A line ending in a backslash goes on in the next: one command.
  inside && code && /\\$/ { sub(/\\$/, ""); held = held $0; next }
  inside && code { print held $0; held = "" }
' "$readme")
[ "${#lines[@]}" -gt 0 ] || { echo "tests/quickstart.sh: no commands found in $readme" >&2; exit 1; }

work=$(mktemp -d)
copy="$work/silpgate"
mkdir "$copy"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -- "-$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do
    for _ in $(seq 50); do kill -0 -- "-$pid" 2>/dev/null || break; sleep 0.2; done
    kill -9 -- "-$pid" 2>/dev/null || true
  done
  rabbitmqctl -q delete_vhost "$vhost" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
tar --exclude=./target --exclude=./.git -cf - . | tar -xf - -C "$copy"
export CARGO_PROFILE_RELEASE_OPT_LEVEL=${CARGO_PROFILE_RELEASE_OPT_LEVEL:-0}
export CARGO_PROFILE_RELEASE_INCREMENTAL=${CARGO_PROFILE_RELEASE_INCREMENTAL:-true}
rabbitmqctl -q delete_vhost "$vhost" >/dev/null 2>&1 || true
rabbitmqctl -q add_vhost "$vhost"
rabbitmqctl -q set_permissions -p "$vhost" guest '.*' '.*' '.*'
export SILPGATE_AMQP_URL="amqp://guest:guest@127.0.0.1:5672/$vhost"
log="$work/daemon.log"

# Runs a command in the background, in the copy, as the leader of a process group of its own
# (cargo and the program it runs), so that the whole group is stopped at the end.
spawn() {
  setsid bash -c 'cd "$1" && eval "$2"' _ "$copy" "$1" >"$2" 2>&1 &
  pids+=($!)
}

# Waits until the daemon answers /readyz (its first build may take minutes), or says why not.
ready() {
  local daemon=$1
  for _ in $(seq 3600); do
    curl -sf "http://127.0.0.1:$port/readyz" >/dev/null && return 0
    kill -0 "$daemon" 2>/dev/null || { echo "the daemon's command ended:" >&2; tail -30 "$log" >&2; return 1; }
    sleep 0.5
  done
  echo "the daemon was not ready within 30 minutes" >&2
  return 1
}

# Waits until a program run in the background says something of its own (past cargo's build
# lines), or says why it did not.
started() {
  local pid=$1 own_log=$2
  for _ in $(seq 3600); do
    grep -qvE '^ *(Compiling|Finished|Running|Blocking|Locking|Updating|Downloading|Downloaded|warning)' "$own_log" 2>/dev/null && return 0
    kill -0 "$pid" 2>/dev/null || { echo "it ended:" >&2; tail -30 "$own_log" >&2; return 1; }
    sleep 0.5
  done
  echo "it said nothing within 30 minutes" >&2
  return 1
}

block=0
previous=""
for line in "${lines[@]}"; do
  if [ "$line" = "---" ]; then
    block=$((block + 1))
    continue
  fi
  if [[ "$line" == "# "* ]]; then
    # What the command before it prints.
    expected=${line#"# "}
    [ "$got" = "$expected" ] || {
      printf 'tests/quickstart.sh: `%s`\n  printed:  %s\n  expected: %s\n' "$previous" "$got" "$expected" >&2
      exit 1
    }
    echo "quickstart: as the README says: $expected"
    continue
  fi
  if [ "$block" -eq 0 ]; then
    # The daemon, in a shell of its own.
    spawn "$line" "$log"
    ready "${pids[-1]}"
    echo "quickstart: \`$line\` serves on $port"
  elif [[ "$line" == *"&" ]]; then
    # Left running, as the README leaves it; a person sees it start before going on.
    own_log="$work/$block.log"
    spawn "${line%&}" "$own_log"
    started "${pids[-1]}" "$own_log"
    echo "quickstart: \`$line\` runs"
  else
    got=$(cd "$copy" && bash -c "$line") || { echo "tests/quickstart.sh: \`$line\` failed" >&2; tail -30 "$log" >&2; exit 1; }
    if [ -z "$got" ] || [[ "$got" == *'"messagetype":"error"'* ]]; then
      printf 'tests/quickstart.sh: `%s` printed: %s\n' "$line" "$got" >&2
      tail -30 "$log" >&2
      exit 1
    fi
    echo "quickstart: \`${line:0:60}...\` answered"
  fi
  previous=$line
done
echo "quickstart: 1 passed, 0 failed"
