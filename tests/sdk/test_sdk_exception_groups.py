"""run_one and arun_one end an attempt by the exception an agent's TaskGroup wrapped: a group of one
(nested groups of one too) is the exception inside it, as if the agent had raised it directly; a
group of several is a failure of the attempt."""

from __future__ import annotations

import asyncio

import pytest

from controlplane_sdk import (
    AsyncClient,
    AsyncRunContext,
    AsyncWorker,
    RunContext,
    Worker,
    arun_one,
    run_one,
)
from controlplane_sdk.testing import FakeControlPlane


def claim(cp: FakeControlPlane, run: str) -> RunContext:
    return Worker(cp.client(), "w", "buyer").claim(run, heartbeat=False)


def in_a_task_group(*bodies):
    """A sync agent whose work runs as tasks of an asyncio TaskGroup (as MCP's and anyio-based
    clients do): what a task raises leaves the group wrapped."""

    def agent(ctx: RunContext) -> None:
        async def main() -> None:
            async with asyncio.TaskGroup() as tg:
                for body in bodies:
                    tg.create_task(asyncio.to_thread(body, ctx))

        asyncio.run(main())

    return agent


def reserve(ctx: RunContext) -> None:
    with ctx.step("reserve"), ctx.effect("inventory", "reserve") as fx:
        fx.committed("res-1")


def fails(ctx: RunContext) -> None:
    raise ValueError("the warehouse said no")


def test_a_pause_raised_inside_a_task_group_pauses_the_run():
    cp = FakeControlPlane()
    run = cp.create_run("buyer")

    def paused_then_reserve(ctx: RunContext) -> None:
        cp.pause(run, "check the price")  # while the task runs: its declaration is refused
        reserve(ctx)

    summary = run_one(claim(cp, run), in_a_task_group(paused_then_reserve))

    assert (summary.outcome, cp.state(run)) == ("paused", "paused")
    cp.resume(run)
    assert run_one(claim(cp, run), in_a_task_group(reserve)).outcome == "succeeded"


def test_a_failure_inside_a_task_group_fails_the_attempt_as_itself():
    cp = FakeControlPlane()
    run = cp.create_run("buyer")
    summary = run_one(claim(cp, run), in_a_task_group(fails))
    assert summary.outcome == "failed"
    assert summary.detail == "ValueError: the warehouse said no"  # not "ExceptionGroup: …"


def test_a_lost_lease_inside_nested_groups_of_one_is_a_lost_lease():
    cp = FakeControlPlane()
    run = cp.create_run("buyer")

    def agent(ctx: RunContext) -> None:
        cp.expire_lease(run)
        try:
            reserve(ctx)
        except Exception as exc:  # what two layers of task groups would make of it
            raise BaseExceptionGroup("outer", [ExceptionGroup("inner", [exc])]) from None

    assert run_one(claim(cp, run), agent).outcome == "lease_lost"


def test_a_group_of_several_failures_fails_the_attempt():
    cp = FakeControlPlane()
    run = cp.create_run("buyer")

    def agent(ctx: RunContext) -> None:
        raise ExceptionGroup("tasks", [ValueError("no stock"), KeyError("no card")])

    summary = run_one(claim(cp, run), agent)
    assert summary.outcome == "failed" and summary.detail.startswith("ExceptionGroup")


def test_a_base_exception_in_a_group_of_one_propagates_as_itself():
    """A worker's own death (the conformance kit's injected kill, SystemExit…) is not the agent's
    failure: it leaves run_one as itself, not as a group an ``except`` for it would miss."""

    class Killed(BaseException):
        pass

    def agent(ctx: RunContext) -> None:
        raise BaseExceptionGroup("tasks", [Killed("SIGKILL")])

    cp = FakeControlPlane()
    with pytest.raises(Killed):
        run_one(claim(cp, cp.create_run("buyer")), agent)


def test_arun_one_unwraps_a_task_group_too():
    cp = FakeControlPlane()
    paused, failed = cp.create_run("buyer"), cp.create_run("buyer")

    async def reserve_async(ctx: AsyncRunContext) -> None:
        cp.pause(paused, "check the price")  # while the task runs: its declaration is refused
        async with ctx.step("reserve"), ctx.effect("inventory", "reserve") as fx:
            fx.committed("res-1")

    async def fails_async(ctx: AsyncRunContext) -> None:
        raise ValueError("the warehouse said no")

    def grouped(body):
        async def agent(ctx: AsyncRunContext) -> None:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(body(ctx))

        return agent

    async def main():
        client = AsyncClient("http://cp.test", "t", transport=cp.transport(), backoff=0)
        worker = AsyncWorker(client, "w", "buyer")
        first = await arun_one(await worker.claim(paused, heartbeat=False), grouped(reserve_async))
        second = await arun_one(await worker.claim(failed, heartbeat=False), grouped(fails_async))
        return first, second

    first, second = asyncio.run(main())
    assert (first.outcome, cp.state(paused)) == ("paused", "paused")
    assert (second.outcome, second.detail) == ("failed", "ValueError: the warehouse said no")
