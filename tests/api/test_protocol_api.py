"""The worker protocol over HTTP: long-poll heartbeats on the real ASGI path, tokens, scoping, the
management commands that issue them, and the facts a worker may always report."""

from __future__ import annotations

import io
import json
import threading
import time

import pytest
from asgiref.sync import async_to_sync
from django.core.management import CommandError, call_command
from django.db import connection, transaction
from django.test import AsyncClient, Client

from audit.models import AuditEvent
from core.actors import Actor, system_actor
from runs.models import Agent, ApiToken, Effect, ExecutionLease, Run
from runs.services import lifecycle, records
from runs.services.decisions import apply_transition, lock_run
from runs.states import Event
from tests.conftest import Api, claim, declare, start_run

SYSTEM = system_actor("test")


def _move(run_id: str, *events: Event) -> None:
    """An operator move along the table (the interventions that make them are built elsewhere)."""
    with transaction.atomic():
        run = lock_run(run_id)
        for event in events:
            apply_transition(run, event, actor=SYSTEM, reason=f"test: {event.value}")


def _last_line(command: str, *args) -> str:
    out = io.StringIO()
    call_command(command, *args, stdout=out)
    return out.getvalue().strip().splitlines()[-1]


# --- heartbeat long-poll, through the ASGI handler -------------------------------------------------


def _heartbeat_over_asgi(token: str, lease_id: str, body: dict) -> tuple[int, dict, float]:
    async def call():
        started = time.monotonic()
        resp = await AsyncClient().post(
            f"/api/v1/leases/{lease_id}/heartbeat",
            data=json.dumps(body),
            content_type="application/json",
            headers={"Authorization": f"Bearer {token}"},
        )
        return resp.status_code, json.loads(resp.content), time.monotonic() - started

    return async_to_sync(call)()


def _later(delay_s: float, change) -> threading.Thread:
    """Change the run from another thread (its own connection, committed) after ``delay_s``."""

    def body():
        try:
            time.sleep(delay_s)
            change()
        finally:
            connection.close()

    thread = threading.Thread(target=body, name="state-changer")
    thread.start()
    return thread


@pytest.mark.django_db(transaction=True)
def test_long_poll_heartbeat_returns_as_soon_as_the_directive_changes(
    postgres_only, worker, worker_token
):
    run = start_run(worker)
    c = claim(worker, run["id"])
    actor = Actor(kind="worker", name="worker-1", role="worker")
    changer = _later(
        1.0,
        lambda: records.request_approval(
            actor=actor, run_id=run["id"], fencing_token=1, tool="payments", action="charge"
        ),
    )
    status, body, elapsed = _heartbeat_over_asgi(
        worker_token, c["lease"]["id"], {"fencing_token": 1, "wait_s": 20}
    )
    changer.join(timeout=10)
    assert status == 200, body
    assert body["directive"] == "wait" and body["state"] == "awaiting_approval"
    assert body["approval"]["status"] == "pending"
    # it waited for the change (made after 1 s) and answered well before wait_s
    assert 0.9 <= elapsed < 5, elapsed


@pytest.mark.django_db(transaction=True)
def test_long_poll_heartbeat_wakes_on_a_pause(postgres_only, worker, worker_token):
    run = start_run(worker)
    c = claim(worker, run["id"])
    changer = _later(0.5, lambda: _move(run["id"], Event.PAUSE))
    status, body, elapsed = _heartbeat_over_asgi(
        worker_token, c["lease"]["id"], {"fencing_token": 1, "wait_s": 20}
    )
    changer.join(timeout=10)
    assert status == 200 and body["directive"] == "pause" and body["reason"] == "test: pause"
    assert elapsed < 5, elapsed


