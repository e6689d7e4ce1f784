"""The decorator form (``@ctx.tool``): each call is an effect of the step, its keyword arguments
the effect's args, its return value the recorded result a replay answers with."""

from __future__ import annotations

import pytest

from controlplane_sdk import Worker, run_one
from controlplane_sdk.testing import FakeControlPlane


def test_each_call_is_an_effect_and_a_replay_returns_the_recorded_result():
    cp, world = FakeControlPlane(), []
    run = cp.create_run("a")
    cp.pause_after_step(run, "charge")

    def agent(ctx):
        @ctx.tool("payments", "charge")
        def charge(amount: int, *, idempotency_key: str) -> dict:
            world.append(idempotency_key)
            return {"id": f"ch-{len(world)}", "amount": amount}

        with ctx.step("charge"):
            receipts = [charge(amount=5), charge(amount=5)]
        with ctx.step("report"):  # the boundary where the pause is honoured
            ctx.event("receipts", {"receipts": receipts})

    assert run_one(Worker(cp.client(), "w", "a").claim(run, heartbeat=False), agent).outcome == (
        "paused"
    )
    assert world == [f"{run}:charge:payments:charge", f"{run}:charge:payments:charge:2"]
    cp.resume(run)
    assert run_one(Worker(cp.client(), "w", "a").claim(run, heartbeat=False), agent).outcome == (
        "succeeded"
    )
    assert len(world) == 2  # replayed: the function was not called again
    (receipts,) = cp.history(run, "receipts")
    assert receipts["data"]["receipts"] == [
        {"id": "ch-1", "amount": 5},
        {"id": "ch-2", "amount": 5},
    ]
    assert [e["args"] for e in cp.effects(run)] == [{"amount": 5}, {"amount": 5}]


def test_a_raising_tool_is_a_failed_effect():
    cp = FakeControlPlane()
    run = cp.create_run("a")
    ctx = Worker(cp.client(), "w", "a").claim(run, heartbeat=False)

    @ctx.tool("payments", "charge")
    def charge(amount: int) -> None:
        raise ValueError("card declined")

    with pytest.raises(ValueError), ctx.step("charge"):
        charge(amount=1)
    assert [e["status"] for e in cp.effects(run)] == ["failed"]
