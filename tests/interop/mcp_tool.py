"""An MCP server (streamable HTTP at /mcp) built with the Python `mcp` package, for the MCP
bridge tests.

Usage: python mcp_tool.py PORT (0: any free port; it prints `listening PORT`)

Tools:
- `plan(silp_encoding, silp_payload, priority)`: reads the SILP wrapper of draft -02 §7.2 and
  answers with one: SILP code `book(<argument>)` for a `code` payload `verb(argument)`,
  plus the `priority` it was given (a fixed argument of the agent's configuration) and the
  encoding it saw. It counts its calls and the session renewal notices it finds in the
  calls' `_meta` (`silp/renewal`); a `natural` payload is answered, in natural language,
  with `calls=N renewals=[turns]`;
- `inspect(silp_encoding, silp_payload, priority)`: answers what it was given, as structured
  content (not a SILP wrapper), with the protocol version the call came in and how many
  standing event streams (`GET /mcp`) clients have opened so far;
- `broken(silp_encoding, silp_payload)`: always fails, so the result has isError;
- `strict(silp_encoding, silp_payload)`: refuses anything but SILP code with a JSON-RPC error
  (invalid params), as a tool whose contract is violated does;
- `charge(silp_encoding, silp_payload, account)`: requires an argument silpgate does not send
  unless the agent's configuration gives it (`silpgate agents check` says so).
"""

import re
import sys

import listening
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.shared.exceptions import MCPError
from pydantic import BaseModel

server = MCPServer("test-mcp-tools")


class Wrapped(BaseModel):
    silp_encoding: str
    silp_payload: str
    saw_encoding: str
    priority: str


CALLS = 0
RENEWALS = []


@server.tool(description="Plans a SILP task and answers in SILP code")
def plan(silp_encoding: str, silp_payload: str, ctx: Context, priority: str = "none") -> Wrapped:
    global CALLS
    CALLS += 1
    renewal = (ctx.request_context.meta or {}).get("silp/renewal")
    if renewal is not None:
        RENEWALS.append(int(renewal["turn"]))
    if silp_encoding == "natural":
        said = f"calls={CALLS} renewals={RENEWALS}"
        return Wrapped(silp_encoding="natural", silp_payload=said, saw_encoding=silp_encoding, priority=priority)
    match = re.fullmatch(r"\s*[a-z_]+\((.*)\)\s*", silp_payload)
    argument = match.group(1) if match else "unknown"
    return Wrapped(
        silp_encoding="code",
        silp_payload=f"book({argument})",
        saw_encoding=silp_encoding,
        priority=priority,
    )


class Seen(BaseModel):
    saw_encoding: str
    saw_payload: str
    priority: str
    protocol: str | None
    standing_streams: int


STANDING_STREAMS = 0


@server.tool(description="Says what it was given")
def inspect(silp_encoding: str, silp_payload: str, ctx: Context, priority: str = "none") -> Seen:
    return Seen(
        saw_encoding=silp_encoding,
        saw_payload=silp_payload,
        priority=priority,
        protocol=ctx.protocol_version,
        standing_streams=STANDING_STREAMS,
    )


@server.tool(description="Always fails")
def broken(silp_encoding: str, silp_payload: str) -> str:
    raise ToolError(f"cannot handle {silp_encoding} payloads today")


@server.tool(description="Needs an account besides the SILP wrapper")
def charge(silp_encoding: str, silp_payload: str, account: str) -> str:
    return f"{account}: {silp_payload}"


@server.tool(description="Takes SILP code only")
def strict(silp_encoding: str, silp_payload: str) -> str:
    if silp_encoding != "code":
        raise MCPError(-32602, f"strict takes SILP code, not {silp_encoding}")
    return silp_payload


def counting_streams(app):
    """The app, counting the standing event streams (`GET`) clients open."""

    async def counted(scope, receive, send):
        global STANDING_STREAMS
        if scope["type"] == "http" and scope["method"] == "GET":
            STANDING_STREAMS += 1
        await app(scope, receive, send)

    return counted


if __name__ == "__main__":
    listening.serve(lambda _port: counting_streams(server.streamable_http_app()), int(sys.argv[1]))
