"""The OpenAI Agents SDK adapter with a scripted model (no network) against the SDK's fake control
plane: tool calls are declared effects keyed by the tool call id, a pause holds the next tool call and
checkpoints the RunState, a new process resumes from it, and needs_approval is a control-plane approval."""

from __future__ import annotations

import asyncio

import httpx
import pytest

pytest.importorskip("agents")

from agents import Agent
from agents.testing import ScriptedModel, assistant_message, function_call

from controlplane_sdk import AsyncClient, AsyncWorker, Client, PauseRequested, Worker
from controlplane_sdk.adapters.openai_agents import arun_agent, govern_tool, run_agent
from tests.sdk.conftest import LEASE, RUN, FakeServer

HB = f"/leases/{LEASE}/heartbeat"
GO = (200, {"directive": "continue", "reason": "", "expires_at": "2030-01-01T00:00:00Z"})
PAUSE = (200, {"directive": "pause", "reason": "operator", "expires_at": "2030-01-01T00:00:00Z"})


def claim(server: FakeServer):
    client = Client("http://cp", token="t", transport=httpx.MockTransport(server.handler))
    return Worker(client, "w", "buyer").claim(RUN, heartbeat=False)


def script():
    return ScriptedModel(
        [
            [function_call("reserve", {"sku": "sku-1"}, call_id="call-reserve")],
            [function_call("charge", {"amount": 10}, call_id="call-charge")],
            [assistant_message("bought")],
        ]
    )


def buyer(ctx, world: list, model, *, approve_charge: bool = False) -> Agent:
    def reserve(sku: str) -> str:
        """Reserve stock."""
        world.append(("reserve", sku))
        return f"res-{sku}"

    def charge(amount: int) -> str:
        """Charge the card."""
        world.append(("charge", amount))
        return "ch-1"

    tools = [
        govern_tool(ctx, reserve, tool="inventory", action="reserve"),
        govern_tool(ctx, charge, tool="payments", action="charge", needs_approval=approve_charge),
    ]
    return Agent(name="buyer", instructions="buy", tools=tools, model=model)


def test_it_declares_every_tool_call_keyed_by_the_tool_call_id(server: FakeServer):
    ctx, world = claim(server), []
    assert run_agent(ctx, buyer(ctx, world, script()), "buy sku-1") == "bought"
    assert world == [("reserve", "sku-1"), ("charge", 10)]
    declared = server.bodies("POST", f"/runs/{RUN}/effects")
    assert [(d["tool"], d["idempotency_key"]) for d in declared] == [
        ("inventory", f"{RUN}:call-reserve"),
        ("payments", f"{RUN}:call-charge"),
    ]
    assert declared[1]["args"] == {"amount": 10}


def test_a_pause_holds_the_next_tool_call_and_a_new_process_resumes_from_the_run_state(
    server: FakeServer,
):
    ctx, world = claim(server), []
    server.on("POST", HB, GO, PAUSE)  # reserve passes; the pause lands before charge
    with pytest.raises(PauseRequested):
        run_agent(ctx, buyer(ctx, world, script()), "buy sku-1")
    assert world == [("reserve", "sku-1")]
    assert [d["action"] for d in server.bodies("POST", f"/runs/{RUN}/effects")] == ["reserve"]
    held = server.bodies("POST", f"/runs/{RUN}/checkpoints")[-1]
    assert held["step"] == "openai-agents next: charge"
    assert held["state"]["openai_agents"]["asks"] == {"call-charge": False}

    server.checkpoint = {"seq": 1, "step": held["step"], "state": held["state"]}
    server.on("POST", HB, GO)
    ctx2, world2 = claim(server), []
    model2 = ScriptedModel([[assistant_message("bought")]])  # only the turn after the held call
    assert run_agent(ctx2, buyer(ctx2, world2, model2), "buy sku-1") == "bought"
    assert world2 == [("charge", 10)]
    keys = [d["idempotency_key"] for d in server.bodies("POST", f"/runs/{RUN}/effects")]
    assert keys == [f"{RUN}:call-reserve", f"{RUN}:call-charge"]


