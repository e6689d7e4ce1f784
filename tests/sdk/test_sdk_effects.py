"""The effect context manager: declare before dispatch, record exactly one outcome on exit."""

from __future__ import annotations

from typing import TYPE_CHECKING

import httpx
import pytest

from controlplane_sdk import (
    EffectAlreadyFailed,
    EffectDenied,
    EffectUnresolved,
    IdempotencyKeyReused,
    LeaseLost,
    OutcomeNotRecorded,
    RunContext,
)

if TYPE_CHECKING:
    from tests.sdk.conftest import FakeServer

RUN, TOKEN = "r1", 7  # what the fake server in conftest.py hands out
EFFECTS = f"/runs/{RUN}/effects"


def outcomes(server: FakeServer) -> list[tuple[str, dict]]:
    return [(r.path, r.body) for r in server.requests if r.path.endswith("/outcome")]


class WorldDown(Exception):
    pass


def test_committed_with_external_ref(server: FakeServer, ctx: RunContext) -> None:
    world_calls = []
    with ctx.effect(
        "payments",
        "charge",
        key="order-42-charge",
        args={"amount": 42},
        step="charge",
        compensate={"tool": "payments", "action": "refund"},
    ) as fx:
        assert (fx.decision, fx.replayed, fx.already_done) == ("authorized", False, False)
        world_calls.append(fx.idempotency_key)
        fx.committed(external_ref="ch_123", detail={"amount": 42})
    assert world_calls == ["order-42-charge"]
    (decl,) = server.bodies("POST", EFFECTS)
    assert decl["fencing_token"] == TOKEN and decl["idempotency_key"] == "order-42-charge"
    assert (
        decl["compensation"] == {"tool": "payments", "action": "refund"}
        and decl["irreversible"] is False
    )
    assert outcomes(server) == [
        (
            f"/effects/{fx.effect_id}/outcome",
            {
                "fencing_token": TOKEN,
                "status": "committed",
                "external_ref": "ch_123",
                "detail": {"amount": 42},
            },
        )
    ]
    assert (fx.status, fx.external_ref, fx.result) == ("committed", "ch_123", {"amount": 42})
    assert fx.outcome_response == {
        "id": fx.effect_id,
        "status": "committed",
        "late": False,
        "stale_lease": False,
    }


def test_normal_exit_without_verdict_records_committed(server: FakeServer, ctx: RunContext) -> None:
    with ctx.step("notify"), ctx.effect("notifications", "enqueue", irreversible=True) as fx:
        pass
    assert fx.idempotency_key == f"{RUN}:notify:notifications:enqueue"
    assert server.bodies("POST", EFFECTS)[0]["step"] == "notify"
    assert server.bodies("POST", EFFECTS)[0]["irreversible"] is True
    assert [b["status"] for _, b in outcomes(server)] == ["committed"]


def test_other_exception_records_failed_and_propagates(server: FakeServer, ctx: RunContext) -> None:
    with pytest.raises(ValueError, match="card declined"):
        with ctx.effect("payments", "charge", step="charge"):
            raise ValueError("card declined")
    ((_, body),) = outcomes(server)
    assert body["status"] == "failed"
    assert body["detail"] == {"exception": "ValueError", "message": "card declined"}


def test_explicit_failed(server: FakeServer, ctx: RunContext) -> None:
    with ctx.effect("inventory", "reserve", step="reserve") as fx:
        fx.failed(detail={"why": "out of stock"})
    assert [b["status"] for _, b in outcomes(server)] == ["failed"]


@pytest.mark.parametrize(
    "exc",
    [
        httpx.ReadTimeout("read timed out"),
        httpx.ConnectError("reset"),
        TimeoutError("deadline"),
        ConnectionResetError("peer reset"),
    ],
)
def test_timeout_like_exception_records_unknown(
    server: FakeServer, ctx: RunContext, exc: Exception
) -> None:
    with pytest.raises(type(exc)):
        with ctx.effect("payments", "charge", step="charge"):
            raise exc
    ((_, body),) = outcomes(server)
    assert body["status"] == "unknown"
    assert body["detail"]["exception"] == type(exc).__name__


