"""The MCP gateway in front of an in-process MCP tool server (with an output schema), against the
SDK's in-memory control plane (controlplane_sdk.testing): every tools/call is a declared effect whose
whole result is the outcome; identical calls are separate effects; a paused run's call is refused
(and audited) without reaching the tool, the lease is handed back, and after resume the gateway
claims the run again; a replay returns the recorded structured result."""

from __future__ import annotations

import asyncio
import sys

import pytest

pytest.importorskip("mcp")

from mcp import Client as McpClient
from mcp.server.mcpserver import Context, MCPServer
from pydantic import BaseModel

from controlplane_sdk import Worker
from controlplane_sdk.adapters.mcp_gateway import KEY_META, UPSTREAM_KEY_META, McpGateway
from controlplane_sdk.testing import FakeControlPlane


class Charge(BaseModel):
    id: str
    amount: int


def payments(world: list, keys: list | None = None) -> MCPServer:
    server = MCPServer("payments")
    keys = [] if keys is None else keys

    @server.tool()
    def charge(amount: int, ctx: Context) -> Charge:
        """Charge the card."""
        if amount < 0:
            raise ValueError("negative amount")
        world.append(("charge", amount))
        keys.append((ctx.request_context.meta or {}).get(UPSTREAM_KEY_META))
        return Charge(id=f"ch-{len(world)}", amount=amount)

    return server


@pytest.fixture
def cp() -> FakeControlPlane:
    return FakeControlPlane()


def start(cp: FakeControlPlane, scopes=("payments:charge",)):
    run = cp.create_run("mcp-agent", scopes=scopes)
    return run, Worker(cp.client(), "gw", "mcp-agent").claim(run, heartbeat=False)


async def session(gw: McpGateway, calls, *, meta=None):
    async with gw, McpClient(gw.server) as agent:
        out = []
        for c in calls:
            out.append(await c(agent) if callable(c) else await agent.call_tool(*c, meta=meta))
        return out


def test_a_tool_call_is_a_declared_effect_and_its_whole_result_the_outcome(cp):
    run, ctx = start(cp)
    world: list = []
    gw = McpGateway(ctx, {"payments": payments(world)}, watch_interval_s=0.05)
    (result,) = asyncio.run(session(gw, [("payments__charge", {"amount": 12})]))
    assert not result.is_error and result.structured_content == {"id": "ch-1", "amount": 12}
    (fx,) = cp.effects(run)
    assert (fx["tool"], fx["action"], fx["args"], fx["status"]) == (
        "payments", "charge", {"amount": 12}, "committed",
    )  # fmt: skip
    assert fx["outcome_detail"]["result"]["structuredContent"] == {"id": "ch-1", "amount": 12}


def test_two_identical_calls_are_two_effects_keyed_by_position(cp):
    run, ctx = start(cp)
    world: list = []
    sent: list = []
    gw = McpGateway(ctx, {"payments": payments(world, sent)}, watch_interval_s=0.05)
    asyncio.run(session(gw, [("payments__charge", {"amount": 5})] * 2))
    assert world == [("charge", 5), ("charge", 5)]
    keys = [e["idempotency_key"] for e in cp.effects(run)]
    assert keys == [f"{run}:mcp:payments__charge:1", f"{run}:mcp:payments__charge:2"]
    assert sent == keys  # the tool server got each effect's key to pass on


def test_a_client_key_makes_a_retry_a_replay_with_the_structured_result(cp):
    run, ctx = start(cp)
    world: list = []
    gw = McpGateway(ctx, {"payments": payments(world)}, watch_interval_s=0.05)
    first, again = asyncio.run(
        session(gw, [("payments__charge", {"amount": 7})] * 2, meta={KEY_META: "call_abc"})
    )
    assert world == [("charge", 7)]  # the tool was called once
    # The replay is what the tool returned (structured content included), so a client that
    # validates the tool's output schema accepts it.
    assert again.structured_content == first.structured_content == {"id": "ch-1", "amount": 7}
    assert [e["idempotency_key"] for e in cp.effects(run)] == [f"{run}:mcp-key:call_abc"]


def test_a_failing_tool_is_a_failed_outcome(cp):
    run, ctx = start(cp)
    gw = McpGateway(ctx, {"payments": payments([])}, watch_interval_s=0.05)
    (result,) = asyncio.run(session(gw, [("payments__charge", {"amount": -1})]))
    assert result.is_error
    assert [e["status"] for e in cp.effects(run)] == ["failed"]


def test_pause_refuses_and_audits_the_call_hands_the_lease_back_and_resume_continues(cp):
    run, ctx = start(cp)
    world: list = []
    gw = McpGateway(ctx, {"payments": payments(world)}, watch_interval_s=0.05)

    async def pause(agent):
        cp.pause(run, "incident 7")
        return await agent.call_tool("payments__charge", {"amount": 2})

    async def resume_and_call(agent):
        assert cp.state(run) == "paused"  # the gateway acknowledged the pause
        cp.resume(run)
        return await agent.call_tool("payments__charge", {"amount": 3})

    ok, held, after = asyncio.run(
        session(gw, [("payments__charge", {"amount": 1}), pause, resume_and_call])
    )
    assert not ok.is_error
    text = held.content[0].text
    assert held.is_error and text.startswith("The run is paused (incident 7).")
    assert "payments__charge was not called" in text and "stopd" not in text
    (refusal,) = [a for a in cp.audit if a["action"] == "effect.declare"]
    assert refusal["reason"] == "run_paused"  # the control plane refused it, and audited it
    assert not after.is_error and world == [("charge", 1), ("charge", 3)]
    done = [e for e in cp.effects(run) if e["status"] == "committed"]
    assert [e["attempt_id"] for e in done] == [f"{run}-a1", f"{run}-a2"]  # a new attempt


