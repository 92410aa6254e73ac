"""An MCP client built with the Python `mcp` package, for silpgate's /mcp endpoint.

Usage: python mcp_client.py URL

Lists the tools, calls each once with good arguments and once with bad ones, and prints one
JSON object: {"tools": [names], "schemas": {name: inputSchema}, "ok": {name: structuredContent},
"errors": {name: {"isError": bool, "structured": structuredContent, "text": text}}}.
"""

import asyncio
import json
import sys

from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client


async def main(url: str) -> None:
    out = {"tools": [], "schemas": {}, "ok": {}, "errors": {}}
    async with streamable_http_client(url) as streams:
        async with ClientSession(streams[0], streams[1]) as session:
            await session.initialize()
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
                out["errors"][name] = {"isError": result.is_error, "structured": result.structured_content, "text": text}
    print(json.dumps(out))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