def test_unknown_on_extends_the_ambiguous_exceptions(server: FakeServer, ctx: RunContext) -> None:
    with pytest.raises(WorldDown):
        with ctx.effect("shipping", "create_label", step="label", unknown_on=(WorldDown,)):
            raise WorldDown("502 from carrier")
    assert [b["status"] for _, b in outcomes(server)] == ["unknown"]


def test_verdict_set_before_exception_wins(server: FakeServer, ctx: RunContext) -> None:
    with pytest.raises(KeyError):
        with ctx.effect("payments", "charge", step="charge") as fx:
            fx.committed(external_ref="ch_9")
            raise KeyError("bug after the world call")
    ((_, body),) = outcomes(server)
    assert (body["status"], body["external_ref"]) == ("committed", "ch_9")


def test_denied_raises_before_the_body_runs(server: FakeServer, ctx: RunContext) -> None:
    server.on(
        "POST", EFFECTS, (409, {"error": "denied", "decision": "denied", "reason": "run_paused"})
    )
    dispatched = []
    with pytest.raises(EffectDenied) as ei:
        with ctx.effect("payments", "charge", step="charge"):
            dispatched.append(True)
    assert ei.value.reason == "run_paused"
    assert dispatched == [] and outcomes(server) == []


def test_denied_for_lease_lost_marks_the_context(server: FakeServer, ctx: RunContext) -> None:
    server.on(
        "POST", EFFECTS, (409, {"error": "denied", "decision": "denied", "reason": "lease_lost"})
    )
    with pytest.raises(EffectDenied):
        with ctx.effect("payments", "charge", step="charge"):
            pass
    assert ctx.lease_lost
    with pytest.raises(LeaseLost):
        ctx.check_directive(refresh=False)


def test_replayed_committed_skips_the_world(server: FakeServer, ctx: RunContext) -> None:
    server.on(
        "POST",
        EFFECTS,
        (
            200,
            {
                "id": "e0",
                "decision": "replayed",
                "status": "committed",
                "idempotency_key": "order-42-charge",
                "external_ref": "ch_123",
                "outcome_detail": {"amount": 42},
            },
        ),
    )
    world_calls = []
    with ctx.effect("payments", "charge", key="order-42-charge", step="charge") as fx:
        if fx.already_done:
            pass
        else:
            world_calls.append(1)
        fx.committed(external_ref="ch_other")  # ignored: the ledger already says committed
    assert world_calls == [] and outcomes(server) == []
    assert (fx.replayed, fx.decision, fx.status) == (True, "replayed", "committed")
    assert (fx.external_ref, fx.result) == ("ch_123", {"amount": 42})


def test_key_reused_unresolved_and_failed_raise_before_the_body(
    server: FakeServer, ctx: RunContext
) -> None:
    server.on(
        "POST",
        EFFECTS,
        (422, {"error": "idempotency_key_reused", "detail": "other args"}),
        (409, {"error": "effect_unresolved", "effect_id": "e0", "status": "unknown"}),
        (200, {"id": "e0", "decision": "replayed", "status": "failed", "idempotency_key": "k"}),
    )
    for cls in (IdempotencyKeyReused, EffectUnresolved, EffectAlreadyFailed):
        with pytest.raises(cls):
            with ctx.effect("payments", "charge", step="charge"):
                pytest.fail("body must not run")
    assert outcomes(server) == []


def test_effect_needs_a_step(ctx: RunContext) -> None:
    with pytest.raises(ValueError):
        ctx.effect("payments", "charge")


def test_outcome_not_recorded_is_raised_after_a_clean_body(
    server: FakeServer, ctx: RunContext
) -> None:
    server.on("POST", "/effects/e1/outcome", httpx.ConnectError("down"))
    with pytest.raises(OutcomeNotRecorded) as ei:
        with ctx.effect("payments", "charge", step="charge") as fx:
            fx.committed(external_ref="ch_1")
    assert (ei.value.effect_id, ei.value.status) == ("e1", "committed")
    assert len(server.calls("POST", "/effects/e1/outcome")) == 4  # retried, then given up


