"""The LangGraph adapter against the SDK's fake control plane (no model, no network): checkpoints name
the node that runs next, tools are declared effects, a pause stops the graph before its next tool call,
a new process continues from the stored checkpoint, and interrupt() is an approval."""

from __future__ import annotations

import operator
from typing import Annotated, Any, TypedDict

import httpx
import pytest

pytest.importorskip("langgraph")

from langgraph.graph import END, START, StateGraph
from langgraph.types import interrupt

from controlplane_sdk import Client, PauseRequested, Worker
from controlplane_sdk.adapters.langgraph import (
    ControlPlaneSaver,
    governed_tool,
    run_graph,
)
from tests.sdk.conftest import LEASE, RUN, FakeServer

HB = f"/leases/{LEASE}/heartbeat"


class Order(TypedDict):
    log: Annotated[list, operator.add]


def build(ctx, world: list[tuple[str, Any]], *, ask: bool = False):
    reserve = governed_tool(ctx, "inventory", "reserve")(
        lambda sku: world.append(("reserve", sku)) or f"res-{sku}"
    )
    charge = governed_tool(ctx, "payments", "charge")(
        lambda amount: world.append(("charge", amount)) or "ch-1"
    )
    g = StateGraph(Order)
    g.add_node("reserve", lambda s: {"log": [reserve("sku-1")]})
    g.add_node("charge", lambda s: {"log": [charge(10)]})
    g.add_edge(START, "reserve")
    if ask:
        request = {"tool": "payments", "action": "charge", "args": {"amount": 10}, "reason": "big"}
        g.add_node("approve", lambda s: {"log": [interrupt(request)]})
        g.add_edge("reserve", "approve")
        g.add_edge("approve", "charge")
    else:
        g.add_edge("reserve", "charge")
    g.add_edge("charge", END)
    saver = ControlPlaneSaver(ctx)
    return g.compile(checkpointer=saver), saver


def claim(server: FakeServer):
    client = Client("http://cp", token="t", transport=httpx.MockTransport(server.handler))
    return Worker(client, "w", "lg").claim(RUN, heartbeat=False)


def test_it_declares_each_tool_call_and_checkpoints_the_next_node(server: FakeServer):
    ctx, world = claim(server), []
    graph, _ = build(ctx, world)
    out = run_graph(ctx, graph, {"log": []})
    assert out["log"] == ["res-sku-1", "ch-1"] and world == [("reserve", "sku-1"), ("charge", 10)]
    declared = server.bodies("POST", f"/runs/{RUN}/effects")
    assert [(d["tool"], d["action"]) for d in declared] == [
        ("inventory", "reserve"),
        ("payments", "charge"),
    ]
    # The key is the call's identity: the graph task that made it and its position there.
    key = declared[0]["idempotency_key"]
    assert key.startswith(f"{RUN}:lg:") and key.endswith(":inventory:reserve:1"), key
    steps = [b["step"] for b in server.bodies("POST", f"/runs/{RUN}/checkpoints")]
    assert steps == [
        "langgraph next: __start__",
        "langgraph next: reserve",
        "langgraph next: charge",
        "langgraph end",
    ]


def test_a_pause_stops_the_graph_before_its_next_tool_call(server: FakeServer):
    ctx, world = claim(server), []
    graph, _ = build(ctx, world)
    continue_ = (200, {"directive": "continue", "reason": "", "expires_at": "2030-01-01T00:00:00Z"})
    pause = (
        200,
        {"directive": "pause", "reason": "operator", "expires_at": "2030-01-01T00:00:00Z"},
    )
    server.on("POST", HB, continue_, pause)  # reserve's check passes; charge's check sees the pause
    with pytest.raises(PauseRequested):
        run_graph(ctx, graph, {"log": []})
    assert world == [("reserve", "sku-1")]
    assert [d["action"] for d in server.bodies("POST", f"/runs/{RUN}/effects")] == ["reserve"]


