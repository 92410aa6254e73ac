"""The tools of mcp_tool.py, served as an MCP server of the handshake era (2025-11-25 and
before) answers: a request in a later revision, `server/discover` first, gets the JSON-RPC
error -32601 (method not found) that such a server gives a method it does not know. The
Python SDK serves both eras from one endpoint, so the era is narrowed here, in front of it.

Usage: python mcp_tool_handshake_era.py PORT (0: any free port; it prints `listening PORT`)
"""

import json
import sys

import listening
import mcp_tool
from asgi_body import read_body

HANDSHAKE_ERA = {"2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"}


def handshake_era_only(app):
    async def narrowed(scope, receive, send):
        if scope["type"] == "http":
            version = dict(scope["headers"]).get(b"mcp-protocol-version")
            if version is not None and version.decode("latin-1") not in HANDSHAKE_ERA:
                request = json.loads(await read_body(receive) or b"{}")
                answer = json.dumps({"jsonrpc": "2.0", "id": request.get("id"),
                                     "error": {"code": -32601, "message": "Method not found"}}).encode()
                await send({"type": "http.response.start", "status": 200,
                            "headers": [(b"content-type", b"application/json")]})
                await send({"type": "http.response.body", "body": answer})
                return
        await app(scope, receive, send)

    return narrowed


if __name__ == "__main__":
    app = mcp_tool.counting_streams(handshake_era_only(mcp_tool.server.streamable_http_app()))
    listening.serve(lambda _port: app, int(sys.argv[1]))