def test_body_exception_survives_a_failed_outcome_write(
    server: FakeServer, ctx: RunContext
) -> None:
    server.on("POST", "/effects/e1/outcome", httpx.ConnectError("down"))
    with pytest.raises(httpx.ReadTimeout) as ei:
        with ctx.effect("payments", "charge", step="charge"):
            raise httpx.ReadTimeout("world slow")
    assert any("NOT recorded" in n for n in ei.value.__notes__)


def test_late_outcome_flags_are_exposed(server: FakeServer, ctx: RunContext) -> None:
    server.on(
        "POST",
        "/effects/e1/outcome",
        (200, {"id": "e1", "status": "committed", "late": True, "stale_lease": False}),
    )
    with ctx.effect("payments", "charge", step="charge") as fx:
        pass
    assert fx.outcome_response and fx.outcome_response["late"] is True


def test_approval_id_is_cited_on_declaration(server: FakeServer, ctx: RunContext) -> None:
    with ctx.effect("payments", "charge", step="charge", args={"amount": 900}, approval_id="ap1"):
        pass
    assert server.bodies("POST", EFFECTS)[0]["approval_id"] == "ap1"


def test_outcome_body_matches_the_server_schema(server: FakeServer, ctx: RunContext) -> None:
    with ctx.effect("payments", "charge", step="charge") as fx:
        fx.committed(detail="plain string")  # not an object: wrapped
    ((_, body),) = outcomes(server)
    assert body == {
        "fencing_token": TOKEN,
        "status": "committed",
        "external_ref": "",
        "detail": {"value": "plain string"},
    }


def test_a_checkpoint_rides_on_the_outcome_when_the_server_takes_it(
    server: FakeServer, ctx: RunContext
) -> None:
    def outcome(req):
        return 200, {
            "id": req.path.split("/")[2],
            "status": req.body["status"],
            "checkpoint": {"id": 9, "seq": 4, "step": "charge", "hash": "h"},
        }

    server.on("POST", "/effects/e1/outcome", outcome)
    with ctx.effect("payments", "charge", step="charge", checkpoint={"charged": 1}):
        pass
    ((_, body),) = outcomes(server)
    assert body["checkpoint"] == {"step": "charge", "state": {"charged": 1}}
    assert server.calls("POST", f"/runs/{RUN}/checkpoints") == []
    assert (ctx.last_checkpoint_seq, ctx.state) == (4, {"charged": 1})


def test_an_older_server_that_ignores_the_carried_checkpoint_gets_the_separate_call(
    server: FakeServer, ctx: RunContext
) -> None:
    with ctx.effect("payments", "charge", step="charge", checkpoint={"charged": 1}):
        pass
    (cp,) = server.bodies("POST", f"/runs/{RUN}/checkpoints")
    assert cp == {"fencing_token": TOKEN, "step": "charge", "state": {"charged": 1}}
    assert ctx.state == {"charged": 1}


def test_a_refused_carried_checkpoint_is_lease_lost_and_a_failed_step_carries_none(
    server: FakeServer, ctx: RunContext
) -> None:
    refused = {"error": "lease_lost", "detail": "the lease expired", "field": ""}
    server.on(
        "POST",
        "/effects/e1/outcome",
        lambda req: (200, {"id": "e1", "status": "committed", "checkpoint": refused}),
    )
    with pytest.raises(LeaseLost):
        with ctx.effect("payments", "charge", step="charge", checkpoint={"charged": 1}):
            pass
    with pytest.raises(WorldDown):
        with ctx.effect("payments", "refund", step="refund", checkpoint={"refunded": 1}):
            raise WorldDown()
    assert "checkpoint" not in outcomes(server)[-1][1]
