"""controlplane_sdk.testing: the in-memory control plane an agent author's unit tests run against.
Each operator control, exercised through an ordinary agent and run_one, as an author would."""

from __future__ import annotations

import threading

import pytest

from controlplane_sdk import EffectDenied, LeaseLost, OutcomeNotRecorded, Worker, run_one
from controlplane_sdk.testing import FakeControlPlane


def purchase(world: list):
    def agent(ctx):
        with ctx.step("reserve"):
            with ctx.effect("inventory", "reserve", args={"sku": "s1"}) as fx:
                if not fx.already_done:
                    world.append("reserve")
                    fx.committed("res-1")
        ctx.checkpoint("reserve", {"reserved": True})
        with ctx.step("charge"):
            with ctx.effect("payments", "charge", args={"amount": 9}) as fx:
                if not fx.already_done:
                    world.append("charge")
                    fx.committed("ch-1")

    return agent


def claim(cp: FakeControlPlane, run: str):
    return Worker(cp.client(), "w", "buyer").claim(run, heartbeat=False)


def test_pause_at_the_next_boundary_then_resume_from_the_checkpoint():
    cp, world = FakeControlPlane(), []
    run = cp.create_run("buyer", scopes=["inventory:*", "payments:charge"])
    cp.pause_after_step(run, "reserve", "check the order")
    s = run_one(claim(cp, run), purchase(world))
    assert (s.outcome, s.detail, cp.state(run), world) == (
        "paused", "check the order", "paused", ["reserve"],
    )  # fmt: skip
    cp.resume(run)
    ctx = claim(cp, run)
    assert ctx.state == {"reserved": True} and ctx.attempt.number == 2
    assert run_one(ctx, purchase(world)).outcome == "succeeded"
    assert world == ["reserve", "charge"]  # the reservation replayed, not redone


def test_a_denied_effect_never_runs_its_body_and_is_audited():
    cp, world = FakeControlPlane(), []
    run = cp.create_run("buyer")
    cp.deny("payments", "charge", "authority_revoked")
    s = run_one(claim(cp, run), purchase(world))
    assert s.outcome == "failed" and world == ["reserve"] and cp.state(run) == "failed"
    assert [a["reason"] for a in cp.audit] == ["authority_revoked"]


def test_authority_comes_from_the_runs_scopes():
    cp = FakeControlPlane()
    run = cp.create_run("buyer", scopes=["inventory:reserve"])
    ctx = claim(cp, run)
    with pytest.raises(EffectDenied) as denied, ctx.step("charge"):
        with ctx.effect("payments", "charge"):
            raise AssertionError("the body must not run")
    assert denied.value.reason == "authority_missing"


def test_an_effect_that_needs_approval_waits_for_the_decision():
    cp, world = FakeControlPlane(), []
    run = cp.create_run("buyer")
    cp.require_approval("payments", "charge")

    def agent(ctx):
        with ctx.step("charge"):
            approval_id = ctx.request_approval("payments", "charge", {"amount": 9}, "big", 60)
            assert cp.state(run) == "awaiting_approval"
            threading.Timer(0.2, cp.approve, [approval_id]).start()
            assert ctx.await_approval(approval_id, timeout=10).approved
            with ctx.effect("payments", "charge", args={"amount": 9}, approval_id=approval_id):
                world.append("charge")

    assert run_one(claim(cp, run), agent).outcome == "succeeded" and world == ["charge"]
    with pytest.raises(EffectDenied):  # without the approval it is refused
        ctx = claim(cp, cp.create_run("buyer"))
        with ctx.step("charge"), ctx.effect("payments", "charge", args={"amount": 9}):
            pass


def test_an_expired_lease_refuses_the_old_worker_and_queues_the_run_for_another():
    cp = FakeControlPlane()
    run = cp.create_run("buyer")
    old = claim(cp, run)
    cp.expire_lease(run)
    with pytest.raises(LeaseLost):
        old.refresh()
    assert cp.state(run) == "queued"
    assert run_one(claim(cp, run), purchase([])).outcome == "succeeded"


def test_an_outcome_nobody_knows_blocks_success_until_reconciled():
    cp, world = FakeControlPlane(), []
    run = cp.create_run("buyer")
    cp.lose_outcome("payments", "charge")
    ctx = claim(cp, run)
    with pytest.raises(OutcomeNotRecorded):
        purchase(world)(ctx)
    (charge,) = [e for e in cp.effects(run) if e["action"] == "charge"]
    assert charge["status"] == "unknown"
    summary = run_one(ctx, lambda _ctx: None)  # the attempt cannot end succeeded
    assert summary.outcome == "failed" and "effects_unresolved" in summary.detail
    cp.reconcile(charge["id"], "committed", "ch-1")
    assert cp.effects(run)[-1]["status"] == "committed"


def test_cancel_stops_at_the_next_boundary():
    cp, world = FakeControlPlane(), []
    run = cp.create_run("buyer")

    def agent(ctx):
        with ctx.step("reserve"):
            cp.cancel(run, "customer changed their mind")
        with ctx.step("charge"):
            world.append("charge")

    assert run_one(claim(cp, run), agent).outcome == "cancelled"
    assert world == [] and cp.state(run) == "cancelled"
