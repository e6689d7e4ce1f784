"""``fx.then(...)``: the next declaration rides on an effect's outcome (against the fake server: older
servers, refusals of the carried body, a retried outcome)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import httpx
import pytest

from controlplane_sdk import AsyncClient, RunContext

if TYPE_CHECKING:
    from tests.sdk.conftest import FakeServer

RUN, TOKEN, LEASE = "r1", 7, "l1"
EFFECTS = f"/runs/{RUN}/effects"
HB = f"/leases/{LEASE}/heartbeat"


def carried(effect_id: str, next_answer: dict):
    return lambda req: (200, {"id": effect_id, "status": "committed", "next": next_answer})


def two_steps(ctx: RunContext) -> None:
    with ctx.step("reserve"):
        with ctx.effect("inventory", "reserve", args={"sku": "s"}) as fx:
            fx.then("payments", "charge", step="charge", args={"amount": 5})
    with ctx.step("charge"):
        with ctx.effect("payments", "charge", args={"amount": 5}) as fx:
            fx.committed("ch-1")


def test_the_next_effect_uses_the_carried_decision(server: FakeServer, ctx: RunContext) -> None:
    server.on(
        "POST",
        "/effects/e1/outcome",
        carried(
            "e1", {"http_status": 201, "id": "e9", "decision": "authorized", "status": "in_flight"}
        ),
    )
    two_steps(ctx)
    assert len(server.calls("POST", EFFECTS)) == 1
    assert len(server.calls("POST", HB)) == 1  # the first boundary only
    (first, second) = [r for r in server.requests if r.path.endswith("/outcome")]
    assert first.body["next"] == {
        "fencing_token": TOKEN,
        "step": "charge",
        "tool": "payments",
        "action": "charge",
        "idempotency_key": f"{RUN}:charge:payments:charge",
        "args": {"amount": 5},
        "compensation": None,
        "irreversible": False,
    }
    assert second.path == "/effects/e9/outcome" and "next" not in second.body


def test_an_older_server_that_ignores_next_gets_the_separate_declaration(
    server: FakeServer, ctx: RunContext
) -> None:
    two_steps(ctx)  # the fake server's default outcome answer has no "next"
    assert len(server.calls("POST", EFFECTS)) == 2
    assert len(server.calls("POST", HB)) == 2  # nothing authorized ahead: both boundaries check


def test_a_server_refusing_the_carried_body_gets_the_outcome_alone(
    server: FakeServer, ctx: RunContext
) -> None:
    def strict(req):
        if "next" in req.body:
            return 422, {"error": "invalid", "detail": "unknown field", "field": "next"}
        return 200, {"id": "e1", "status": req.body["status"]}

    server.on("POST", "/effects/e1/outcome", strict)
    two_steps(ctx)
    bodies = server.bodies("POST", "/effects/e1/outcome")
    assert ["next" in b for b in bodies] == [True, False]
    assert len(server.calls("POST", EFFECTS)) == 2


def test_nothing_rides_on_a_failed_or_raising_body(server: FakeServer, ctx: RunContext) -> None:
    with ctx.effect("inventory", "reserve", step="reserve") as fx:
        fx.failed({"why": "declined"})
        fx.then("payments", "charge", step="charge")
    with pytest.raises(RuntimeError):
        with ctx.effect("inventory", "reserve", step="reserve", key="k2") as fx:
            fx.then("payments", "charge", step="charge")
            raise RuntimeError("boom")
    assert all(
        "next" not in b
        for _, b in [(r.path, r.body) for r in server.requests if r.path.endswith("/outcome")]
    )
    assert not ctx.declared_ahead


def test_an_outcome_retried_after_a_lost_answer_adopts_its_own_carried_declaration(
    server: FakeServer, ctx: RunContext
) -> None:
    # The first try reached the server (outcome recorded, next authorized) but its answer was lost;
    # the retry finds the key in flight: it is ours (same attempt), so it is adopted, not refused.
    unresolved = {"error": "effect_unresolved", "detail": "in flight", "effect_id": "e9"}
    server.on(
        "POST",
        "/effects/e1/outcome",
        httpx.ReadTimeout("lost"),
        carried("e1", {"http_status": 409, **unresolved}),
    )
    server.on(
        "GET",
        EFFECTS,
        (
            200,
            {
                "effects": [
                    {
                        "id": "e9",
                        "idempotency_key": f"{RUN}:charge:payments:charge",
                        "status": "in_flight",
                        "attempt_id": "a1",
                    }
                ]
            },
        ),
    )
    two_steps(ctx)
    assert len(server.calls("POST", EFFECTS)) == 1
    assert server.calls("POST", "/effects/e9/outcome")


def test_a_changed_mind_records_the_ahead_effect_failed_not_dispatched(
    server: FakeServer, ctx: RunContext
) -> None:
    server.on(
        "POST",
        "/effects/e1/outcome",
        carried(
            "e1", {"http_status": 201, "id": "e9", "decision": "authorized", "status": "in_flight"}
        ),
    )
    with ctx.effect("inventory", "reserve", step="reserve") as fx:
        fx.then("payments", "charge", step="charge", args={"amount": 5})
    assert ctx.declared_ahead
    with ctx.effect("payments", "charge", step="charge", args={"amount": 6}):
        pass
    (settled,) = server.bodies("POST", "/effects/e9/outcome")
    assert settled["status"] == "failed" and settled["detail"]["not_dispatched"] is True
    assert len(server.calls("POST", EFFECTS)) == 2


def test_the_async_client_is_native_httpx() -> None:
    import httpx

    assert isinstance(AsyncClient("http://cp.test", "t")._http, httpx.AsyncClient)