@pytest.mark.django_db(transaction=True)
def test_long_poll_heartbeat_without_a_change_returns_after_wait_s(
    postgres_only, worker, worker_token, monkeypatch
):
    import api.runs

    reads = []
    real_run_state = api.runs._run_state
    monkeypatch.setattr(
        api.runs, "_run_state", lambda run_id: reads.append(run_id) or real_run_state(run_id)
    )
    run = start_run(worker)
    c = claim(worker, run["id"])
    status, body, elapsed = _heartbeat_over_asgi(
        worker_token, c["lease"]["id"], {"fencing_token": 1, "wait_s": 1}
    )
    assert status == 200 and body["directive"] == "continue"
    assert 0.9 <= elapsed < 5, elapsed
    # woken by NOTIFY, not by polling: no state re-reads at all (the final beat reads it)
    assert reads == [], reads
    # the heartbeat kept the lease: expiry moved forward, counted twice (before and after the wait)
    lease = ExecutionLease.objects.get(pk=c["lease"]["id"])
    assert lease.heartbeats == 2 and lease.expires_at.isoformat() >= c["lease"]["expires_at"]


@pytest.mark.django_db(transaction=True)
def test_long_poll_heartbeat_keeps_waiting_through_a_wake_up_that_changed_nothing(
    postgres_only, worker, worker_token
):
    from django.db import transaction

    from runs.models import Run
    from runs.services.decisions import notify_run_changed

    run = start_run(worker)
    c = claim(worker, run["id"])

    def spurious_then_pause():
        with transaction.atomic():  # what a late outcome does: NOTIFY, directive unchanged
            notify_run_changed(Run.objects.get(pk=run["id"]))
        time.sleep(0.7)
        _move(run["id"], Event.PAUSE)

    changer = _later(0.3, spurious_then_pause)
    status, body, elapsed = _heartbeat_over_asgi(
        worker_token, c["lease"]["id"], {"fencing_token": 1, "wait_s": 20}
    )
    changer.join(timeout=10)
    assert status == 200 and body["directive"] == "pause", body
    assert 0.9 <= elapsed < 5, elapsed  # not answered at the spurious wake-up (0.3 s)
    # one beat, on arrival: the wake-ups read the directive (api.runs, selectors.woken_directive)
    assert ExecutionLease.objects.get(pk=c["lease"]["id"]).heartbeats == 1


@pytest.mark.django_db(transaction=True)
def test_a_woken_long_poll_whose_lease_was_fenced_meanwhile_answers_lease_lost(
    postgres_only, worker, worker_token
):
    from django.db import transaction

    from runs.models import Run
    from runs.services.decisions import notify_run_changed

    run = start_run(worker)
    c = claim(worker, run["id"])

    def fence():
        with transaction.atomic():  # the lease runs out meanwhile (as the expiry scan would see it)
            ExecutionLease.objects.filter(pk=c["lease"]["id"]).update(
                expires_at="2000-01-01T00:00:00Z"
            )
            notify_run_changed(Run.objects.get(pk=run["id"]))

    changer = _later(0.3, fence)
    status, body, elapsed = _heartbeat_over_asgi(
        worker_token, c["lease"]["id"], {"fencing_token": 1, "wait_s": 20}
    )
    changer.join(timeout=10)
    assert status == 409 and body["error"] == "lease_lost", body
    assert elapsed < 5


@pytest.mark.django_db(transaction=True)
def test_long_poll_heartbeat_answers_at_once_when_the_directive_is_not_continue(
    postgres_only, worker, worker_token
):
    run = start_run(worker)
    c = claim(worker, run["id"])
    _move(run["id"], Event.CANCEL)
    status, body, elapsed = _heartbeat_over_asgi(
        worker_token, c["lease"]["id"], {"fencing_token": 1, "wait_s": 20}
    )
    assert status == 200 and body["directive"] == "cancel"
    assert elapsed < 5


@pytest.mark.django_db(transaction=True)
def test_long_poll_heartbeat_with_a_stale_token_is_409_not_a_wait(
    postgres_only, worker, worker_token
):
    run = start_run(worker)
    c = claim(worker, run["id"])
    status, body, elapsed = _heartbeat_over_asgi(
        worker_token, c["lease"]["id"], {"fencing_token": 0, "wait_s": 20}
    )
    assert status == 409 and body["error"] == "lease_lost" and elapsed < 5


# --- tokens ------------------------------------------------------------------------------------------

pytestmark_db = pytest.mark.django_db


