"""RunContext: heartbeat thread, directives at step boundaries, history, approvals."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import pytest

from controlplane_sdk import (
    CancelRequested,
    DirectiveInterrupt,
    LeaseLost,
    PauseRequested,
    RunContext,
    StopRequested,
    Worker,
)

if TYPE_CHECKING:
    from tests.sdk.conftest import FakeServer

RUN, LEASE, TOKEN = "r1", "l1", 7  # what the fake server in conftest.py hands out
HB = f"/leases/{LEASE}/heartbeat"
EVENTS = f"/runs/{RUN}/events"


def hb(directive: str, reason: str = "", **extra) -> tuple[int, dict]:
    return 200, {
        "directive": directive,
        "reason": reason,
        "expires_at": "2030-01-01T00:00:00Z",
        **extra,
    }


def until(pred, timeout: float = 3.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.01)
    return False


def test_claim_exposes_attempt_lease_and_checkpoint(server: FakeServer, worker: Worker) -> None:
    server.checkpoint = {"seq": 3, "step": "reserve", "state": {"reservation": "rs_1"}}
    with worker.claim(RUN) as ctx:
        assert (ctx.attempt.id, ctx.lease.id, ctx.fencing_token) == ("a1", LEASE, TOKEN)
        assert ctx.start_checkpoint and ctx.start_checkpoint.step == "reserve"
        assert ctx.state == {"reservation": "rs_1"} and ctx.last_checkpoint_seq == 3
        assert ctx.directive == "continue"
    assert server.bodies("POST", f"/runs/{RUN}/claim") == [
        {"worker": "worker-7", "versions": {"code": "1.0"}}
    ]


def test_default_heartbeat_interval_is_a_third_of_ttl(server: FakeServer, client) -> None:
    server.ttl_s = 30
    with Worker(client, "w", "a").claim(RUN, heartbeat=False) as ctx:
        assert ctx.heartbeat_interval == pytest.approx(10)


@pytest.mark.parametrize(
    ("directive", "exc"),
    [("pause", PauseRequested), ("cancel", CancelRequested), ("stop", StopRequested)],
)
def test_check_directive_raises_at_a_boundary(
    server: FakeServer, ctx: RunContext, directive, exc
) -> None:
    server.on("POST", HB, hb(directive, "operator alice: assumptions stale"))
    with pytest.raises(exc) as ei:
        ctx.check_directive()
    assert isinstance(ei.value, DirectiveInterrupt)
    assert (
        ei.value.directive == directive and ei.value.reason == "operator alice: assumptions stale"
    )


def test_continue_passes(server: FakeServer, ctx: RunContext) -> None:
    assert ctx.check_directive() == "continue"
    assert server.bodies("POST", HB) == [{"fencing_token": TOKEN}]


def test_step_checks_directive_and_records_events(server: FakeServer, ctx: RunContext) -> None:
    ran = []
    with ctx.step("reserve"):
        assert ctx.current_step == "reserve"
        ran.append("reserve")
    server.on("POST", HB, hb("pause"))
    with pytest.raises(PauseRequested):
        with ctx.step("label"):
            ran.append("label")
    assert ran == ["reserve"]
    kinds = [
        (e["kind"], e["data"]["step"]) for b in server.bodies("POST", EVENTS) for e in b["events"]
    ]
    assert kinds == [("step_started", "reserve"), ("step_completed", "reserve")]
    assert all(b["fencing_token"] == TOKEN for b in server.bodies("POST", EVENTS))


def test_step_failure_records_no_completion(server: FakeServer, ctx: RunContext) -> None:
    with pytest.raises(RuntimeError):
        with ctx.step("charge"):
            raise RuntimeError("x")
    kinds = [e["kind"] for b in server.bodies("POST", EVENTS) for e in b["events"]]
    assert kinds == ["step_started"] and ctx.current_step is None


def test_background_heartbeat_stores_latest_directive(server: FakeServer, client) -> None:
    server.on("POST", HB, hb("continue"), hb("continue"), hb("pause", "ops"))
    with Worker(client, "w", "a", heartbeat_interval=0.01).claim(RUN) as ctx:
        assert until(lambda: ctx.directive == "pause")
        assert ctx.directive_reason == "ops"
        with pytest.raises(PauseRequested):
            ctx.check_directive(refresh=False)


def test_heartbeat_thread_stops_on_lease_lost(server: FakeServer, client) -> None:
    server.on("POST", HB, hb("continue"), (409, {"error": "lease_lost", "detail": "fenced out"}))
    with Worker(client, "w", "a", heartbeat_interval=0.01).claim(RUN) as ctx:
        assert until(lambda: ctx.lease_lost)
        thread = ctx._thread
        assert thread is not None and until(lambda: not thread.is_alive())
        n = len(server.calls("POST", HB))
        time.sleep(0.1)
        assert len(server.calls("POST", HB)) == n == 2
        with pytest.raises(LeaseLost):
            ctx.check_directive()
        assert len(server.calls("POST", HB)) == n  # no more writes with the dead token


def test_heartbeat_thread_survives_transient_errors(server: FakeServer, client) -> None:
    server.on(
        "POST",
        HB,
        (503, {"error": "busy"}),
        (503, {"error": "busy"}),
        (503, {"error": "busy"}),
        (503, {"error": "busy"}),
        hb("cancel"),
    )
    with Worker(client, "w", "a", heartbeat_interval=0.01).claim(RUN) as ctx:
        assert until(lambda: ctx.directive == "cancel")
        assert not ctx.lease_lost


def test_close_stops_the_heartbeat_thread(server: FakeServer, client) -> None:
    ctx = Worker(client, "w", "a", heartbeat_interval=0.01).claim(RUN)
    assert until(lambda: len(server.calls("POST", HB)) >= 2)
    ctx.close()
    n = len(server.calls("POST", HB))
    time.sleep(0.05)
    assert len(server.calls("POST", HB)) == n


def test_wait_for_directive_long_polls_until_change(server: FakeServer, ctx: RunContext) -> None:
    server.on("POST", HB, hb("wait"), hb("wait"), hb("continue"))
    assert ctx.wait_for_directive(wait_s=0.01, current="wait") == "continue"
    assert [b["wait_s"] for b in server.bodies("POST", HB)] == [0.01, 0.01, 0.01]


def test_wait_for_directive_times_out(server: FakeServer, ctx: RunContext) -> None:
    server.on("POST", HB, hb("wait"))
    t0 = time.monotonic()
    assert ctx.wait_for_directive(wait_s=0.02, timeout=0.1, current="wait") == "wait"
    assert time.monotonic() - t0 < 1.0


def test_check_directive_blocks_while_waiting(server: FakeServer, ctx: RunContext) -> None:
    server.on("POST", HB, hb("wait"), hb("wait"), hb("continue"))
    assert ctx.check_directive() == "continue"
    assert len(server.calls("POST", HB)) == 3


def test_approval_flow(server: FakeServer, ctx: RunContext) -> None:
    ap_id = ctx.request_approval(
        "payments", "charge", {"amount": 900}, "over limit", deadline_s=3600
    )
    assert ap_id == "ap1"
    assert server.bodies("POST", f"/runs/{RUN}/approvals") == [
        {
            "fencing_token": TOKEN,
            "tool": "payments",
            "action": "charge",
            "args": {"amount": 900},
            "reason": "over limit",
            "deadline_s": 3600,
        }
    ]
    server.on(
        "POST",
        HB,
        hb("wait", approval={"id": "ap1", "status": "pending"}),
        hb("continue", approval={"id": "ap1", "status": "approved", "decided_by": "bob"}),
    )
    ctx.refresh()
    ap = ctx.await_approval(ap_id, timeout=5, wait_s=0.01)
    assert ap.approved and ap.decided_by == "bob"


def test_approval_decision_read_from_run_when_heartbeat_lacks_it(
    server: FakeServer, ctx: RunContext
) -> None:
    server.on("POST", HB, hb("continue"))
    server.on(
        "GET",
        f"/runs/{RUN}",
        (
            200,
            {"id": RUN, "approvals": [{"id": "ap1", "status": "rejected", "reason": "too pricey"}]},
        ),
    )
    ap = ctx.await_approval("ap1", timeout=5, wait_s=0.01)
    assert (ap.status, ap.approved, ap.reason) == ("rejected", False, "too pricey")


def test_await_approval_times_out_pending(server: FakeServer, ctx: RunContext) -> None:
    server.on("POST", HB, hb("wait"))
    ctx.refresh()
    ap = ctx.await_approval("ap1", timeout=0.1, wait_s=0.02)
    assert ap.pending


def test_await_approval_returns_on_cancel_and_next_boundary_raises(
    server: FakeServer, ctx: RunContext
) -> None:
    server.on("POST", HB, hb("cancel", "operator cancelled"))
    server.on(
        "GET", f"/runs/{RUN}", (200, {"id": RUN, "approvals": [{"id": "ap1", "status": "pending"}]})
    )
    ctx.refresh()
    assert ctx.await_approval("ap1", timeout=5, wait_s=0.01).pending
    with pytest.raises(CancelRequested):
        ctx.check_directive()


def test_checkpoint_assumption_timer_event_payloads(server: FakeServer, ctx: RunContext) -> None:
    assert ctx.checkpoint("reserve", {"reservation": "rs_1"}) == 1
    assert server.bodies("POST", f"/runs/{RUN}/checkpoints") == [
        {"fencing_token": TOKEN, "step": "reserve", "state": {"reservation": "rs_1"}}
    ]
    assert ctx.state == {"reservation": "rs_1"} and ctx.last_checkpoint_seq == 1
    ctx.record_assumption(
        "price:sku-1", 19.99, max_age_s=600, checker="inventory.price", meta={"sku": "sku-1"}
    )
    fire_at = ctx.set_timer("payment-deadline", in_s=60)
    ctx.set_timer("fixed", "2030-01-01T00:00:00+00:00")
    ctx.event("message", {"text": "hello"})
    evs = [e for b in server.bodies("POST", EVENTS) for e in b["events"]]
    assert evs[0]["kind"] == "assumption"
    assert {k: evs[0]["data"][k] for k in ("key", "value", "max_age_s", "checker", "meta")} == {
        "key": "price:sku-1",
        "value": 19.99,
        "max_age_s": 600,
        "checker": "inventory.price",
        "meta": {"sku": "sku-1"},
    }
    assert evs[1] == {"kind": "timer_set", "data": {"name": "payment-deadline", "fire_at": fire_at}}
    assert evs[2] == {
        "kind": "timer_set",
        "data": {"name": "fixed", "fire_at": "2030-01-01T00:00:00+00:00"},
    }
    assert evs[3] == {"kind": "message", "data": {"text": "hello"}}
    with pytest.raises(ValueError):
        ctx.set_timer("neither")


def test_finish_stops_heartbeat(server: FakeServer, client) -> None:
    ctx = Worker(client, "w", "a", heartbeat_interval=0.01).claim(RUN)
    ctx.finish("failed", failure_class="timeout", error="world slow")
    assert server.bodies("POST", f"/runs/{RUN}/finish") == [
        {
            "fencing_token": TOKEN,
            "outcome": "failed",
            "failure_class": "timeout",
            "error": "world slow",
        }
    ]
    assert ctx.finished and ctx._thread is None


def test_fired_timers_are_collected_from_heartbeats(server: FakeServer, ctx: RunContext) -> None:
    server.on(
        "POST",
        HB,
        hb("continue", timers_fired=[{"name": "payment-deadline", "fired_at": "t1"}]),
        hb("continue", timers_fired=[]),
    )
    ctx.refresh()
    ctx.refresh()
    assert ctx.pop_fired_timers() == [{"name": "payment-deadline", "fired_at": "t1"}]
    assert ctx.pop_fired_timers() == []


def test_step_is_also_a_decorator(server: FakeServer, ctx: RunContext) -> None:
    @ctx.step("reserve")
    def reserve(sku: str) -> str:
        assert ctx.current_step == "reserve"
        return f"res-{sku}"

    assert reserve("sku-1") == "res-sku-1" and reserve("sku-2") == "res-sku-2"
    kinds = [e["kind"] for b in server.bodies("POST", EVENTS) for e in b["events"]]
    assert kinds == ["step_started", "step_completed"] * 2  # a boundary on every call
    server.on("POST", HB, hb("pause"))
    with pytest.raises(PauseRequested):
        reserve("sku-3")
