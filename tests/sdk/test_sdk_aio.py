"""The native asyncio runtime against the in-memory control plane: the same contract as the sync
one (directives at step boundaries, exactly one outcome per effect, keys from the call's identity,
the run_one table), with heartbeats an asyncio task and every wait awaited on the loop."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from controlplane_sdk import (
    AsyncClient,
    AsyncRunContext,
    AsyncWorker,
    EffectDenied,
    LeaseLost,
    arun_one,
)
from controlplane_sdk.testing import FakeControlPlane


def purchase(world: list):
    async def agent(ctx: AsyncRunContext) -> None:
        async with ctx.step("reserve"):
            async with ctx.effect("inventory", "reserve", args={"sku": 1}) as fx:
                if not fx.already_done:
                    world.append("reserve")
                    fx.committed("res-1")
                    fx.checkpoint({"reserved": True})  # rides on the outcome
        async with ctx.step("charge"):
            for _ in range(2):  # two intended charges: two effects
                async with ctx.effect("payments", "charge", args={"amount": 5}) as fx:
                    if not fx.already_done:
                        world.append("charge")

    return agent


async def claim(cp: FakeControlPlane, run: str, **kw) -> AsyncRunContext:
    client = AsyncClient("http://cp.test", "t", transport=cp.transport(), backoff=0)
    return await AsyncWorker(client, "w", "buyer", **kw).claim(run)


def test_pause_at_the_boundary_then_resume_replays_and_succeeds():
    cp, world = FakeControlPlane(), []
    run = cp.create_run("buyer")
    cp.pause_after_step(run, "reserve", "check it")

    async def main():
        first = await arun_one(await claim(cp, run), purchase(world))
        cp.resume(run)
        ctx = await claim(cp, run)
        assert ctx.state == {"reserved": True}  # the checkpoint written with the outcome
        return first, await arun_one(ctx, purchase(world))

    first, second = asyncio.run(main())
    assert (first.outcome, first.detail, second.outcome) == ("paused", "check it", "succeeded")
    assert world == ["reserve", "charge", "charge"]
    keys = [e["idempotency_key"].removeprefix(run) for e in cp.effects(run)]
    assert keys == [":reserve:inventory:reserve", ":charge:payments:charge",
                    ":charge:payments:charge:2"]  # fmt: skip


@pytest.mark.parametrize(
    ("raised", "status"),
    [(None, "committed"), (ValueError("no"), "failed"), (httpx.ReadTimeout("slow"), "unknown")],
)
def test_exactly_one_outcome_by_the_sync_rules(raised, status):
    cp = FakeControlPlane()
    run = cp.create_run("buyer")

    async def main():
        ctx = await claim(cp, run)
        with pytest.raises(type(raised)) if raised else _nothing():
            async with ctx.step("s"), ctx.effect("payments", "charge"):
                if raised:
                    raise raised
        await ctx.stop_heartbeat()

    asyncio.run(main())
    assert [e["status"] for e in cp.effects(run)] == [status]
    assert cp.requests.count(f"POST /effects/{cp.effects(run)[0]['id']}/outcome") == 1


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_a_denied_effect_raises_before_its_body():
    cp = FakeControlPlane()
    run = cp.create_run("buyer")
    cp.deny("payments", "charge", "authority_revoked")

    async def main():
        ctx = await claim(cp, run)
        async with ctx.step("s"), ctx.effect("payments", "charge"):
            raise AssertionError("the body must not run")

    with pytest.raises(EffectDenied, match="authority_revoked"):
        asyncio.run(main())


def test_the_heartbeat_task_keeps_the_directive_current_while_the_agent_awaits():
    cp = FakeControlPlane(lease_ttl_s=0.3)  # a beat every 0.1 s
    run = cp.create_run("buyer")

    async def main():
        ctx = await claim(cp, run)
        cp.pause(run, "incident 4")
        await asyncio.sleep(0.4)  # the agent awaits something else; the task beats meanwhile
        seen = ctx.directive, ctx.directive_reason
        await ctx.stop_heartbeat()
        return seen

    assert asyncio.run(main()) == ("pause", "incident 4")
    assert cp.requests.count(f"POST /leases/{cp.runs[run].lease['id']}/heartbeat") >= 2


def test_an_approval_is_awaited_on_the_loop():
    cp = FakeControlPlane()
    run = cp.create_run("buyer")
    cp.require_approval("payments", "charge")

    async def agent(ctx: AsyncRunContext) -> None:
        async with ctx.step("charge"):
            approval_id = await ctx.request_approval("payments", "charge", {"amount": 9}, "big")
            asyncio.get_running_loop().call_later(0.2, cp.approve, approval_id)
            assert (await ctx.await_approval(approval_id, timeout=10)).approved
            async with ctx.effect(
                "payments", "charge", args={"amount": 9}, approval_id=approval_id
            ):
                pass

    async def main():
        return await arun_one(await claim(cp, run), agent)

    assert asyncio.run(main()).outcome == "succeeded"
    assert [e["status"] for e in cp.effects(run)] == ["committed"]


def test_a_lost_lease_stops_the_run_at_the_next_boundary():
    cp = FakeControlPlane()
    run = cp.create_run("buyer")

    async def agent(ctx: AsyncRunContext) -> None:
        async with ctx.step("one"):
            cp.expire_lease(run)
        async with ctx.step("two"):
            raise AssertionError("never reached")

    async def main():
        ctx = await claim(cp, run)
        summary = await arun_one(ctx, agent)
        with pytest.raises(LeaseLost):
            await ctx.check_directive()
        return summary

    assert asyncio.run(main()).outcome == "lease_lost"
    assert cp.state(run) == "queued"
