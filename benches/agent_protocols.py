"""Added latency of silpgate's A2A and MCP hops: the same Python client (httpx, one keep-alive
connection, sequential requests) times a small text request sent straight to the test agent,
and the same text sent to silpgate's /nlip, which carries it to that agent.

Usage: python agent_protocols.py A2A_URL MCP_URL SILPGATE_A2A_URL SILPGATE_MCP_URL [COUNT]
       python agent_protocols.py --streamed AGENT_URL DOOR_URL [COUNT]

A2A_URL is the A2A agent's JSON-RPC endpoint, MCP_URL the MCP server's endpoint; the two
silpgate URLs are /nlip of a silpgate routing to the A2A agent and to the MCP tool. Prints one
line per path: name, median and p99 in microseconds, after 200 warm-up requests.

With --streamed, a streamed task (`SendStreamingMessage` of "progress report", which the
streaming test agent works on for three steps of half a second, streaming each) is sent COUNT
times (20 by default) straight to the agent at AGENT_URL and to silpgate's A2A door at
DOOR_URL; prints, for each, the median time to the first event and to the last, in
milliseconds, and the number of events. Then, as a client whose stream dropped would, it
follows each such task again with SubscribeToTask, and prints the median and p99 time to
its first event.
"""

import json
import statistics
import sys
import time

import httpx


def timed(send, count):
    for _ in range(200):
        send()
    samples = []
    for _ in range(count):
        started = time.perf_counter_ns()
        send()
        samples.append((time.perf_counter_ns() - started) / 1000)
    samples.sort()
    return statistics.median(samples), samples[int(len(samples) * 0.99) - 1]


def main():
    a2a_url, mcp_url, via_a2a, via_mcp = sys.argv[1:5]
    count = int(sys.argv[5]) if len(sys.argv) > 5 else 1000
    client = httpx.Client(timeout=30)
    n = [0]

    def a2a_direct():
        n[0] += 1
        body = {"jsonrpc": "2.0", "id": n[0], "method": "SendMessage", "params": {
            "message": {"messageId": f"m{n[0]}", "role": "ROLE_USER", "contextId": "bench", "parts": [{"text": "hello"}]},
            "configuration": {"returnImmediately": True}}}
        r = client.post(a2a_url, json=body, headers={"A2A-Version": "1.0"})
        assert r.json()["result"]["message"]["parts"][0]["text"].startswith("echo: hello"), r.text

    envelope = {"format": "text", "subformat": "english", "content": "hello",
                "submessages": [{"format": "token", "subformat": "conversation", "content": "bench"}]}

    def a2a_via():
        r = client.post(via_a2a, json=envelope)
        assert r.json()["content"].startswith("echo: hello"), r.text

    init = client.post(mcp_url, headers={"Accept": "application/json, text/event-stream"}, json={
        "jsonrpc": "2.0", "id": 0, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "bench", "version": "1"}}})
    session = init.headers["mcp-session-id"]
    mcp_headers = {"Accept": "application/json, text/event-stream", "mcp-session-id": session,
                   "mcp-protocol-version": "2025-06-18"}
    client.post(mcp_url, headers=mcp_headers, json={"jsonrpc": "2.0", "method": "notifications/initialized"})

    def mcp_direct():
        n[0] += 1
        r = client.post(mcp_url, headers=mcp_headers, json={"jsonrpc": "2.0", "id": n[0], "method": "tools/call",
            "params": {"name": "inspect", "arguments": {"silp_encoding": "natural", "silp_payload": "hello", "priority": "high"}}})
        data = next(line[5:] for line in r.text.splitlines() if line.startswith("data:"))
        assert json.loads(data)["result"]["structuredContent"]["saw_payload"] == "hello", r.text

    def mcp_via():
        r = client.post(via_mcp, json=envelope)
        assert r.json()["content"]["saw_payload"] == "hello", r.text

    for name, send in [("a2a direct", a2a_direct), ("a2a via silpgate", a2a_via),
                       ("mcp direct", mcp_direct), ("mcp via silpgate", mcp_via)]:
        median, p99 = timed(send, count)
        print(f"{name}: median {median:.0f} us, p99 {p99:.0f} us", flush=True)


def streamed(agent_url, door_url, count):
    client = httpx.Client(timeout=30)

    def one(url, n):
        body = {"jsonrpc": "2.0", "id": n, "method": "SendStreamingMessage", "params": {
            "message": {"messageId": f"s{n}-{url[-6:]}", "role": "ROLE_USER", "contextId": f"stream-{n}",
                        "parts": [{"text": "progress report"}]}}}
        started = time.perf_counter()
        first = last = None
        events = []
        with client.stream("POST", url, json=body, headers={"A2A-Version": "1.0"}) as r:
            for line in r.iter_lines():
                if not line.startswith("data:"):
                    continue
                now = time.perf_counter() - started
                first = now if first is None else first
                last = now
                events.append(json.loads(line[5:]))
        # Straight from the agent, the task's chunks and its completion; through silpgate, the
        # answer it built from them.
        text = json.dumps(events)
        assert "part 3" in text, text
        return first * 1000, last * 1000, len(events)

    for name, url in [("streamed task direct", agent_url), ("streamed task via silpgate's A2A door", door_url)]:
        one(url, 0)
        runs = [one(url, n) for n in range(1, count + 1)]
        first = statistics.median(r[0] for r in runs)
        last = statistics.median(r[1] for r in runs)
        events = statistics.median(r[2] for r in runs)
        print(f"{name}: first event {first:.0f} ms, last event {last:.0f} ms, {events:.0f} events (medians of {count})",
              flush=True)


def subscribed(agent_url, door_url, count):
    """A client whose stream dropped follows its task again: SendStreamingMessage, the first
    event read (the task), the stream closed; then SubscribeToTask, timed to its first event."""
    client = httpx.Client(timeout=30)
    headers = {"A2A-Version": "1.0"}

    def one(url, n):
        body = {"jsonrpc": "2.0", "id": n, "method": "SendStreamingMessage", "params": {
            "message": {"messageId": f"r{n}-{url[-6:]}", "role": "ROLE_USER", "contextId": f"resume-{n}",
                        "parts": [{"text": "progress report"}]}}}
        with client.stream("POST", url, json=body, headers=headers) as r:
            for line in r.iter_lines():
                if line.startswith("data:"):
                    task = json.loads(line[5:])["result"]["task"]["id"]
                    break
        body = {"jsonrpc": "2.0", "id": n, "method": "SubscribeToTask", "params": {"id": task}}
        started = time.perf_counter()
        with client.stream("POST", url, json=body, headers=headers) as r:
            for line in r.iter_lines():
                if line.startswith("data:"):
                    first = json.loads(line[5:])
                    assert first["result"]["task"]["id"] == task, first
                    return (time.perf_counter() - started) * 1000

    for name, url in [("SubscribeToTask direct", agent_url), ("SubscribeToTask via silpgate's A2A door", door_url)]:
        one(url, 0)
        runs = sorted(one(url, n) for n in range(1, count + 1))
        p99 = runs[min(len(runs) - 1, round(len(runs) * 0.99))]
        print(f"{name}: first event {statistics.median(runs):.1f} ms median, {p99:.1f} ms p99 (of {count})",
              flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "--streamed":
        streamed(sys.argv[2], sys.argv[3], int(sys.argv[4]) if len(sys.argv) > 4 else 20)
        subscribed(sys.argv[2], sys.argv[3], int(sys.argv[4]) if len(sys.argv) > 4 else 20)
    else:
        main()
