"""The MCP gateway in front of an in-process MCP tool server, against the SDK's fake control plane:
every tools/call is a declared effect, a paused run's call is a tool error that never reaches the tool
server, an approval_required denial waits for an approval, and results and failures become outcomes."""

from __future__ import annotations

import asyncio

import httpx
import pytest

pytest.importorskip("mcp")

from mcp import Client as McpClient
from mcp.server.mcpserver import MCPServer

from controlplane_sdk import Client, Worker
from controlplane_sdk.adapters.mcp_gateway import McpGateway
from tests.sdk.conftest import LEASE, RUN, FakeServer

HB = f"/leases/{LEASE}/heartbeat"
GO = (200, {"directive": "continue", "reason": "", "expires_at": "2030-01-01T00:00:00Z"})
PAUSE = (200, {"directive": "pause", "reason": "incident 7", "expires_at": "2030-01-01T00:00:00Z"})


def payments(world: list) -> MCPServer:
    server = MCPServer("payments")

    @server.tool()
    def charge(amount: int) -> str:
        """Charge the card."""
        if amount < 0:
            raise ValueError("negative amount")
        world.append(("charge", amount))
        return f"ch-{amount}"

    return server


def claim(server: FakeServer):
    client = Client("http://cp", token="t", transport=httpx.MockTransport(server.handler))
    return Worker(client, "w", "mcp-agent").claim(RUN, heartbeat=False)


async def call(ctx, world, name: str, args: dict):
    async with McpGateway(ctx, {"payments": payments(world)}) as gw:
        async with McpClient(gw.server) as agent:
            listed = [t.name for t in (await agent.list_tools()).tools]
            return listed, await agent.call_tool(name, args)


def test_a_tool_call_is_a_declared_effect_and_its_result_the_outcome(server: FakeServer):
    ctx, world = claim(server), []
    listed, result = asyncio.run(call(ctx, world, "payments__charge", {"amount": 12}))
    assert listed == ["payments__charge"]
    assert not result.is_error and world == [("charge", 12)]
    (declared,) = server.bodies("POST", f"/runs/{RUN}/effects")
    assert (declared["tool"], declared["action"], declared["args"]) == (
        "payments",
        "charge",
        {"amount": 12},
    )
    (outcome,) = [b["status"] for b in server.bodies("POST", "/effects/e1/outcome")]
    assert outcome == "committed"


def test_a_paused_runs_call_is_a_clear_tool_error_and_never_reaches_the_tool(server: FakeServer):
    ctx, world = claim(server), []
    server.on("POST", HB, PAUSE)
    _, result = asyncio.run(call(ctx, world, "payments__charge", {"amount": 12}))
    assert result.is_error and "paused" in result.content[0].text
    assert "incident 7" in result.content[0].text
    assert world == [] and server.bodies("POST", f"/runs/{RUN}/effects") == []


def test_a_failing_tool_is_a_failed_outcome(server: FakeServer):
    ctx, world = claim(server), []
    _, result = asyncio.run(call(ctx, world, "payments__charge", {"amount": -1}))
    assert result.is_error
    assert [b["status"] for b in server.bodies("POST", "/effects/e1/outcome")] == ["failed"]


def test_a_call_that_needs_approval_waits_for_it(server: FakeServer):
    ctx, world = claim(server), []
    denied = (409, {"error": "denied", "decision": "denied", "reason": "approval_required"})
    ok = (
        201,
        {"id": "e2", "decision": "authorized", "status": "in_flight", "idempotency_key": "k"},
    )
    server.on("POST", f"/runs/{RUN}/effects", denied, ok)
    server.on(
        "GET",
        f"/runs/{RUN}",
        (200, {"id": RUN, "state": "running", "approvals": [{"id": "ap1", "status": "approved"}]}),
    )
    _, result = asyncio.run(call(ctx, world, "payments__charge", {"amount": 900}))
    assert not result.is_error and world == [("charge", 900)]
    (asked,) = server.bodies("POST", f"/runs/{RUN}/approvals")
    assert asked["args"] == {"amount": 900}
    assert server.bodies("POST", f"/runs/{RUN}/effects")[1]["approval_id"] == "ap1"