@pytestmark_db
def test_tokens_are_stored_hashed_with_a_visible_prefix(worker_token, cast):
    secrets = [worker_token] + [secret for _, secret in cast.values()]
    with connection.cursor() as cur:
        cur.execute("SELECT row_to_json(t)::text FROM runs_apitoken t")
        dump = "\n".join(row[0] for row in cur.fetchall())
    for secret in secrets:
        assert secret not in dump
        row = ApiToken.objects.get(token_hash=ApiToken.hash_secret(secret))
        assert row.prefix == secret[: ApiToken.PREFIX_LEN] and len(row.token_hash) == 64
    assert ApiToken.objects.get(token_hash=ApiToken.hash_secret(worker_token)).prefix.startswith(
        "cpw_"
    )


@pytestmark_db
def test_a_revoked_token_is_401(worker, worker_token):
    assert worker.get("/runs").status_code == 200
    prefix = worker_token[: ApiToken.PREFIX_LEN]
    call_command("revoke_token", prefix, stdout=io.StringIO())
    resp = worker.get("/runs")
    assert resp.status_code == 401 and resp.json()["error"] == "unauthenticated"
    assert worker.post("/runs", {"agent": "purchasing", "goal": "g"}).status_code == 401


@pytestmark_db
def test_a_made_up_token_is_401(client):
    resp = Api(client, "cpw_not-a-real-token").get("/runs")
    assert resp.status_code == 401 and resp.json()["error"] == "unauthenticated"


@pytestmark_db
def test_a_worker_token_scoped_to_another_agent_cannot_see_or_touch_the_run(worker):
    run = start_run(worker)
    Agent.objects.create(name="support", allowed_scopes=["notifications:*"])
    _, secret = ApiToken.issue(kind=ApiToken.WORKER, name="support-worker", agents=["support"])
    other = Api(Client(), secret)
    assert other.get(f"/runs/{run['id']}").status_code == 404
    assert other.get(f"/runs/{run['id']}/effects").status_code == 404
    assert run["id"] not in {r["id"] for r in other.get("/runs").json()["runs"]}
    resp = other.post(f"/runs/{run['id']}/claim", {"worker": "sneaky"})
    assert resp.status_code == 404 and resp.json()["error"] == "not_found"
    assert other.post("/runs", {"agent": "purchasing", "goal": "g"}).status_code == 403
    # and the real owner's lease cannot be driven by it either
    c = claim(worker, run["id"])
    assert (
        other.post(f"/leases/{c['lease']['id']}/heartbeat", {"fencing_token": 1}).status_code == 404
    )
    effect = declare(worker, run["id"], 1).json()
    assert (
        other.post(
            f"/effects/{effect['id']}/outcome", {"fencing_token": 1, "status": "committed"}
        ).status_code
        == 404
    )
    assert Effect.objects.get(pk=effect["id"]).status == "in_flight"


@pytestmark_db
def test_a_worker_token_never_reaches_an_operator_endpoint(worker, cast):
    run = start_run(worker)
    for path in ("/audit", "/audit/verify"):
        resp = worker.get(path)
        assert resp.status_code == 403 and resp.json()["error"] == "forbidden", path
    resp = worker.post(
        f"/runs/{run['id']}/interventions",
        {"kind": "pause", "reason": "worker tries", "scope": "run"},
    )
    assert resp.status_code in (403, 404)  # 404 while the interventions API is not mounted
    assert Run.objects.get(pk=run["id"]).state == "queued"
    # the refusals are denied calls, audited with the reason
    denied = AuditEvent.objects.filter(actor="worker-1", outcome="denied", action="api.denied")
    assert {e.object_id for e in denied} >= {"/api/v1/audit", "/api/v1/audit/verify"}
    assert all(e.reason.startswith("forbidden:") for e in denied)


@pytestmark_db
def test_an_operator_token_cannot_make_worker_protocol_writes(worker, cast):
    run = start_run(worker)
    ada = Api(Client(), cast["ada"][1])
    resp = ada.post(f"/runs/{run['id']}/claim", {"worker": "ada"})
    assert resp.status_code == 403 and resp.json()["error"] == "forbidden"
    assert Run.objects.get(pk=run["id"]).state == "queued"
    assert AuditEvent.objects.filter(actor="ada", outcome="denied", action="api.denied").exists()
    # a viewer may read but not start runs
    vera = Api(Client(), cast["vera"][1])
    assert vera.get(f"/runs/{run['id']}").status_code == 200
    assert vera.post("/runs", {"agent": "purchasing", "goal": "g"}).status_code == 403


