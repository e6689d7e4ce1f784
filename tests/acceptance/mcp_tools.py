"""A real MCP tool server process for the gateway's live test: ``payments.charge`` with an output
schema (its answers carry structuredContent), appending every call it serves to a file so the test
counts what reached the tool across gateway processes.

    python -m tests.acceptance.mcp_tools --port 9001 --record /tmp/charges.jsonl
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from mcp.server.mcpserver import MCPServer
from pydantic import BaseModel


class Charge(BaseModel):
    id: str
    amount: int


def build(record: Path) -> MCPServer:
    server = MCPServer("payments")

    @server.tool()
    def charge(amount: int) -> Charge:
        """Charge the card."""
        with record.open("a") as f:
            f.write(json.dumps({"amount": amount}) + "\n")
        n = len(record.read_text().splitlines())
        return Charge(id=f"ch-{n}", amount=amount)

    return server


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--record", type=Path, required=True)
    a = p.parse_args()
    print(f"listening on http://127.0.0.1:{a.port}/mcp", flush=True)
    build(a.record).run("streamable-http", host="127.0.0.1", port=a.port)
