"""`fleetd mcp` driven by the official MCP Python SDK (package `mcp`), as a primary's client would.

Usage: session.py FLEETD_BINARY CONFIG. Prints one JSON object with what the client saw; the Rust
test (tests/mcp_sdk.rs) checks it. Exits non-zero, saying why, on anything the SDK refuses.
"""

import asyncio
import json
import os
import sys

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client


def text_of(result):
    return "".join(getattr(c, "text", "") for c in result.content)


async def main(binary, config):
    params = StdioServerParameters(
        command=binary, args=["--config", config, "mcp"], env=dict(os.environ)
    )
    seen = {}
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            init = await session.initialize()
            seen["server"] = {"name": init.server_info.name, "version": init.server_info.version}
            tools = await session.list_tools()
            seen["output_schemas"] = {
                t.name: (t.output_schema or {}).get("type") for t in tools.tools
            }
            roster = await session.call_tool("roster", {})
            seen["roster"] = {
                "is_error": roster.is_error,
                "structured": roster.structured_content,
            }
            spawn = await session.call_tool("spawn", {"profile": "worker"})
            seen["spawn"] = {"is_error": spawn.is_error, "text": text_of(spawn)}
            zero = await session.call_tool("inbox_pull", {"limit": 0})
            seen["limit_zero"] = {"is_error": zero.is_error, "text": text_of(zero)}
            five = await session.call_tool("inbox_pull", {"limit": "5"})
            seen["limit_string"] = {"is_error": five.is_error, "structured": five.structured_content}
    print(json.dumps(seen))


asyncio.run(main(sys.argv[1], sys.argv[2]))
