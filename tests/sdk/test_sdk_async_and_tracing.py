"""The async client (httpx.AsyncClient underneath, no threads) never blocks the event loop; every
call carries a W3C traceparent, and all calls
of one run (the agent's and the heartbeat thread's) share the run's trace id."""

from __future__ import annotations

import asyncio
import re
import time

import httpx

from controlplane_sdk import AsyncClient, Client, run_agent_loop
from tests.sdk.conftest import RUN, FakeServer

TRACEPARENT = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-01$")


def test_async_calls_run_concurrently_without_blocking_the_loop() -> None:
    async def slow(request: httpx.Request) -> httpx.Response:  # a server that takes 0.5 s
        await asyncio.sleep(0.5)
        return httpx.Response(200, json={"id": RUN, "state": "running"})

    async def main():
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                await asyncio.sleep(0.05)
                ticks += 1

        t = asyncio.create_task(ticker())
        async with AsyncClient("http://cp.test", "t", transport=httpx.MockTransport(slow)) as cp:
            started = time.monotonic()
            runs = await asyncio.gather(*(cp.get_run(RUN) for _ in range(3)))
            elapsed = time.monotonic() - started
        t.cancel()
        return runs, elapsed, ticks

    runs, elapsed, ticks = asyncio.run(main())
    assert [r["state"] for r in runs] == ["running"] * 3
    assert elapsed < 1.2, elapsed  # three 0.5 s calls side by side, not one after another
    assert ticks >= 5  # the loop kept running while the calls waited


def test_every_call_of_a_run_carries_the_runs_trace(server: FakeServer) -> None:
    run_id = "5f0c6a2e-8d1b-4c3a-9e7f-0a1b2c3d4e5f"
    claimed = {
        "run_id": run_id,
        "attempt": {"id": "a1", "number": 1},
        "lease": {
            "id": "l1",
            "fencing_token": 1,
            "expires_at": "2030-01-01T00:00:00Z",
            "ttl_s": 0.3,
        },
        "checkpoint": None,
        "directive": "continue",
    }
    server.on("POST", "/work/claim", (200, {"claim": claimed}), (200, {"claim": None}))
    client = Client("http://cp.test", "t", transport=httpx.MockTransport(server.handler))

    def agent(ctx):
        time.sleep(0.4)  # long enough for the background heartbeat to beat
        ctx.checkpoint("one", {"n": 1})

    run_agent_loop(client, "purchasing", "w", agent, exit_when_idle=True, heartbeat_interval=0.1)
    ids = {}
    for req in server.requests:
        m = TRACEPARENT.match(req.headers["traceparent"])
        assert m, req.headers["traceparent"]
        ids.setdefault(req.path, set()).add(m.group(1))
    run_trace = run_id.replace("-", "")
    assert ids[f"/runs/{run_id}/checkpoints"] == {run_trace}
    assert ids["/leases/l1/heartbeat"] == {run_trace}  # from the heartbeat thread too
    assert run_trace not in ids["/work/claim"]  # before the run: a trace of its own