def test_a_new_process_continues_from_the_stored_checkpoint(server: FakeServer):
    ctx, world = claim(server), []
    graph, _ = build(ctx, world)
    pause = (
        200,
        {"directive": "pause", "reason": "operator", "expires_at": "2030-01-01T00:00:00Z"},
    )
    cont = (200, {"directive": "continue", "reason": "", "expires_at": "2030-01-01T00:00:00Z"})
    server.on("POST", HB, cont, pause)
    with pytest.raises(PauseRequested):
        run_graph(ctx, graph, {"log": []})
    last = server.bodies("POST", f"/runs/{RUN}/checkpoints")[-1]
    assert last["step"] == "langgraph next: charge"  # the node that will run again from its start

    # Another process claims the run: the claim hands over that checkpoint.
    server.checkpoint = {"seq": 3, "step": last["step"], "state": last["state"]}
    server.on("POST", HB, cont)
    ctx2, world2 = claim(server), []
    graph2, saver2 = build(ctx2, world2)
    assert saver2.has_checkpoint()
    out = run_graph(ctx2, graph2, {"log": ["ignored: the graph continues"]})
    assert world2 == [("charge", 10)]  # reserve is not run again
    assert out["log"] == ["res-sku-1", "ch-1"]


def test_interrupt_becomes_an_approval_and_resumes_with_the_decision(server: FakeServer):
    ctx, world = claim(server), []
    graph, _ = build(ctx, world, ask=True)
    decided = {"id": "ap1", "status": "approved"}
    server.on(
        "POST",
        HB,
        (200, {"directive": "continue", "reason": "", "expires_at": "2030-01-01T00:00:00Z"}),
    )
    server.on("GET", f"/runs/{RUN}", (200, {"id": RUN, "state": "running", "approvals": [decided]}))
    out = run_graph(ctx, graph, {"log": []})
    (asked,) = server.bodies("POST", f"/runs/{RUN}/approvals")
    assert (asked["tool"], asked["action"], asked["args"]) == ("payments", "charge", {"amount": 10})
    assert out["log"][1] == {"approved": True, "approval_id": "ap1", "status": "approved"}
    assert world == [("reserve", "sku-1"), ("charge", 10)]


def test_a_replayed_tool_call_is_not_sent_to_the_world_again(server: FakeServer):
    ctx, world = claim(server), []
    graph, _ = build(ctx, world)
    replay = {
        "id": "e9",
        "decision": "replayed",
        "status": "committed",
        "idempotency_key": "k",
        "outcome_detail": {"result": "res-from-before"},
    }
    authorized = {
        "id": "e10",
        "decision": "authorized",
        "status": "in_flight",
        "idempotency_key": "k2",
    }
    server.on("POST", f"/runs/{RUN}/effects", (200, replay), (201, authorized))
    out = run_graph(ctx, graph, {"log": []})
    assert world == [("charge", 10)]
    assert out["log"][0] == "res-from-before"


def test_identical_calls_are_two_effects_and_a_node_run_again_replays_its_calls():
    """Keys come from the call's identity, not its arguments: two intended charges with the same
    arguments are two effects; the node LangGraph runs again from its start after an interrupt
    makes the same calls again, which are replays (the world is not called twice)."""
    from controlplane_sdk.testing import FakeControlPlane

    cp = FakeControlPlane()
    run = cp.create_run("lg", scopes=["payments:charge"])
    ctx = Worker(cp.client(), "w", "lg").claim(run, heartbeat=False)
    world: list = []
    charge = governed_tool(ctx, "payments", "charge")(
        lambda amount: world.append(amount) or f"ch-{len(world)}"
    )

    def twice_then_ask(s):
        first, second = charge(amount=5), charge(amount=5)
        answer = interrupt({"tool": "payments", "action": "refund", "args": {}, "reason": "?"})
        return {"log": [first, second, answer["approved"]]}

    g = StateGraph(Order)
    g.add_node("pay", twice_then_ask)
    g.add_edge(START, "pay")
    g.add_edge("pay", END)
    graph = g.compile(checkpointer=ControlPlaneSaver(ctx))

    import threading

    threading.Timer(0.5, cp.approve).start()
    out = run_graph(ctx, graph, {"log": []})
    assert world == [5, 5]  # two charges, each once although the node ran twice
    assert out["log"] == ["ch-1", "ch-2", True]  # the replays answered with the recorded results
    fx = cp.effects(run)
    assert [e["idempotency_key"].rsplit(":", 1)[1] for e in fx] == ["1", "2"]
    assert len({e["idempotency_key"] for e in fx}) == 2


