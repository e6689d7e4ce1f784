"""run_agent_loop / run_one: claim, run, and end the attempt according to what happened."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

import httpx

from controlplane_sdk import RunContext, RunSummary, run_agent_loop

if TYPE_CHECKING:
    from tests.sdk.conftest import FakeServer

LEASE, TOKEN = "l1", 7  # what the fake server in conftest.py hands out
HB = f"/leases/{LEASE}/heartbeat"


def loop(client, fn, **kw) -> list[RunSummary]:
    kw.setdefault("exit_when_idle", True)
    kw.setdefault("heartbeat_interval", 60)
    return run_agent_loop(client, "purchasing", "worker-7", fn, poll_interval=0.01, **kw)


def queue_runs(server: FakeServer, *ids: str) -> None:
    server.on("GET", "/runs", (200, [{"id": i, "state": "queued"} for i in ids]), (200, []))


def test_lists_claims_runs_and_finishes_succeeded(server: FakeServer, client) -> None:
    queue_runs(server, "r1")
    seen = []

    def agent(ctx: RunContext) -> None:
        with ctx.step("reserve"), ctx.effect("inventory", "reserve") as fx:
            fx.committed(external_ref="rs_1")
        ctx.checkpoint("reserve", {"reservation": "rs_1"})
        seen.append(ctx.run_id)

    out = loop(client, agent)
    assert seen == ["r1"]
    assert [(s.run_id, s.attempt_id, s.outcome) for s in out] == [("r1", "a1", "succeeded")]
    assert server.calls("GET", "/runs")[0].params == {"agent": "purchasing", "state": "queued"}
    assert server.bodies("POST", "/runs/r1/finish") == [
        {"fencing_token": TOKEN, "outcome": "succeeded", "failure_class": "", "error": ""}
    ]


def test_skips_runs_it_cannot_claim(server: FakeServer, client) -> None:
    queue_runs(server, "r0", "r2", "r1")
    server.on("POST", "/runs/r0/claim", (409, {"error": "lease_held", "detail": "worker-2"}))
    server.on("POST", "/runs/r2/claim", (409, {"error": "not_claimable", "detail": "paused"}))
    out = loop(client, lambda ctx: None)
    assert [s.run_id for s in out] == ["r1"]
    assert (
        server.calls("POST", "/runs/r0/finish") == []
        and server.calls("POST", "/runs/r2/finish") == []
    )


def test_agent_exception_finishes_failed_with_class(server: FakeServer, client) -> None:
    queue_runs(server, "r1")

    def agent(ctx: RunContext) -> None:
        raise httpx.ReadTimeout("world slow")

    (s,) = loop(client, agent)
    assert s.outcome == "failed"
    (body,) = server.bodies("POST", "/runs/r1/finish")
    assert (body["outcome"], body["failure_class"]) == ("failed", "timeout")
    assert "ReadTimeout" in body["error"]


def test_declared_failures_log_one_line_others_a_traceback(
    server: FakeServer, client, caplog
) -> None:
    class Declared(Exception):
        failure_class = "address_invalid"

    failures = iter([Declared("address rejected"), KeyError("bug")])

    def agent(ctx: RunContext) -> None:
        raise next(failures)

    out = []
    with caplog.at_level("WARNING", logger="controlplane_sdk"):
        for run_id in ("r1", "r2"):
            queue_runs(server, run_id)
            out += loop(client, agent)
    assert [s.outcome for s in out] == ["failed", "failed"]
    records = [
        r
        for r in caplog.records
        if "failed" in r.getMessage() and r.name.startswith("controlplane_sdk")
    ]
    declared, bug = records
    assert declared.levelname == "WARNING" and declared.exc_info is None
    assert "(address_invalid): address rejected" in declared.getMessage()
    assert bug.levelname == "ERROR" and bug.exc_info is not None
    assert [
        b["failure_class"]
        for b in server.bodies("POST", "/runs/r1/finish") + server.bodies("POST", "/runs/r2/finish")
    ] == ["address_invalid", "error"]


def test_pause_at_boundary_releases_without_finishing(server: FakeServer, client) -> None:
    queue_runs(server, "r1")
    # run_one checks once before run_fn, then each step boundary checks again
    server.on(
        "POST",
        HB,
        (200, {"directive": "continue"}),
        (200, {"directive": "continue"}),
        (200, {"directive": "pause", "reason": "ops"}),
    )
    steps = []

    def agent(ctx: RunContext) -> None:
        for name in ("reserve", "label", "charge"):
            with ctx.step(name):
                steps.append(name)

    (s,) = loop(client, agent)
    assert (s.outcome, s.detail) == ("paused", "ops")
    assert steps == ["reserve"]
    assert server.calls("POST", "/runs/r1/finish") == []
    assert server.bodies("POST", f"/leases/{LEASE}/release") == [
        {"fencing_token": TOKEN, "reason": "worker stopped at a boundary on pause"}
    ]


def test_pause_tolerates_a_server_without_release(server: FakeServer, client) -> None:
    queue_runs(server, "r1")
    server.on("POST", HB, (200, {"directive": "pause"}))
    server.on("POST", f"/leases/{LEASE}/release", (404, {"error": "not_found"}))
    (s,) = loop(client, lambda ctx: None)
    assert s.outcome == "paused"


def test_cancel_is_acknowledged_by_releasing(server: FakeServer, client) -> None:
    queue_runs(server, "r1")
    server.on("POST", HB, (200, {"directive": "cancel", "reason": "customer withdrew"}))
    (s,) = loop(client, lambda ctx: None)
    assert (s.outcome, s.detail) == ("cancelled", "customer withdrew")
    assert server.bodies("POST", f"/leases/{LEASE}/release") == [
        {"fencing_token": TOKEN, "reason": "worker stopped at a boundary on cancel"}
    ]
    assert server.calls("POST", "/runs/r1/finish") == []


def test_cancel_falls_back_to_finish_failed_when_release_is_refused(
    server: FakeServer, client
) -> None:
    queue_runs(server, "r1")
    server.on("POST", HB, (200, {"directive": "cancel"}))
    server.on("POST", f"/leases/{LEASE}/release", (404, {"error": "not_found"}))
    server.on("POST", "/runs/r1/finish", (409, {"error": "conflict", "state": "cancelled"}))
    (s,) = loop(client, lambda ctx: None)
    assert s.outcome == "cancelled"  # the refusal of finish is tolerated too
    (body,) = server.bodies("POST", "/runs/r1/finish")
    assert (body["outcome"], body["failure_class"]) == ("failed", "cancelled")


def test_refused_success_with_unresolved_effects_finishes_failed(
    server: FakeServer, client
) -> None:
    queue_runs(server, "r1")
    server.on(
        "POST",
        "/runs/r1/finish",
        (409, {"error": "effects_unresolved", "detail": "in flight", "effects": ["e1"]}),
        server.default,
    )
    (s,) = loop(client, lambda ctx: None)
    assert s.outcome == "failed"
    bodies = server.bodies("POST", "/runs/r1/finish")
    assert [(b["outcome"], b["failure_class"]) for b in bodies] == [
        ("succeeded", ""),
        ("failed", "effects_unresolved"),
    ]


def test_denied_run_paused_is_handled_as_pause(server: FakeServer, client) -> None:
    queue_runs(server, "r1")
    server.on(
        "POST",
        "/runs/r1/effects",
        (409, {"error": "denied", "decision": "denied", "reason": "run_paused"}),
    )
    dispatched = []

    def agent(ctx: RunContext) -> None:
        with ctx.effect("payments", "charge", step="charge"):
            dispatched.append(1)

    (s,) = loop(client, agent)
    assert s.outcome == "paused" and dispatched == []
    assert server.calls("POST", "/runs/r1/finish") == []


def test_denied_other_reason_fails_the_attempt(server: FakeServer, client) -> None:
    queue_runs(server, "r1")
    server.on(
        "POST",
        "/runs/r1/effects",
        (409, {"error": "denied", "decision": "denied", "reason": "authority_revoked"}),
    )

    def agent(ctx: RunContext) -> None:
        with ctx.effect("payments", "charge", step="charge"):
            pass

    (s,) = loop(client, agent)
    assert s.outcome == "failed"
    assert server.bodies("POST", "/runs/r1/finish")[0]["failure_class"] == "effect_denied"


def test_lease_lost_stops_without_writing(server: FakeServer, client) -> None:
    queue_runs(server, "r1")
    server.on("POST", HB, (409, {"error": "lease_lost", "detail": "fenced"}))
    (s,) = loop(client, lambda ctx: None)
    assert s.outcome == "lease_lost"
    assert server.calls("POST", "/runs/r1/finish") == []
    assert server.calls("POST", f"/leases/{LEASE}/release") == []


def test_agent_may_finish_itself(server: FakeServer, client) -> None:
    queue_runs(server, "r1")
    (s,) = loop(
        client, lambda ctx: ctx.finish("failed", failure_class="business_rule", error="no stock")
    )
    assert s.outcome == "succeeded"  # run_fn returned normally; the loop does not finish twice
    assert len(server.calls("POST", "/runs/r1/finish")) == 1


def test_loop_survives_an_unreachable_server_and_stops_on_event(server: FakeServer, client) -> None:
    server.on("GET", "/runs", httpx.ConnectError("down"))
    stop = threading.Event()
    timer = threading.Timer(0.1, stop.set)
    timer.start()
    out = run_agent_loop(
        client, "purchasing", "w", lambda ctx: None, poll_interval=0.01, stop_event=stop
    )
    timer.join()
    assert out == [] and len(server.calls("GET", "/runs")) >= 2


def test_max_runs(server: FakeServer, client) -> None:
    server.on("GET", "/runs", (200, [{"id": "r1"}]))
    out = loop(client, lambda ctx: None, max_runs=2, exit_when_idle=False)
    assert [s.run_id for s in out] == ["r1", "r1"]


def test_the_loop_long_polls_for_work_instead_of_listing_runs(server: FakeServer) -> None:
    from controlplane_sdk import Client

    claimed = {
        "run_id": "r9",
        "attempt": {"id": "a9", "number": 1},
        "lease": {
            "id": "l9",
            "fencing_token": 1,
            "expires_at": "2030-01-01T00:00:00Z",
            "ttl_s": 30,
        },
        "checkpoint": None,
        "directive": "continue",
    }
    server.on("POST", "/work/claim", (200, {"claim": claimed}), (200, {"claim": None}))
    client = Client("http://cp.test", "t", transport=httpx.MockTransport(server.handler))
    ran: list[str] = []
    summaries = run_agent_loop(
        client, "purchasing", "w", lambda ctx: ran.append(ctx.run_id), exit_when_idle=True
    )
    assert ran == ["r9"] and [s.outcome for s in summaries] == ["succeeded"]
    asks = server.bodies("POST", "/work/claim")
    assert asks[0]["agents"] == ["purchasing"] and asks[0]["worker"] == "w"
    assert server.calls("GET", "/runs") == []  # no list polling
