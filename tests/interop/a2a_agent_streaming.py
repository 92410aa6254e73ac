"""The agent of a2a_agent.py with a card that offers streaming, so that its clients send
`SendStreamingMessage`; it records the JSON-RPC methods it is called with, and answers
`GET /seen` with them, in order.

Usage: python a2a_agent_streaming.py PORT (0: any free port; it prints `listening PORT`)
"""

import json
import sys

import listening
from starlette.responses import JSONResponse

import a2a_agent
from asgi_body import read_body, replaying

SEEN = []


def recording(app):
    async def recorded(scope, receive, send):
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        if scope["method"] == "GET" and scope["path"] == "/seen":
            await JSONResponse(SEEN)(scope, receive, send)
            return
        if scope["method"] != "POST":
            await app(scope, receive, send)
            return
        body = await read_body(receive)
        try:
            SEEN.append(json.loads(body).get("method"))
        except ValueError:
            SEEN.append(None)
        await app(scope, replaying(body, receive), send)

    return recorded


if __name__ == "__main__":
    listening.serve(lambda port: recording(a2a_agent.app(port, streaming=True)), int(sys.argv[1]))
