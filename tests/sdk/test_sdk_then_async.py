"""``fx.then(...)`` in the asyncio runtime: the same scenarios as test_sdk_then.py (the carried
decision is used, an older server or a refused carried body gets the separate declaration, nothing
rides on a failed or raising body, a lost answer's carried declaration is adopted, a changed mind
is recorded not dispatched), and the same requests on the wire as the sync runtime."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import httpx
import pytest

from controlplane_sdk import AsyncClient, AsyncRunContext, AsyncWorker, RunContext
from tests.sdk.test_sdk_then import EFFECTS, HB, RUN, carried, two_steps

if TYPE_CHECKING:
    from tests.sdk.conftest import FakeServer

AHEAD = {"http_status": 201, "id": "e9", "decision": "authorized", "status": "in_flight"}


async def two_steps_async(ctx: AsyncRunContext) -> None:
    async with ctx.step("reserve"):
        async with ctx.effect("inventory", "reserve", args={"sku": "s"}) as fx:
            fx.then("payments", "charge", step="charge", args={"amount": 5})
    async with ctx.step("charge"):
        async with ctx.effect("payments", "charge", args={"amount": 5}) as fx:
            fx.committed("ch-1")


def run_async(server: FakeServer, agent) -> AsyncRunContext:
    async def main() -> AsyncRunContext:
        transport = httpx.MockTransport(server.handler)
        async with AsyncClient("http://cp.test", "t", transport=transport, backoff=0) as client:
            worker = AsyncWorker(client, "worker-7", "purchasing", heartbeat_interval=60)
            async with await worker.claim(RUN) as ctx:
                await agent(ctx)
            return ctx

    return asyncio.run(main())


def test_the_next_effect_uses_the_carried_decision(server: FakeServer) -> None:
    server.on("POST", "/effects/e1/outcome", carried("e1", AHEAD))
    run_async(server, two_steps_async)
    assert len(server.calls("POST", EFFECTS)) == 1
    assert len(server.calls("POST", HB)) == 1  # the first boundary only
    first, second = [r for r in server.requests if r.path.endswith("/outcome")]
    assert first.body["next"]["idempotency_key"] == f"{RUN}:charge:payments:charge"
    assert second.path == "/effects/e9/outcome" and "next" not in second.body


def test_an_older_server_that_ignores_next_gets_the_separate_declaration(
    server: FakeServer,
) -> None:
    run_async(server, two_steps_async)
    assert len(server.calls("POST", EFFECTS)) == 2
    assert len(server.calls("POST", HB)) == 2


def test_a_server_refusing_the_carried_body_gets_the_outcome_alone(server: FakeServer) -> None:
    def strict(req):
        if "next" in req.body:
            return 422, {"error": "invalid", "detail": "unknown field", "field": "next"}
        return 200, {"id": "e1", "status": req.body["status"]}

    server.on("POST", "/effects/e1/outcome", strict)
    run_async(server, two_steps_async)
    assert ["next" in b for b in server.bodies("POST", "/effects/e1/outcome")] == [True, False]
    assert len(server.calls("POST", EFFECTS)) == 2


def test_nothing_rides_on_a_failed_or_raising_body(server: FakeServer) -> None:
    async def agent(ctx: AsyncRunContext) -> None:
        async with ctx.effect("inventory", "reserve", step="reserve") as fx:
            fx.failed({"why": "declined"})
            fx.then("payments", "charge", step="charge")
        with pytest.raises(RuntimeError):
            async with ctx.effect("inventory", "reserve", step="reserve", key="k2") as fx:
                fx.then("payments", "charge", step="charge")
                raise RuntimeError("boom")
        assert not ctx.declared_ahead

    run_async(server, agent)
    outcomes = [r.body for r in server.requests if r.path.endswith("/outcome")]
    assert len(outcomes) == 2 and all("next" not in b for b in outcomes)


def test_an_outcome_retried_after_a_lost_answer_adopts_its_own_carried_declaration(
    server: FakeServer,
) -> None:
    unresolved = {"error": "effect_unresolved", "detail": "in flight", "effect_id": "e9"}
    server.on(
        "POST",
        "/effects/e1/outcome",
        httpx.ReadTimeout("lost"),
        carried("e1", {"http_status": 409, **unresolved}),
    )
    mine = {"id": "e9", "idempotency_key": f"{RUN}:charge:payments:charge"}
    server.on(
        "GET", EFFECTS, (200, {"effects": [{**mine, "status": "in_flight", "attempt_id": "a1"}]})
    )
    run_async(server, two_steps_async)
    assert len(server.calls("POST", EFFECTS)) == 1
    assert server.calls("POST", "/effects/e9/outcome")


def test_a_changed_mind_records_the_ahead_effect_failed_not_dispatched(server: FakeServer) -> None:
    server.on("POST", "/effects/e1/outcome", carried("e1", AHEAD))

    async def agent(ctx: AsyncRunContext) -> None:
        async with ctx.effect("inventory", "reserve", step="reserve") as fx:
            fx.then("payments", "charge", step="charge", args={"amount": 5})
        assert ctx.declared_ahead
        async with ctx.effect("payments", "charge", step="charge", args={"amount": 6}):
            pass

    run_async(server, agent)
    (settled,) = server.bodies("POST", "/effects/e9/outcome")
    assert settled["status"] == "failed" and settled["detail"]["not_dispatched"] is True
    assert len(server.calls("POST", EFFECTS)) == 2


def test_an_ahead_effect_left_at_the_end_of_the_attempt_is_settled(server: FakeServer) -> None:
    server.on("POST", "/effects/e1/outcome", carried("e1", AHEAD))

    async def agent(ctx: AsyncRunContext) -> None:
        async with ctx.effect("inventory", "reserve", step="reserve") as fx:
            fx.then("payments", "charge", step="charge")
        await ctx.finish("succeeded")

    run_async(server, agent)
    (settled,) = server.bodies("POST", "/effects/e9/outcome")
    assert settled["detail"]["not_dispatched"] is True
    assert [r.path for r in server.requests][-2:] == ["/effects/e9/outcome", f"/runs/{RUN}/finish"]


def wire(server: FakeServer) -> list[tuple[str, str, object]]:
    return [(r.method, r.path, r.body) for r in server.requests]


@pytest.mark.parametrize("carries", [True, False], ids=["server-carries-next", "older-server"])
def test_sync_and_async_send_the_same_requests(
    carries: bool, server: FakeServer, ctx: RunContext
) -> None:
    from tests.sdk.conftest import FakeServer

    sync_server, async_server = server, FakeServer()  # ctx is the sync runtime on `server`
    for s in (sync_server, async_server):
        if carries:
            s.on("POST", "/effects/e1/outcome", carried("e1", AHEAD))
    two_steps(ctx)
    run_async(async_server, two_steps_async)
    assert len(wire(sync_server)) > 6
    assert wire(async_server)[1:] == wire(sync_server)[1:]  # after the claim (its versions differ)
