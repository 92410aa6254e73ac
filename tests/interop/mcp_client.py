"""An MCP client built with the Python `mcp` package, for silpgate's /mcp endpoint.

Usage: python mcp_client.py URL [MODE]

MODE is how the client meets the server, as the SDK's `Client` takes it: `legacy` (the
initialize handshake), `auto` (`server/discover`, falling back to the handshake) or a
stateless revision such as `2026-07-28` (no probe, every request self-contained). Without
MODE, the session API of the handshake era is used directly.

Lists the tools, calls each once with good arguments and once with bad ones, and prints one
JSON object: {"protocol": the version the client spoke, "discovered": the supported versions
`server/discover` gave (or null), "tools": [names], "schemas": {name: inputSchema},
"ok": {name: structuredContent}, "errors": {name: {"isError": bool, "structured":
structuredContent, "meta": _meta, "text": text}}}.
"""

import asyncio
import json
import sys

from mcp.client.client import Client
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client


async def exercise(session, out: dict) -> None:
    listed = await session.list_tools()
    for tool in listed.tools:
        out["tools"].append(tool.name)
        out["schemas"][tool.name] = tool.input_schema

    decoded = await session.call_tool("silp_decode", {"text": "cancel(order9)"})
    out["ok"]["silp_decode"] = decoded.structured_content
    ir = decoded.structured_content["ir"]
    for name, arguments in [
        ("silp_compile", {"ir": ir, "frontend": "json"}),
        ("silp_validate", {"ir": ir}),
        ("silp_hash", {"ir": json.dumps(ir)}),
    ]:
        result = await session.call_tool(name, arguments)
        out["ok"][name] = result.structured_content

    for name, arguments in [
        ("silp_decode", {"text": "cancel(order9"}),
        ("silp_compile", {"ir": {"silp": "0.1"}}),
        ("silp_validate", {"ir": "{\"silp\": "}),
        ("silp_hash", {"ir": 42}),
    ]:
        result = await session.call_tool(name, arguments)
        text = " ".join(c.text for c in result.content if getattr(c, "text", None))
        out["errors"][name] = {
            "isError": result.is_error,
            "structured": result.structured_content,
            "meta": result.meta,
            "text": text,
        }


async def main(url: str, mode: str | None) -> None:
    out = {"protocol": None, "discovered": None, "tools": [], "schemas": {}, "ok": {}, "errors": {}}
    if mode is None:
        async with streamable_http_client(url) as streams:
            async with ClientSession(streams[0], streams[1]) as session:
                initialized = await session.initialize()
                out["protocol"] = initialized.protocol_version
                await exercise(session, out)
    else:
        async with Client(url, mode=mode) as client:
            out["protocol"] = client.protocol_version
            discovered = client.session.discover_result
            out["discovered"] = discovered.supported_versions if discovered is not None else None
            await exercise(client, out)
    print(json.dumps(out))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None))
