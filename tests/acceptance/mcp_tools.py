"""A real MCP tool server process for the gateway's live test: ``payments.charge`` with an output
schema (its answers carry structuredContent), appending every call it serves to a file so the test
counts what reached the tool across gateway processes.

    python -m tests.acceptance.mcp_tools --port 9001 --record /tmp/charges.jsonl
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from mcp.server.mcpserver import Context, MCPServer
from pydantic import BaseModel


class Charge(BaseModel):
    id: str
    amount: int


def build(record: Path) -> MCPServer:
    server = MCPServer("payments")

    @server.tool()
    def charge(amount: int, ctx: Context) -> Charge:
        """Charge the card (once per idempotency key, as a payment provider would)."""
        key = (ctx.request_context.meta or {}).get("controlplane/idempotency_key")
        lines = record.read_text().splitlines() if record.exists() else []
        for n, line in enumerate(lines, 1):
            if key and json.loads(line).get("key") == key:
                return Charge(id=f"ch-{n}", amount=amount)
        with record.open("a") as f:
            f.write(json.dumps({"amount": amount, "key": key}) + "\n")
        return Charge(id=f"ch-{len(lines) + 1}", amount=amount)

    return server


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--record", type=Path, required=True)
    a = p.parse_args()
    print(f"listening on http://127.0.0.1:{a.port}/mcp", flush=True)
    build(a.record).run("streamable-http", host="127.0.0.1", port=a.port)
