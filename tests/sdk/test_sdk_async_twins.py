"""The async twins of the sync API that had none (timers, waiting for a directive, queued runs,
the operator calls, closing a context), each against the in-memory control plane with the sync
call beside it: same arguments, same answer."""

from __future__ import annotations

import asyncio
import json
import time

import httpx

from controlplane_sdk import AsyncClient, AsyncWorker, Client, Worker
from controlplane_sdk.testing import FakeControlPlane


def _async_worker(cp: FakeControlPlane) -> AsyncWorker:
    return AsyncWorker(AsyncClient("http://cp.test", "t", transport=cp.transport()), "w", "buyer")


def test_set_timer_and_pop_fired_timers_sync_and_async_deliver_the_same_timer_once():
    cp = FakeControlPlane()
    sync_run, async_run = cp.create_run("buyer"), cp.create_run("buyer")
    ctx = Worker(cp.client(), "w", "buyer").claim(sync_run, heartbeat=False)
    ctx.set_timer("remind", in_s=0.05)
    time.sleep(0.1)
    ctx.refresh()
    sync_fired = ctx.pop_fired_timers()

    async def main():
        actx = await _async_worker(cp).claim(async_run, heartbeat=False)
        when = await actx.set_timer("remind", in_s=0.05)
        assert actx.pop_fired_timers() == []  # not due yet
        await asyncio.sleep(0.1)
        await actx.refresh()
        fired = actx.pop_fired_timers()
        await actx.refresh()
        again = actx.pop_fired_timers()
        await actx.aclose()
        return when, fired, again

    when, fired, again = asyncio.run(main())
    assert [t["name"] for t in sync_fired] == ["remind"]
    assert fired == [{"name": "remind", "fire_at": when}] and again == []


def test_wait_for_directive_async_returns_when_an_operator_pauses():
    cp = FakeControlPlane()
    run = cp.create_run("buyer")

    async def main():
        actx = await _async_worker(cp).claim(run, heartbeat=False)
        asyncio.get_running_loop().call_later(0.2, cp.pause, run, "hold")
        t0 = time.monotonic()
        got = await actx.wait_for_directive(wait_s=0.05, timeout=5)
        quiet = await actx.wait_for_directive(wait_s=0.05, timeout=0.2)  # no change: the timeout
        return got, quiet, time.monotonic() - t0

    got, quiet, took = asyncio.run(main())
    assert got == "pause" and quiet == "pause" and took < 4


def test_queued_runs_async_lists_what_the_sync_worker_lists():
    cp = FakeControlPlane()
    runs = {cp.create_run("buyer"), cp.create_run("buyer")}
    sync = {r["id"] for r in Worker(cp.client(), "w", "buyer").queued_runs()}
    got = {r["id"] for r in asyncio.run(_async_worker(cp).queued_runs())}
    assert sync == got == runs


def test_the_async_operator_calls_send_what_the_sync_ones_send():
    sent: list[tuple[str, str, object]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        sent.append((request.method, request.url.path, body))
        return httpx.Response(200, json={"id": "i-1", "status": "completed"})

    t = httpx.MockTransport(handler)
    sync = Client("http://cp.test", "t", transport=t)
    sync.preview_intervention("r-1", "pause", "why")
    sync.get_intervention("i-1")
    sync.reconcile_effect("e-1", "committed", "asked the tool", "checked", "ref-1")
    expected, sent[:] = list(sent), []

    async def main():
        async with AsyncClient("http://cp.test", "t", transport=t) as c:
            assert (await c.preview_intervention("r-1", "pause", "why"))["id"] == "i-1"
            assert (await c.get_intervention("i-1"))["status"] == "completed"
            await c.reconcile_effect("e-1", "committed", "asked the tool", "checked", "ref-1")

    asyncio.run(main())
    assert sent == expected and len(sent) == 3
    assert sent[0][1].endswith("/runs/r-1/interventions/preview")


def test_the_async_tool_decorator_declares_each_call_and_replays_a_committed_one():
    cp = FakeControlPlane()
    run = cp.create_run("buyer")
    world: list[int] = []

    async def attempt(stop_after_first: bool):
        ctx = await _async_worker(cp).claim(run, heartbeat=False)

        @ctx.tool("payments", "charge")
        async def charge(amount: int, idempotency_key: str) -> str:
            world.append(amount)
            return f"ch-{idempotency_key[-1]}"

        async with ctx.step("pay"):
            first = await charge(amount=5)
            if stop_after_first:
                return [first]
            return [first, await charge(amount=5)]  # a second intent: a new effect

    one = asyncio.run(attempt(True))
    cp.expire_lease(run)
    both = asyncio.run(attempt(False))
    assert world == [5, 5] and both[0] == one[0]  # the first was replayed, not sent again
    assert len({e["idempotency_key"] for e in cp.effects(run)}) == 2


def test_arun_agent_loop_runs_queued_runs_like_run_agent_loop():
    from controlplane_sdk import arun_agent_loop, run_agent_loop

    cp = FakeControlPlane()
    for _ in range(2):
        cp.create_run("buyer")

    def sync_fn(ctx):
        with ctx.step("s"), ctx.effect("inventory", "reserve") as fx:
            fx.committed("r")

    async def async_fn(ctx):
        async with ctx.step("s"), ctx.effect("inventory", "reserve") as fx:
            fx.committed("r")

    sync = run_agent_loop(cp.client(), "buyer", "w", sync_fn, exit_when_idle=True, max_runs=1)
    client = AsyncClient("http://cp.test", "t", transport=cp.transport())
    rest = asyncio.run(arun_agent_loop(client, "buyer", "w", async_fn, exit_when_idle=True))
    assert [s.outcome for s in sync] == ["succeeded"] and [s.outcome for s in rest] == ["succeeded"]
    assert {cp.state(r) for r in cp.runs} == {"succeeded"}
