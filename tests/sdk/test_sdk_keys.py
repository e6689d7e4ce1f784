"""Default idempotency keys are the call's identity (step, tool, action and position in the step),
not its arguments: a repeated intent is a new effect, a step executed again replays its keys."""

from __future__ import annotations

from controlplane_sdk import Worker, run_one
from controlplane_sdk.testing import FakeControlPlane


def charge_twice(world: list):
    def agent(ctx):
        with ctx.step("charge"):
            for _ in range(2):
                with ctx.effect("payments", "charge", args={"amount": 5}) as fx:
                    if not fx.already_done:
                        world.append(fx.idempotency_key)
                        fx.committed(f"ch-{len(world)}")
        with ctx.step("notify"):
            with ctx.effect("mail", "send", args={"to": "ada"}) as fx:
                if not fx.already_done:
                    world.append(fx.idempotency_key)

    return agent


def test_two_identical_effects_in_one_step_are_two_effects():
    cp, world = FakeControlPlane(), []
    run = cp.create_run("a")
    assert run_one(Worker(cp.client(), "w", "a").claim(run, heartbeat=False), charge_twice(world))
    keys = [e["idempotency_key"] for e in cp.effects(run)]
    assert keys == [f"{run}:charge:payments:charge", f"{run}:charge:payments:charge:2",
                    f"{run}:notify:mail:send"]  # fmt: skip
    assert world == keys and cp.state(run) == "succeeded"


def test_a_step_executed_again_replays_its_keys_and_the_world_sees_each_once():
    cp, world = FakeControlPlane(), []
    run = cp.create_run("a")
    cp.pause_after_step(run, "charge", "check the charges")
    first = run_one(Worker(cp.client(), "w", "a").claim(run, heartbeat=False), charge_twice(world))
    assert first.outcome == "paused" and len(world) == 2
    cp.resume(run)
    # No checkpoint was written: the new attempt runs the charge step again from its start.
    second = run_one(Worker(cp.client(), "w", "a").claim(run, heartbeat=False), charge_twice(world))
    assert second.outcome == "succeeded"
    assert len(world) == 3  # the two charges were replays; only the mail is new
    assert [e["decision"] for e in cp.effects(run)] == ["authorized"] * 3


def test_an_effect_declared_ahead_matches_an_equal_effect_in_the_same_step():
    cp = FakeControlPlane()
    run = cp.create_run("a")

    def agent(ctx):
        with ctx.step("s"):
            with ctx.effect("inventory", "reserve", args={"sku": 1}) as fx:
                fx.committed("r1")
                fx.then("payments", "charge", args={"amount": 3})
            with ctx.effect("payments", "charge", args={"amount": 3}) as fx2:
                fx2.committed("c1")

    assert run_one(Worker(cp.client(), "w", "a").claim(run, heartbeat=False), agent).outcome == (
        "succeeded"
    )
    assert [e["status"] for e in cp.effects(run)] == ["committed", "committed"]
    assert cp.requests.count(f"POST /runs/{run}/effects") == 1  # the charge rode on the outcome
