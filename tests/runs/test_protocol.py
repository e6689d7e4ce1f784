"""The worker protocol's semantics, through the HTTP API, on the real database."""

from __future__ import annotations

import pytest

from audit.models import AuditEvent
from runs.models import Effect, Run
from tests.conftest import claim, declare, start_run

pytestmark = pytest.mark.django_db


def test_it_starts_claims_declares_records_and_finishes(worker):
    run = start_run(worker)
    assert run["state"] == "queued"
    c = claim(worker, run["id"])
    assert (
        c["attempt"]["number"] == 1
        and c["lease"]["fencing_token"] == 1
        and c["directive"] == "continue"
    )
    resp = declare(worker, run["id"], 1)
    assert (
        resp.status_code == 201
        and resp.json()["decision"] == "authorized"
        and resp.json()["status"] == "in_flight"
    )
    out = worker.post(
        f"/effects/{resp.json()['id']}/outcome",
        {"fencing_token": 1, "status": "committed", "external_ref": "ch_1"},
    )
    assert (
        out.status_code == 200
        and out.json()["status"] == "committed"
        and out.json()["late"] is False
    )
    cp = worker.post(
        f"/runs/{run['id']}/checkpoints",
        {"fencing_token": 1, "step": "charge", "state": {"charged": True}},
    )
    assert cp.status_code == 201 and cp.json()["seq"] == 1
    fin = worker.post(f"/runs/{run['id']}/finish", {"fencing_token": 1, "outcome": "succeeded"})
    assert fin.status_code == 200 and fin.json()["state"] == "succeeded"
    assert AuditEvent.objects.filter(run_id=run["id"], action="run.finish_succeeded").exists()


def test_claim_is_refused_while_a_live_lease_holds_the_run(worker):
    run = start_run(worker)
    claim(worker, run["id"])
    resp = worker.post(f"/runs/{run['id']}/claim", {"worker": "other"})
    assert resp.status_code == 409 and resp.json()["error"] == "lease_held"
    assert AuditEvent.objects.filter(action="run.claim", outcome="denied").exists()


def test_same_key_same_args_replays_and_other_args_is_422(worker):
    run = start_run(worker)
    claim(worker, run["id"])
    first = declare(worker, run["id"], 1).json()
    again = declare(worker, run["id"], 1)
    assert again.status_code == 409 and again.json()["error"] == "effect_unresolved"
    worker.post(
        f"/effects/{first['id']}/outcome",
        {"fencing_token": 1, "status": "committed", "external_ref": "ch_9"},
    )
    replay = declare(worker, run["id"], 1)
    assert (
        replay.status_code == 200
        and replay.json()["decision"] == "replayed"
        and replay.json()["external_ref"] == "ch_9"
    )
    other = declare(worker, run["id"], 1, args={"amount": 999})
    assert other.status_code == 422 and other.json()["error"] == "idempotency_key_reused"
    assert "order-42-charge" in other.json()["detail"]
    assert Effect.objects.filter(run_id=run["id"], decision="authorized").count() == 1


def test_declaration_without_a_grant_is_denied_and_recorded(worker):
    run = start_run(worker)
    claim(worker, run["id"])
    resp = declare(worker, run["id"], 1, key="ship-1", tool="shipping", action="create_label")
    assert resp.status_code == 409 and resp.json()["reason"] == "authority_missing"
    denied = Effect.objects.get(run_id=run["id"], idempotency_key="ship-1")
    assert denied.decision == "denied" and denied.status == "denied"
    assert AuditEvent.objects.filter(object_id=str(denied.pk), outcome="denied").exists()


def test_run_asking_for_more_than_the_agent_may_hold_is_403(worker):
    resp = worker.post(
        "/runs", {"agent": "purchasing", "goal": "g", "authority": [{"scope": "bank:wire"}]}
    )
    assert resp.status_code == 403 and resp.json()["error"] == "authority_not_allowed"
    assert not Run.objects.exists()


def test_stale_fencing_token_is_refused_but_its_outcome_is_recorded(worker):
    run = start_run(worker)
    claim(worker, run["id"])
    effect = declare(worker, run["id"], 1).json()
    # The lease expires; recovery requeues the run and a second worker takes over.
    from core.actors import system_actor
    from runs.models import ExecutionLease
    from runs.services.lifecycle import expire_leases

    ExecutionLease.objects.filter(run_id=run["id"]).update(expires_at="2000-01-01T00:00:00Z")
    assert expire_leases(actor=system_actor("test")) == [run["id"]]
    assert Run.objects.get(pk=run["id"]).state == "orphaned"
    zombie = declare(
        worker, run["id"], 1, key="order-42-notify", tool="notifications", action="enqueue"
    )
    assert zombie.status_code == 409 and zombie.json()["reason"] == "lease_lost"
    late = worker.post(
        f"/effects/{effect['id']}/outcome", {"fencing_token": 1, "status": "committed"}
    )
    assert late.status_code == 200 and late.json()["stale_lease"] is True


def test_child_grants_are_delegated_never_wider(worker):
    parent = start_run(worker)
    child = start_run(
        worker,
        parent_run_id=parent["id"],
        authority=[{"scope": "payments:charge", "ttl_s": 600000}],
    )
    parent_exp = next(g for g in parent["authority"] if g["scope"] == "payments:charge")[
        "expires_at"
    ]
    assert child["authority"][0]["expires_at"] <= parent_exp
    wider = worker.post(
        "/runs",
        {
            "agent": "purchasing",
            "goal": "g",
            "parent_run_id": parent["id"],
            "authority": [{"scope": "shipping:create_label"}],
        },
    )
    assert wider.status_code == 403 and wider.json()["error"] == "authority_not_allowed"


def test_bad_input_is_a_json_422_naming_the_field(worker):
    run = start_run(worker)
    resp = worker.post(f"/runs/{run['id']}/claim", {"worker": ""})
    assert (
        resp.status_code == 422
        and resp.json()["error"] == "invalid"
        and resp.json()["field"] == "worker"
    )
    resp = worker.post(f"/runs/{run['id']}/effects", {"fencing_token": "x"})
    assert resp.status_code == 422 and resp.json()["field"]


def test_unauthenticated_is_401_json(client):
    resp = client.get("/api/v1/runs")
    assert resp.status_code == 401 and resp.json()["error"] == "unauthenticated"


def test_heartbeat_returns_directive_and_extends_lease(worker):
    run = start_run(worker)
    c = claim(worker, run["id"])
    resp = worker.post(f"/leases/{c['lease']['id']}/heartbeat", {"fencing_token": 1})
    assert resp.status_code == 200 and resp.json()["directive"] == "continue"
    assert resp.json()["expires_at"] >= c["lease"]["expires_at"]
    stale = worker.post(f"/leases/{c['lease']['id']}/heartbeat", {"fencing_token": 0})
    assert stale.status_code == 409 and stale.json()["error"] == "lease_lost"
