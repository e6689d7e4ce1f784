"""Agents built with LangGraph, the OpenAI Agents SDK and MCP, governed through their adapters against
the live control plane (daphne, Celery worker + beat, PostgreSQL, Redis, the demo world, real agent
worker processes): a pause mid-run stops the framework's agent before its next tool call, a resumed
run continues in a NEW process from the stored checkpoint, and an ambiguous tool timeout is
reconciled before a retry -- with the world holding each effect exactly once."""

from __future__ import annotations

import asyncio

import pytest

from controlplane_sdk import Client, Worker
from demo_agents.common import VERSIONS
from tests.acceptance.test_run_control import effect, wait_effect, wait_state, world_commits
from tests.live import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

INPUT = {"sku": "sku-1", "qty": 1, "email": "ada@example.com"}
AUTHORITY = [
    {"scope": s, "ttl_s": 3600} for s in ("inventory:*", "payments:charge", "notifications:*")
]


def start(live, agent: str) -> str:
    resp = live["worker"].post(
        "/runs", {"agent": agent, "goal": "buy 1 x sku-1", "input": INPUT,
                  "authority": AUTHORITY, "versions": VERSIONS},
    )  # fmt: skip
    assert resp.status_code == 201, resp.text
    return resp.json()["id"]


def one_worker(live, agent: str, **env: str) -> str:
    (name,) = live["start_workers"](1, agents=f"{agent}:1", **env)
    return name


def stop_worker(live, name: str) -> None:
    live["procs"].stop({name})


def wait_job(person, intervention_id: str, timeout: float = 60) -> dict:
    return wait_for(
        "the intervention's job",
        lambda: (
            (i := person.get(f"/interventions/{intervention_id}").json())["status"] != "pending"
            and i
        ),
        timeout,
    )


@pytest.mark.parametrize("agent", ["lg-purchasing", "oa-purchasing"])
def test_a_pause_stops_the_agent_before_its_next_tool_call_and_a_new_process_resumes(live, agent):
    worker, world, otto = live["worker"], live["world"], live["people"]["otto"]
    first = one_worker(live, agent, DEMO_STEP_SECONDS="2")
    rid = start(live, agent)
    reserve = wait_effect(worker, rid, "inventory", "reserve", "committed", 60)
    paused = otto.intervene(rid, "pause", "check the order before charging")
    assert paused.status_code == 202, paused.text
    wait_state(worker, rid, {"paused"}, 30)
    wait_for(
        "the worker to let go",
        lambda: all(le["status"] != "active" for le in worker.run(rid)["leases"]),
        30,
    )
    # Stopped before its next tool call: nothing after the reservation was declared or sent.
    declared = [(e["tool"], e["action"]) for e in worker.effects(rid)]
    assert declared == [("inventory", "reserve")], declared
    assert world.requests(system="payments", action="charge") == []

    stop_worker(live, first)  # the resume happens in another process
    resumed = otto.intervene(rid, "resume", "order checked")
    assert resumed.status_code == 202, resumed.text
    report = wait_job(otto, resumed.json()["id"])
    boundary = str(report)
    # The report names the boundary the run resumes from: the graph node that runs again from its
    # start, or the tool call the RunState holds (the reservation: replayed from the ledger, the
    # world is not called again).
    # LangGraph: the graph runs reserve -> approve -> charge, and the approve node calls no tool, so
    # the pause (at the first boundary after the reservation) lands before or after it by timing:
    # either node is a true boundary; what must hold is below (nothing after it ran twice).
    steps = (
        ("langgraph next: approve", "langgraph next: charge")
        if agent == "lg-purchasing"
        else ("openai-agents next: reserve",)
    )
    assert any(step in boundary for step in steps), boundary
    one_worker(live, agent)
    final = wait_state(worker, rid, {"succeeded", "failed"}, 90)
    assert final["state"] == "succeeded", final
    assert final["attempts"][-1]["worker"] != final["attempts"][0]["worker"]
    for tool, action in (("inventory", "reserve"), ("payments", "charge")):
        fx = effect(worker, rid, tool, action, "committed")
        assert world_commits(world, tool, fx["idempotency_key"]) == 1, (tool, action)
    assert effect(worker, rid, "inventory", "reserve")["id"] == reserve["id"]  # not run again


def test_an_ambiguous_tool_timeout_is_reconciled_before_a_retry(live):
    worker, world, otto = live["worker"], live["world"], live["people"]["otto"]
    one_worker(live, "lg-purchasing", AGENT_WORLD_TIMEOUT_S="2")
    world.set_fault("payments", "timeout", action="charge", count=1, delay_ms=4000)
    rid = start(live, "lg-purchasing")
    wait_state(worker, rid, {"failed"}, 60)
    charge = effect(worker, rid, "payments", "charge")
    assert charge["status"] == "unknown", charge
    refused = otto.intervene(rid, "retry", "transient timeout")
    assert refused.status_code == 409 and refused.json()["error"] == "effects_unresolved"
    rec = otto.intervene(rid, "reconcile", "ask payments whether the charge went through")
    assert wait_job(otto, rec.json()["id"])["status"] == "completed"
    assert effect(worker, rid, "payments", "charge")["status"] == "committed"
    retried = otto.intervene(rid, "retry", "the charge went through; finish the order")
    assert retried.status_code == 202, retried.text
    final = wait_state(worker, rid, {"succeeded", "failed"}, 90)
    assert final["state"] == "succeeded", final
    assert world_commits(world, "payments", charge["idempotency_key"]) == 1
    assert (
        len([r for r in world.requests(system="payments", action="charge") if r["committed"]]) == 1
    )


def test_the_mcp_gateway_governs_an_mcp_agents_tool_calls(live):
    from mcp import Client as McpClient
    from mcp.server.mcpserver import MCPServer

    from controlplane_sdk.adapters.mcp_gateway import McpGateway

    worker, otto = live["worker"], live["people"]["otto"]
    sent: list[int] = []
    payments = MCPServer("payments")

    @payments.tool()
    def charge(amount: int) -> str:
        """Charge the card."""
        sent.append(amount)
        return f"ch-{amount}"

    rid = start(live, "oa-purchasing")
    client = Client(live["url"], live["worker_secret"], timeout=15)
    ctx = Worker(client, "mcp-gateway", "oa-purchasing").claim_next(wait_s=10)
    assert ctx is not None and ctx.run_id == rid

    async def agent_calls(amount: int):
        async with McpGateway(ctx, {"payments": payments}) as gw, McpClient(gw.server) as agent:
            return await agent.call_tool("payments__charge", {"amount": amount})

    try:
        ok = asyncio.run(agent_calls(12))
        assert not ok.is_error and sent == [12]
        fx = effect(worker, rid, "payments", "charge", "committed")
        assert fx is not None and fx["args"] == {"amount": 12}
        assert otto.intervene(rid, "pause", "hold every payment").status_code == 202
        held = asyncio.run(agent_calls(13))
        assert held.is_error and "pause" in held.content[0].text and sent == [12]
    finally:
        ctx.close()
        client.close()