def test_needs_approval_is_a_control_plane_approval_cited_by_the_declaration(server: FakeServer):
    ctx, world = claim(server), []
    server.on("POST", HB, GO)
    server.on(
        "GET",
        f"/runs/{RUN}",
        (200, {"id": RUN, "state": "running", "approvals": [{"id": "ap1", "status": "approved"}]}),
    )
    assert run_agent(ctx, buyer(ctx, world, script(), approve_charge=True), "buy") == "bought"
    (asked,) = server.bodies("POST", f"/runs/{RUN}/approvals")
    assert (asked["tool"], asked["action"], asked["args"]) == ("payments", "charge", {"amount": 10})
    charge = server.bodies("POST", f"/runs/{RUN}/effects")[1]
    assert charge["approval_id"] == "ap1" and world[-1] == ("charge", 10)


def test_a_rejected_approval_never_calls_the_tool(server: FakeServer):
    ctx, world = claim(server), []
    server.on("POST", HB, GO)
    server.on(
        "GET",
        f"/runs/{RUN}",
        (200, {"id": RUN, "state": "running", "approvals": [{"id": "ap1", "status": "rejected"}]}),
    )
    run_agent(ctx, buyer(ctx, world, script(), approve_charge=True), "buy")
    assert world == [("reserve", "sku-1")]
    assert [d["action"] for d in server.bodies("POST", f"/runs/{RUN}/effects")] == ["reserve"]


def test_a_tool_timeout_is_recorded_unknown_and_stops_the_run(server: FakeServer):
    ctx = claim(server)

    def charge(amount: int) -> str:
        """Charge the card."""
        raise TimeoutError("the payment provider did not answer")

    model = ScriptedModel([[function_call("charge", {"amount": 10}, call_id="call-charge")]])
    agent = Agent(
        name="buyer",
        tools=[govern_tool(ctx, charge, tool="payments", action="charge")],
        model=model,
    )
    with pytest.raises(TimeoutError):
        run_agent(ctx, agent, "buy")
    assert [b["status"] for b in server.bodies("POST", "/effects/e1/outcome")] == ["unknown"]


def test_an_async_run_context_is_governed_natively_on_the_loop(server: FakeServer, no_sdk_threads):
    server.on("POST", HB, GO, PAUSE)  # the same pause before charge as the sync test above
    world: list = []

    async def main():
        transport = httpx.MockTransport(server.handler)
        async with AsyncClient("http://cp", "t", transport=transport, backoff=0) as client:
            ctx = await AsyncWorker(client, "w", "buyer").claim(RUN, heartbeat=False)
            with pytest.raises(PauseRequested):
                await arun_agent(ctx, buyer(ctx, world, script()), "buy sku-1")
            return ctx

    ctx = asyncio.run(main())
    assert world == [("reserve", "sku-1")]
    assert [d["action"] for d in server.bodies("POST", f"/runs/{RUN}/effects")] == ["reserve"]
    held = server.bodies("POST", f"/runs/{RUN}/checkpoints")[-1]
    assert held["step"] == "openai-agents next: charge"
    assert ctx.state == held["state"]


def test_a_sync_run_context_is_carried_on_the_loop_and_learns_what_happened(
    server: FakeServer, no_sdk_threads
):
    ctx, world = claim(server), []
    assert run_agent(ctx, buyer(ctx, world, script()), "buy sku-1") == "bought"
    assert world == [("reserve", "sku-1"), ("charge", 10)]
    last = server.bodies("POST", f"/runs/{RUN}/checkpoints")[-1]
    assert ctx.state == last["state"] == {"final_output": "bought"}
    assert ctx.last_checkpoint_seq is not None
