"""Pause, resume with revalidation, cancel, retry and reconcile through the API."""

from __future__ import annotations

import pytest

from audit.models import AuditEvent
from interventions.models import Intervention
from interventions.resume import revalidate_run
from runs.models import Agent, Effect, Run
from tests.conftest import declare, start_run
from tests.interventions.helpers import commit, intervene, running_run

pytestmark = pytest.mark.django_db


def test_pause_denies_new_effects_but_records_inflight_outcome(worker, as_user):
    otto = as_user("otto")
    run, c = running_run(worker)
    charge = declare(worker, run["id"], 1).json()
    resp = intervene(otto, run["id"], "pause", "assumptions stale")
    assert resp.status_code == 202, resp.content
    receipt = resp.json()["receipt"]
    assert receipt["state"] == "pausing"
    assert [e["idempotency_key"] for e in receipt["in_flight_effects"]] == ["order-42-charge"]
    assert "may still complete" in receipt["in_flight_effects"][0]["note"]
    assert {g["scope"] for g in receipt["authority"]} == {"inventory:*", "payments:charge"}
    denied = declare(
        worker, run["id"], 1, key="order-42-reserve", tool="inventory", action="reserve"
    )
    assert denied.status_code == 409 and denied.json()["reason"] == "run_paused"
    late = worker.post(
        f"/effects/{charge['id']}/outcome",
        {"fencing_token": 1, "status": "committed", "external_ref": "ch_1"},
    )
    assert late.status_code == 200 and late.json()["late"] is True
    beat = worker.post(f"/leases/{c['lease']['id']}/heartbeat", {"fencing_token": 1})
    assert beat.json()["directive"] == "pause"
    rel = worker.post(
        f"/leases/{c['lease']['id']}/release", {"fencing_token": 1, "reason": "paused at boundary"}
    )
    assert rel.json()["state"] == "paused"
    audit = AuditEvent.objects.get(action="intervention.pause")
    assert audit.actor == "otto" and audit.reason == "assumptions stale"


def test_pause_with_nothing_in_flight_is_immediate_and_releases_the_lease(worker, as_user):
    run, c = running_run(worker)
    resp = intervene(as_user("otto"), run["id"], "pause")
    assert resp.json()["receipt"]["state"] == "paused"
    beat = worker.post(f"/leases/{c['lease']['id']}/heartbeat", {"fencing_token": 1})
    assert (
        beat.status_code == 200
        and beat.json()["directive"] == "pause"
        and beat.json()["lease_status"] == "released"
    )


def test_pause_lists_children_with_scope_both_ways(worker, as_user):
    otto = as_user("otto")
    parent, _ = running_run(worker)
    child = start_run(
        worker, parent_run_id=parent["id"], authority=[{"scope": "payments:charge", "ttl_s": 60}]
    )
    preview = otto.post(
        f"/runs/{parent['id']}/interventions/preview",
        {"kind": "pause", "reason": "x", "scope": "run"},
    ).json()
    assert (
        preview["children"][0]["id"] == child["id"] and preview["children"][0]["in_scope"] is False
    )
    resp = intervene(otto, parent["id"], "pause", scope="tree")
    assert resp.status_code == 202
    assert Run.objects.get(pk=child["id"]).state == "paused"


def test_resume_is_blocked_by_a_version_change_until_overridden(worker, as_user):
    otto, ian = as_user("otto"), as_user("ian")
    run, _ = running_run(worker)
    commit(
        worker, run["id"], 1, "order-42-reserve", tool="inventory", action="reserve", step="reserve"
    )
    worker.post(
        f"/runs/{run['id']}/checkpoints",
        {"fencing_token": 1, "step": "reserve", "state": {"reserved": True}},
    )
    intervene(otto, run["id"], "pause")
    Agent.objects.filter(name="purchasing").update(
        current_versions={
            "code": "1.0.0",
            "model": "m-1",
            "tools": {"payments": "3.2"},
            "config_hash": "abc",
        }
    )
    resp = intervene(otto, run["id"], "resume", "world checked")
    assert resp.status_code == 202 and resp.json()["status"] == "pending"
    revalidate_run(resp.json()["id"])
    blocked = Intervention.objects.get(pk=resp.json()["id"])
    report = blocked.receipt["job"]["report"]
    assert blocked.status == "failed" and "versions" in report["failing"]
    versions = next(c for c in report["checks"] if c["name"] == "versions")
    assert versions["details"]["diff"] == [{"name": "tools.payments", "then": "3.1", "now": "3.2"}]
    boundary = next(c for c in report["checks"] if c["name"] == "boundary")
    assert boundary["details"]["seq"] == 1
    assert Run.objects.get(pk=run["id"]).state == "paused"
    # An operator may not override; an incident commander may, with a reason.
    denied = intervene(otto, run["id"], "resume", override_reason="ship it")
    assert denied.status_code == 403
    ok = intervene(
        ian,
        run["id"],
        "resume",
        "tool bump is compatible",
        override_reason="payments 3.2 is backwards compatible",
    )
    revalidate_run(ok.json()["id"])
    assert Run.objects.get(pk=run["id"]).state == "queued"
    again = worker.post(f"/runs/{run['id']}/claim", {"worker": "w2"}).json()
    assert again["attempt"]["number"] == 2 and again["checkpoint"]["seq"] == 1
    replay = declare(
        worker,
        run["id"],
        again["lease"]["fencing_token"],
        key="order-42-reserve",
        tool="inventory",
        action="reserve",
        step="reserve",
    )
    assert replay.json()["decision"] == "replayed"
    assert (
        Effect.objects.filter(
            run_id=run["id"], idempotency_key="order-42-reserve", decision="authorized"
        ).count()
        == 1
    )