def test_with_pause_wait_a_call_waits_for_the_resume(cp):
    run, ctx = start(cp)
    world: list = []
    gw = McpGateway(ctx, {"payments": payments(world)}, watch_interval_s=0.05, pause_wait_s=10)

    async def paused_call(agent):
        cp.pause(run, "a moment")
        loop = asyncio.get_running_loop()
        loop.call_later(0.5, lambda: cp.resume(run) if cp.state(run) == "paused" else None)
        return await agent.call_tool("payments__charge", {"amount": 4})

    (result,) = asyncio.run(session(gw, [paused_call]))
    assert not result.is_error and world == [("charge", 4)]
    assert cp.state(run) == "running"


def test_a_new_gateway_continues_the_run_after_the_old_one_died(cp):
    run, ctx = start(cp)
    world: list = []
    gw = McpGateway(ctx, {"payments": payments(world)}, watch_interval_s=0.05)
    asyncio.run(session(gw, [("payments__charge", {"amount": 1})]))
    cp.expire_lease(run)  # the process died: no heartbeat, recovery queues the run again
    gw2 = McpGateway(
        None, {"payments": payments(world)}, client=cp.client(), run_id=run, watch_interval_s=0.05
    )
    (result,) = asyncio.run(session(gw2, [("payments__charge", {"amount": 1})]))
    assert not result.is_error and world == [("charge", 1), ("charge", 1)]
    keys = [e["idempotency_key"][-1] for e in cp.effects(run)]
    assert keys == ["1", "2"]  # numbering continues from the ledger


def test_a_call_whose_outcome_was_lost_is_refused_until_reconciled(cp):
    run, ctx = start(cp)
    world: list = []
    cp.lose_outcome("payments", "charge")
    gw = McpGateway(ctx, {"payments": payments(world)}, watch_interval_s=0.05)
    (first,) = asyncio.run(session(gw, [("payments__charge", {"amount": 9})]))
    assert not first.is_error  # the tool answered; the ledger could not be told
    cp.expire_lease(run)
    gw2 = McpGateway(
        None, {"payments": payments(world)}, client=cp.client(), run_id=run, watch_interval_s=0.05
    )
    (retry,) = asyncio.run(session(gw2, [("payments__charge", {"amount": 9})]))
    assert retry.is_error and "reconcile" in retry.content[0].text
    assert world == [("charge", 9)]  # never sent twice


def test_a_call_that_needs_approval_waits_for_it(cp):
    run, ctx = start(cp)
    world: list = []
    cp.require_approval("payments", "charge")
    gw = McpGateway(ctx, {"payments": payments(world)}, watch_interval_s=0.05)

    async def approved_call(agent):
        loop = asyncio.get_running_loop()
        loop.call_later(0.3, cp.approve)
        return await agent.call_tool("payments__charge", {"amount": 900})

    (result,) = asyncio.run(session(gw, [approved_call]))
    assert not result.is_error and world == [("charge", 900)]
    (asked,) = cp.runs[run].approvals
    assert asked["args"] == {"amount": 900} and asked["status"] == "approved"


def test_an_upstream_given_as_a_command_is_spoken_to_over_stdio(cp, tmp_path):
    """The CLI's ``--upstream name='command'``: the gateway starts the tool server as a process."""
    from controlplane_sdk.adapters.mcp_serve import upstream_target

    server = tmp_path / "tools.py"
    server.write_text(
        "from mcp.server.mcpserver import Context, MCPServer\n"
        "s = MCPServer('echo')\n"
        "@s.tool()\n"
        "def echo(text: str) -> str:\n"
        "    '''Echo.'''\n"
        "    return text.upper()\n"
        "s.run('stdio')\n"
    )
    run, ctx = start(cp, scopes=("echo:echo",))
    target = upstream_target(f"{sys.executable} {server}")
    gw = McpGateway(ctx, {"echo": target}, watch_interval_s=0.05)
    (result,) = asyncio.run(session(gw, [("echo__echo", {"text": "hi"})]))
    assert not result.is_error and result.content[0].text == "HI"
    assert [e["status"] for e in cp.effects(run)] == ["committed"]


def test_the_gateway_awaits_the_control_plane_on_the_loop(cp, no_sdk_threads):
    # No thread hop for a control-plane call (the gateway used asyncio.to_thread around a sync
    # client); a pause and resume still goes through.
    run, ctx = start(cp)
    world: list = []
    gw = McpGateway(ctx, {"payments": payments(world)}, watch_interval_s=0.05, pause_wait_s=10)

    async def resume_once_paused():
        for _ in range(400):  # up to 20 s: the gateway hands the lease back between calls
            if cp.state(run) == "paused":
                cp.resume(run)
                return
            await asyncio.sleep(0.05)

    async def paused_then_resumed(agent):
        cp.pause(run, "check the card")
        resumer = asyncio.create_task(resume_once_paused())
        result = await agent.call_tool("payments__charge", {"amount": 3})
        await resumer
        return result

    first, second = asyncio.run(
        session(gw, [("payments__charge", {"amount": 2}), paused_then_resumed])
    )
    assert not first.is_error and not second.is_error
    assert world == [("charge", 2), ("charge", 3)]
    assert cp.state(run) == "running"
    assert type(gw.client).__name__ == "AsyncClient"