# --- management commands that issue tokens and register agents ---------------------------------------


@pytestmark_db
def test_create_worker_token_prints_a_working_token_as_the_last_line(agent):
    secret = _last_line("create_worker_token", "worker-9", "--agent", "purchasing")
    row = ApiToken.objects.get(token_hash=ApiToken.hash_secret(secret))
    assert row.kind == "worker" and row.name == "worker-9" and row.agents == ["purchasing"]
    api = Api(Client(), secret)
    run = start_run(api)
    assert claim(api, run["id"], "worker-9")["lease"]["fencing_token"] == 1


@pytestmark_db
def test_create_worker_token_without_agent_may_act_for_any_agent(agent):
    Agent.objects.create(name="support", allowed_scopes=[])
    api = Api(Client(), _last_line("create_worker_token", "any-worker"))
    assert api.post("/runs", {"agent": "support", "goal": "g"}).status_code == 201
    assert api.post("/runs", {"agent": "purchasing", "goal": "g"}).status_code == 201
    with pytest.raises(CommandError, match="unknown agent"):
        call_command("create_worker_token", "w", "--agent", "nobody", stdout=io.StringIO())


@pytestmark_db
def test_create_api_token_prints_a_working_operator_token_as_the_last_line(cast):
    secret = _last_line("create_api_token", "vera")
    row = ApiToken.objects.get(token_hash=ApiToken.hash_secret(secret))
    assert row.kind == "operator" and row.user.username == "vera"
    api = Api(Client(), secret)
    assert api.get("/audit").status_code == 200  # a viewer reads the audit trail
    assert (
        api.post("/runs/00000000-0000-0000-0000-000000000000/claim", {"worker": "vera"}).status_code
        == 403
    )
    with pytest.raises(CommandError, match="no user"):
        call_command("create_api_token", "nobody", stdout=io.StringIO())


@pytestmark_db
def test_register_agent_with_scopes_bounds_what_its_runs_may_hold(client):
    call_command(
        "register_agent",
        "billing",
        "--scope",
        "payments:charge",
        "--scope",
        "ledger:*",
        stdout=io.StringIO(),
    )
    assert Agent.objects.get(name="billing").allowed_scopes == ["payments:charge", "ledger:*"]
    api = Api(client, _last_line("create_worker_token", "billing-worker", "--agent", "billing"))
    ok = api.post(
        "/runs",
        {
            "agent": "billing",
            "goal": "g",
            "authority": [{"scope": "payments:charge"}, {"scope": "ledger:post"}],
        },
    )
    assert ok.status_code == 201 and {g["scope"] for g in ok.json()["authority"]} == {
        "payments:charge",
        "ledger:post",
    }
    wider = api.post(
        "/runs", {"agent": "billing", "goal": "g", "authority": [{"scope": "payments:refund"}]}
    )
    assert wider.status_code == 403 and wider.json()["error"] == "authority_not_allowed"
    # registering again updates the scopes
    call_command("register_agent", "billing", "--scope", "payments:*", stdout=io.StringIO())
    assert (
        api.post(
            "/runs", {"agent": "billing", "goal": "g", "authority": [{"scope": "payments:refund"}]}
        ).status_code
        == 201
    )
    with pytest.raises(CommandError, match="tool:action"):
        call_command("register_agent", "bad", "--scope", "payments", stdout=io.StringIO())


# --- outcomes are facts: always accepted, flagged when late or fenced out ----------------------------


@pytestmark_db
def test_outcome_is_accepted_after_a_pause_and_flagged_late(worker):
    run = start_run(worker)
    claim(worker, run["id"])
    effect = declare(worker, run["id"], 1).json()
    _move(run["id"], Event.PAUSE)
    resp = worker.post(
        f"/effects/{effect['id']}/outcome",
        {"fencing_token": 1, "status": "committed", "external_ref": "ch_1"},
    )
    assert resp.status_code == 200
    assert (resp.json()["status"], resp.json()["late"], resp.json()["stale_lease"]) == (
        "committed",
        True,
        False,
    )