class _Killed(BaseException):
    """The worker process dies (nothing catches it)."""


@pytest.mark.parametrize("durable", [True, False], ids=["control-plane-saver", "memory-saver"])
def test_a_new_attempt_without_the_callers_checkpoint_replays_its_calls(durable):
    """The key must not depend on LangGraph's checkpoint ids (random uuid6s minted when a
    checkpoint is written): a new attempt that re-creates a checkpoint -- the write before the call
    never reached the control plane (LangGraph saves asynchronously while the next node runs), or
    a saver that keeps nothing across processes -- runs the same node at the same step, and its
    calls are replays, not new effects (the conformance kit's 'reserve done twice')."""
    from langgraph.checkpoint.memory import InMemorySaver

    from controlplane_sdk.testing import FakeControlPlane

    cp = FakeControlPlane()
    run = cp.create_run("lg", scopes=["inventory:reserve", "payments:charge"])
    world: list = []
    die = [True]

    def attempt():
        ctx = Worker(cp.client(), "w", "lg").claim(run, heartbeat=False)
        reserve = governed_tool(ctx, "inventory", "reserve")(
            lambda sku: world.append(("reserve", sku)) or f"res-{sku}"
        )
        charge = governed_tool(ctx, "payments", "charge")(
            lambda amount: world.append(("charge", amount)) or "ch-1"
        )

        def pay(s):
            if die[0]:
                die[0] = False
                raise _Killed("SIGKILL before the charge")
            return {"log": [charge(amount=10)]}

        g = StateGraph(Order)
        g.add_node("reserve", lambda s: {"log": [reserve(sku="sku-1")]})
        g.add_node("charge", pay)
        g.add_edge(START, "reserve")
        g.add_edge("reserve", "charge")
        g.add_edge("charge", END)
        if durable:
            saver = ControlPlaneSaver(ctx)
            saver.storage.clear()  # the claim handed no checkpoint: none reached the server
        else:
            saver = InMemorySaver()
        return ctx, run_graph(ctx, g.compile(checkpointer=saver), {"log": []})

    with pytest.raises(_Killed):
        attempt()
    cp.expire_lease(run)
    _, out = attempt()
    assert world == [("reserve", "sku-1"), ("charge", 10)]  # the reservation once
    assert out["log"] == ["res-sku-1", "ch-1"]
    keys = [e["idempotency_key"] for e in cp.effects(run) if e["action"] == "reserve"]
    assert len(set(keys)) == 1, keys


def test_a_node_run_again_at_a_later_step_is_a_new_effect():
    """A loop: the same node with the same arguments at graph steps 1 and 2 is two intents."""
    from controlplane_sdk.testing import FakeControlPlane

    cp = FakeControlPlane()
    run = cp.create_run("lg", scopes=["payments:charge"])
    ctx = Worker(cp.client(), "w", "lg").claim(run, heartbeat=False)
    world: list = []
    charge = governed_tool(ctx, "payments", "charge")(
        lambda amount: world.append(amount) or f"ch-{len(world)}"
    )
    g = StateGraph(Order)
    g.add_node("pay", lambda s: {"log": [charge(amount=5)]})
    g.add_edge(START, "pay")
    g.add_conditional_edges("pay", lambda s: END if len(s["log"]) >= 2 else "pay")
    out = run_graph(ctx, g.compile(checkpointer=ControlPlaneSaver(ctx)), {"log": []})
    assert world == [5, 5] and out["log"] == ["ch-1", "ch-2"]
    assert len({e["idempotency_key"] for e in cp.effects(run)}) == 2
