"""The agent of a2a_agent.py as an A2A 0.3 agent: its card is a 0.3 card (the top-level
`url`, `protocolVersion` 0.3.0 and `preferredTransport`, no `supportedInterfaces`), and its
endpoint answers 0.3's methods (`message/send`, `tasks/get`, ...) through the SDK's 0.3
compatibility; a 1.0 method name gets the JSON-RPC error -32601 (method not found), as from
an agent that knows only 0.3.

Usage: python a2a_agent_v0_3.py PORT (0: any free port; it prints `listening PORT`)
"""

import json
import sys

import listening
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

import a2a_agent
from asgi_body import read_body, replaying
from a2a.server.request_handlers import DefaultRequestHandlerV2
from a2a.server.routes import create_jsonrpc_routes
from a2a.server.tasks import InMemoryTaskStore

OLD_METHODS = {"message/send", "message/stream", "tasks/get", "tasks/cancel", "tasks/resubscribe"}


def card_v0_3(port: int) -> dict:
    return {
        "name": "test-a2a-agent-0.3",
        "description": "The test agent, as an agent of A2A 0.3",
        "url": f"http://127.0.0.1:{port}/",
        "version": "1.0.0",
        "protocolVersion": "0.3.0",
        "preferredTransport": "JSONRPC",
        "capabilities": {"streaming": False, "pushNotifications": False},
        "defaultInputModes": ["text/plain", "application/json"],
        "defaultOutputModes": ["text/plain", "application/json"],
        "skills": [{"id": "echo", "name": "echo", "description": "echoes", "tags": ["test"]}],
    }


def only_0_3(app):
    async def narrowed(scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "POST":
            await app(scope, receive, send)
            return
        body = await read_body(receive)
        request = json.loads(body or b"{}")
        if request.get("method") not in OLD_METHODS:
            answer = {"jsonrpc": "2.0", "id": request.get("id"), "error": {"code": -32601, "message": "Method not found"}}
            await JSONResponse(answer)(scope, receive, send)
            return
        await app(scope, replaying(body, receive), send)

    return narrowed


def build(port: int):
    card = a2a_agent.card(port)
    handler = DefaultRequestHandlerV2(agent_executor=a2a_agent.Agent(), task_store=InMemoryTaskStore(), agent_card=card)
    rpc = Starlette(routes=create_jsonrpc_routes(handler, rpc_url="/", enable_v0_3_compat=True))
    routes = [Route("/.well-known/agent-card.json", lambda _request: JSONResponse(card_v0_3(port)))]
    outer = Starlette(routes=routes)
    narrowed = only_0_3(rpc)

    async def serve(scope, receive, send):
        if scope["type"] == "http" and scope["path"].startswith("/.well-known/"):
            await outer(scope, receive, send)
        else:
            await narrowed(scope, receive, send)

    return serve


if __name__ == "__main__":
    listening.serve(build, int(sys.argv[1]))