@pytestmark_db
def test_outcome_is_accepted_after_cancel_from_a_released_lease_and_flagged(worker):
    run = start_run(worker)
    c = claim(worker, run["id"])
    effect = declare(worker, run["id"], 1).json()
    _move(run["id"], Event.CANCEL)
    assert (
        worker.post(f"/leases/{c['lease']['id']}/release", {"fencing_token": 1}).json()["state"]
        == "cancelled"
    )
    resp = worker.post(
        f"/effects/{effect['id']}/outcome", {"fencing_token": 1, "status": "unknown"}
    )
    assert resp.status_code == 200
    assert (resp.json()["status"], resp.json()["late"], resp.json()["stale_lease"]) == (
        "unknown",
        True,
        True,
    )
    # the fact is in the history and the audit trail
    assert AuditEvent.objects.filter(
        action="effect.outcome", object_id=effect["id"], outcome="allowed"
    ).exists()


@pytestmark_db
def test_outcome_from_a_fenced_out_worker_after_takeover_is_recorded_and_flagged(worker):
    run = start_run(worker)
    claim(worker, run["id"], "worker-a")
    effect = declare(worker, run["id"], 1).json()
    ExecutionLease.objects.filter(run_id=run["id"]).update(expires_at="2000-01-01T00:00:00Z")
    lifecycle.expire_leases(actor=SYSTEM)
    _move(run["id"], Event.RECOVER, Event.RECOVERY_REDRIVE)
    taken = claim(worker, run["id"], "worker-b")
    assert taken["lease"]["fencing_token"] == 2 and taken["attempt"]["number"] == 2
    late = worker.post(
        f"/effects/{effect['id']}/outcome",
        {"fencing_token": 1, "status": "committed", "external_ref": "ch_7"},
    )
    assert (
        late.status_code == 200
        and late.json()["stale_lease"] is True
        and late.json()["late"] is False
    )
    # the zombie's other writes stay refused
    assert declare(worker, run["id"], 1, key="other").json()["reason"] == "lease_lost"
    assert (
        worker.post(
            f"/runs/{run['id']}/finish", {"fencing_token": 1, "outcome": "succeeded"}
        ).status_code
        == 409
    )


@pytestmark_db
def test_outcome_with_a_bad_status_is_422_and_unknown_effect_is_404(worker):
    run = start_run(worker)
    claim(worker, run["id"])
    effect = declare(worker, run["id"], 1).json()
    bad = worker.post(f"/effects/{effect['id']}/outcome", {"fencing_token": 1, "status": "done"})
    assert bad.status_code == 422 and bad.json()["field"] == "status"
    missing = worker.post(
        "/effects/00000000-0000-0000-0000-000000000000/outcome", {"status": "committed"}
    )
    assert missing.status_code == 404 and missing.json()["error"] == "not_found"


# --- idempotency keys ----------------------------------------------------------------------------------


@pytestmark_db
def test_same_key_different_args_is_422_naming_the_key(worker):
    run = start_run(worker)
    claim(worker, run["id"])
    assert declare(worker, run["id"], 1, key="order-7-charge").status_code == 201
    resp = declare(worker, run["id"], 1, key="order-7-charge", args={"amount": 101})
    assert resp.status_code == 422
    assert (
        resp.json()["error"] == "idempotency_key_reused"
        and resp.json()["idempotency_key"] == "order-7-charge"
    )
    assert "order-7-charge" in resp.json()["detail"]
    assert Effect.objects.filter(run_id=run["id"]).count() == 1


@pytestmark_db
def test_the_idempotency_key_is_stable_across_attempts(worker):
    run = start_run(worker)
    claim(worker, run["id"], "worker-a")
    first = declare(worker, run["id"], 1, key="order-8-charge").json()
    worker.post(
        f"/effects/{first['id']}/outcome",
        {"fencing_token": 1, "status": "committed", "external_ref": "ch_8"},
    )
    worker.post(
        f"/runs/{run['id']}/finish",
        {"fencing_token": 1, "outcome": "failed", "failure_class": "timeout"},
    )
    _move(run["id"], Event.RETRY)
    claim(worker, run["id"], "worker-b")
    again = declare(worker, run["id"], 2, key="order-8-charge")
    assert again.status_code == 200 and again.json()["decision"] == "replayed"
    assert again.json()["id"] == first["id"] and again.json()["external_ref"] == "ch_8"
    other = declare(worker, run["id"], 2, key="order-8-charge", args={"amount": 5})
    assert other.status_code == 422 and "order-8-charge" in other.json()["detail"]


