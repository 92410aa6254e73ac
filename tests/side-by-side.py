#!/usr/bin/env python3
"""Runs the test binaries `cargo test --no-run --message-format=json` built, two at a time.

Each test binary that uses the local broker works in a virtual host of its own
(tests/support/broker.rs), so binaries can run side by side on it. Two lanes share the machine:
the binaries whose tests time hand-overs, kills and reconnects run one after another in a lane of
their own, so that no two of them compete for its two cores; every other binary runs in the
second lane, the longest first. Each binary's output is printed whole when it ends, with its
time, and each has a bound, so a hung binary is named instead of eating CI's own bound. Every
binary runs whatever fails before it; the exit status says whether all passed.

    cargo test --locked --all-targets --no-run --message-format=json | python3 tests/side-by-side.py
"""

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time

# Test binaries (by target name) whose tests time hand-overs and kills of several instances:
# one after another, in their own lane.
TIMED = ["cluster", "cluster_faults"]
# Known to take long: started first in the other lane, so that the lanes end close together.
LONG_FIRST = ["amqp", "agent_protocols", "every_door", "bridges", "principals"]
# A binary still running after this long is stopped and reported as hung.
BOUND_SECS = 15 * 60


def test_binaries(cargo_messages):
    """(label, target name, executable) of every artifact cargo runs under `cargo test`."""
    found = []
    for line in cargo_messages:
        try:
            message = json.loads(line)
        except json.JSONDecodeError:
            continue
        if message.get("reason") != "compiler-artifact" or not message.get("executable"):
            continue
        if not message["profile"]["test"] and message["target"]["kind"] != ["bench"]:
            continue
        kind, name = message["target"]["kind"][0], message["target"]["name"]
        found.append((f"{kind} {name}", name if kind == "test" else None, message["executable"]))
    return found


def run(label, executable, results, print_lock):
    started = time.monotonic()
    with open(os.devnull, "rb") as nothing:
        process = subprocess.Popen(
            [executable], stdin=nothing, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            output, _ = process.communicate(timeout=BOUND_SECS)
            status = process.returncode
        except subprocess.TimeoutExpired:
            # The whole group: a hung test's daemons and agents go with it.
            os.killpg(process.pid, signal.SIGKILL)
            output, _ = process.communicate()
            output += f"\n{label}: still running after {BOUND_SECS} s, stopped\n".encode()
            status = "hung"
    took = time.monotonic() - started
    verdict = "ok" if status == 0 else f"FAILED ({status})"
    with print_lock:
        print(f"\n===== {label}: {verdict} in {took:.0f} s =====", flush=True)
        sys.stdout.write(output.decode(errors="replace"))
        sys.stdout.flush()
    results.append((label, status == 0, took))


def lane(work, results, print_lock):
    while True:
        try:
            label, executable = work.get_nowait()
        except queue.Empty:
            return
        run(label, executable, results, print_lock)


def main():
    binaries = test_binaries(sys.stdin)
    if not binaries:
        sys.exit("side-by-side.py: cargo listed no test binary")
    timed, rest = queue.Queue(), queue.Queue()
    by_name = {name: (label, exe) for label, name, exe in binaries if name}
    for name in TIMED:
        if name in by_name:
            timed.put(by_name[name])
    first = [by_name[name] for name in LONG_FIRST if name in by_name]
    others = [(label, exe) for label, name, exe in binaries if name not in TIMED + LONG_FIRST]
    for item in first + others:
        rest.put(item)
    results, print_lock = [], threading.Lock()
    lanes = [threading.Thread(target=lane, args=(q, results, print_lock)) for q in (timed, rest)]
    started = time.monotonic()
    for thread in lanes:
        thread.start()
    for thread in lanes:
        thread.join()
    failed = [label for label, passed, _ in results if not passed]
    print(f"\n{len(results)} test binaries in {time.monotonic() - started:.0f} s; by time:")
    for label, passed, took in sorted(results, key=lambda r: -r[2]):
        print(f"  {took:6.0f} s  {'ok' if passed else 'FAILED'}  {label}")
    if failed:
        sys.exit("failed: " + ", ".join(failed))


if __name__ == "__main__":
    main()
