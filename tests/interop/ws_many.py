"""Many WebSocket clients at once, as a Python NLIP client would write them (the `websockets`
package): each socket sends its share of requests without waiting, then reads answers until it
has one for each request it sent. An answer belongs to request i when its SILP IR names
`order<i>`; an answer to another socket's request, a repeated answer, or a missing one fails.

Usage: ws_many.py URL REQUESTS.jsonl. Each line of the file is {"socket": s, "i": i,
"envelope": {...}}. Prints one line per failure, then `ok: N answers`; exit 1 on any failure.
"""
import asyncio
import json
import re
import sys
from collections import defaultdict

import websockets

ORDER = re.compile(r"order(\d+)")
LIMIT_SECONDS = 90


async def one_socket(url, requests, failures):
    mine = {i for i, _ in requests}
    answered = set()
    async with websockets.connect(url, max_size=None) as ws:
        for _, envelope in requests:
            await ws.send(json.dumps(envelope))
        while len(answered) < len(mine):
            answer = json.loads(await asyncio.wait_for(ws.recv(), LIMIT_SECONDS))
            if answer.get("subformat") != "silp-ir":
                failures.append(f"not an IR answer: {answer}")
                return answered
            found = ORDER.search(json.dumps(answer.get("content")))
            i = int(found.group(1)) if found else None
            if i not in mine:
                failures.append(f"an answer to request {i} reached a socket that did not ask it")
            elif i in answered:
                failures.append(f"request {i} was answered twice")
            answered.add(i)
    return answered


async def main(url, path):
    by_socket = defaultdict(list)
    with open(path, encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            by_socket[row["socket"]].append((row["i"], row["envelope"]))
    failures = []
    sockets = [one_socket(url, requests, failures) for requests in by_socket.values()]
    try:
        results = await asyncio.wait_for(asyncio.gather(*sockets), LIMIT_SECONDS)
    except asyncio.TimeoutError:
        print(f"FAIL: not every socket had its answers within {LIMIT_SECONDS} s")
        return 1
    for failure in failures:
        print("FAIL:", failure)
    total = sum(len(r) for r in results)
    print(f"ok: {total} answers")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1], sys.argv[2])))