# --- bad input is a 422 naming the field, never a 500 from the database --------------------------------


@pytestmark_db
def test_a_fencing_token_beyond_bigint_is_422_not_a_database_error(worker):
    run = start_run(worker)
    claim(worker, run["id"])
    resp = declare(worker, run["id"], 2**63)
    assert resp.status_code == 422 and resp.json()["field"] == "fencing_token"
    assert not Effect.objects.filter(run_id=run["id"]).exists()


@pytestmark_db
@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/claim", {"worker": "w\u0000"}, "worker"),
        (
            "/effects",
            {
                "fencing_token": 1,
                "step": "s",
                "tool": "payments",
                "action": "charge",
                "idempotency_key": "k",
                "args": {"note": "nul \u0000 inside"},
            },
            "args.note",
        ),
        (
            "/effects",
            {
                "fencing_token": 1,
                "step": "s",
                "tool": "payments",
                "action": "charge",
                "idempotency_key": "k",
                "args": {"bad\u0000key": 1},
            },
            "args",
        ),
        (
            "/checkpoints",
            {"fencing_token": 1, "step": "s", "state": {"deep": [{"x": "\u0000"}]}},
            "state.deep.0.x",
        ),
    ],
)
def test_text_postgres_cannot_store_is_422_naming_the_field(worker, path, body, field):
    run = start_run(worker)
    if path != "/claim":
        claim(worker, run["id"])
    resp = worker.post(f"/runs/{run['id']}{path}", body)
    assert resp.status_code == 422, resp.content
    assert (
        resp.json()["error"] == "invalid"
        and resp.json()["field"] == field
        and "NUL" in resp.json()["detail"]
    )


@pytestmark_db
def test_non_finite_numbers_in_json_are_422(worker):
    run = start_run(worker)
    claim(worker, run["id"])
    raw = (
        '{"fencing_token": 1, "step": "s", "tool": "payments", "action": "charge", "idempotency_key": "k", '
        '"args": {"amount": NaN}}'
    )
    resp = worker.client.post(
        f"/api/v1/runs/{run['id']}/effects",
        data=raw,
        content_type="application/json",
        **worker.headers,
    )
    assert resp.status_code == 422 and resp.json()["field"] == "args.amount"


@pytestmark_db
def test_a_query_parameter_with_a_nul_is_422(worker):
    resp = worker.get("/runs", agent="purchasing\u0000")
    assert resp.status_code == 422 and resp.json()["field"] == "agent"


@pytestmark_db
@pytest.mark.parametrize(
    ("event", "field"),
    [
        ({"kind": "timer_set", "data": {"name": "t", "in_s": 1e300}}, "events[0].data.in_s"),
        ({"kind": "timer_set", "data": {"name": "t", "in_s": -5}}, "events[0].data.in_s"),
        (
            {"kind": "timer_set", "data": {"name": "t", "fire_at": "2030-13-45T00:00:00Z"}},
            "events[0].data.fire_at",
        ),
        (
            {"kind": "assumption", "data": {"key": "price", "max_age_s": "soon"}},
            "events[0].data.max_age_s",
        ),
        (
            {"kind": "assumption", "data": {"key": "price", "max_age_s": -1}},
            "events[0].data.max_age_s",
        ),
        (
            {"kind": "assumption", "data": {"key": "price", "observed_at": "2030-02-30T00:00:00"}},
            "events[0].data.observed_at",
        ),
    ],
)
def test_worker_events_the_database_cannot_hold_are_422_naming_the_field(worker, event, field):
    run = start_run(worker)
    claim(worker, run["id"])
    resp = worker.post(f"/runs/{run['id']}/events", {"fencing_token": 1, "events": [event]})
    assert resp.status_code == 422, resp.content
    assert resp.json()["field"] == field