def test_cancel_keeps_committed_effects_committed(worker, as_user):
    run, c = running_run(worker)
    commit(
        worker,
        run["id"],
        1,
        "order-42-reserve",
        tool="inventory",
        action="reserve",
        step="reserve",
        compensation={"tool": "inventory", "action": "release"},
    )
    resp = intervene(as_user("otto"), run["id"], "cancel", "customer withdrew")
    receipt = resp.json()["receipt"]
    assert receipt["state"] == "cancelling"
    assert receipt["committed_effects"][0]["idempotency_key"] == "order-42-reserve"
    assert receipt["committed_effects"][0]["compensation"]["action"] == "release"
    denied = declare(worker, run["id"], 1, key="order-42-label", tool="inventory", action="reserve")
    assert denied.json()["reason"] == "run_cancelled"
    worker.post(f"/leases/{c['lease']['id']}/release", {"fencing_token": 1})
    assert Run.objects.get(pk=run["id"]).state == "cancelled"
    assert Effect.objects.get(idempotency_key="order-42-reserve").status == "committed"


def test_retry_is_refused_until_the_unknown_effect_is_reconciled(worker, as_user):
    otto = as_user("otto")
    run, _ = running_run(worker, retry_policy={"backoff_s": 0})
    effect = declare(worker, run["id"], 1).json()
    worker.post(f"/effects/{effect['id']}/outcome", {"fencing_token": 1, "status": "unknown"})
    worker.post(
        f"/runs/{run['id']}/finish",
        {"fencing_token": 1, "outcome": "failed", "failure_class": "timeout"},
    )
    refused = intervene(otto, run["id"], "retry")
    assert refused.status_code == 409 and refused.json()["error"] == "effects_unresolved"
    assert AuditEvent.objects.filter(action="intervention.retry", outcome="denied").exists()
    rec = otto.post(
        f"/effects/{effect['id']}/reconcile",
        {
            "outcome": "committed",
            "evidence": "payments console shows ch_7",
            "external_ref": "ch_7",
            "reason": "checked by hand",
        },
    )
    assert rec.status_code == 200 and rec.json()["reconciled"] is True
    ok = intervene(otto, run["id"], "retry")
    assert ok.status_code == 202 and ok.json()["receipt"]["next_attempt"] == 2
    c2 = worker.post(f"/runs/{run['id']}/claim", {"worker": "w2"}).json()
    assert c2["attempt"]["number"] == 2
    replay = declare(worker, run["id"], c2["lease"]["fencing_token"])
    assert replay.json()["decision"] == "replayed" and replay.json()["external_ref"] == "ch_7"


def test_intervention_needs_a_reason_and_a_valid_state(worker, as_user):
    run, _ = running_run(worker)
    assert intervene(as_user("otto"), run["id"], "pause", reason="").status_code == 422
    conflict = intervene(as_user("otto"), run["id"], "resume")
    assert conflict.status_code == 409 and conflict.json()["state"] == "running"


def test_contracts_document_reads_the_state_table_and_matrix(worker, as_user):
    doc = as_user("vera").get("/contracts").json()
    assert doc["contracts"]["pause"]["from_states"] == [
        "awaiting_approval",
        "needs_attention",
        "queued",
        "running",
    ]
    assert "incident_commander" in doc["contracts"]["compensate"]["may_issue"]
    assert any(r["event"] == "pause" and r["to"] == "pausing" for r in doc["state_machine"])


def test_a_rejected_action_cannot_slip_through_without_an_approval(worker, as_user):
    run, c = running_run(worker)
    req = worker.post(
        f"/runs/{run['id']}/approvals",
        {
            "fencing_token": 1,
            "tool": "payments",
            "action": "charge",
            "args": {"amount": 100},
            "reason": "big order",
        },
    ).json()
    rejected = intervene(
        as_user("april"), run["id"], "reject", "too expensive", options={"approval_id": req["id"]}
    )
    assert rejected.status_code == 202, rejected.content
    sneaky = declare(worker, run["id"], 1)
    assert sneaky.status_code == 409 and sneaky.json()["reason"] == "approval_rejected"


def test_worker_tokens_and_unknown_kinds_are_refused_and_audited(worker, as_user):
    run, _ = running_run(worker)
    resp = intervene(worker, run["id"], "pause")
    assert resp.status_code == 403
    unknown = intervene(as_user("otto"), run["id"], "explode")
    assert unknown.status_code == 422 and unknown.json()["field"] == "kind"
    assert AuditEvent.objects.filter(
        action="intervention.pause", outcome="denied", actor="worker-1"
    ).exists()
    assert AuditEvent.objects.filter(action="intervention.explode", outcome="denied").exists()
