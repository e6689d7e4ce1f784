"""Operator control at the API edge: a child run only under a parent the token may act for, and the
reconcile endpoint honours decision authority exactly like the reconcile intervention."""

from __future__ import annotations

import pytest

from audit.models import AuditEvent
from runs.models import Agent, ApiToken, Effect, Run
from tests.conftest import Api, claim, declare, start_run

pytestmark = pytest.mark.django_db


def test_a_child_under_a_foreign_agents_run_is_403(client, worker):
    Agent.objects.create(name="refunds", allowed_scopes=["payments:refund"])
    _, secret = ApiToken.issue(kind=ApiToken.WORKER, name="refunds-only", agents=["refunds"])
    parent = start_run(worker)
    resp = Api(client, secret).post(
        "/runs", {"agent": "refunds", "goal": "hijack", "parent_run_id": parent["id"]}
    )
    assert resp.status_code == 403, resp.content
    assert resp.json()["error"] == "forbidden" and "parent" in resp.json()["detail"]
    assert not Run.objects.filter(parent_id=parent["id"]).exists()
    denied = AuditEvent.objects.get(action="run.create", outcome="denied")
    assert denied.context["parent_run_id"] == parent["id"]
    # The parent's own agent may still delegate.
    own = worker.post(
        "/runs", {"agent": "purchasing", "goal": "child", "parent_run_id": parent["id"]}
    )
    assert own.status_code == 201, own.content


def _unknown_effect(worker: Api, key: str) -> tuple[str, str]:
    run = start_run(worker)
    claim(worker, run["id"])
    effect = declare(worker, run["id"], 1, key=key).json()
    worker.post(f"/effects/{effect['id']}/outcome", {"fencing_token": 1, "status": "unknown"})
    return run["id"], effect["id"]


def _reconcile(api: Api, effect_id: str, **extra):
    body = {"outcome": "committed", "evidence": "provider dashboard", "reason": "checked", **extra}
    return api.post(f"/effects/{effect_id}/reconcile", body)


def test_reconcile_api_honours_decision_authority(worker, as_user, cast):
    run_id, effect_id = _unknown_effect(worker, "k-1")
    Run.objects.filter(pk=run_id).update(decision_authority=cast["otto"][0])

    olga = _reconcile(as_user("olga"), effect_id)
    assert olga.status_code == 403 and olga.json()["error"] == "not_decision_authority"
    olga_override = _reconcile(as_user("olga"), effect_id, override_reason="otto is away")
    assert olga_override.status_code == 403  # an operator may not override
    assert Effect.objects.get(pk=effect_id).status == "unknown"

    ian = _reconcile(as_user("ian"), effect_id, override_reason="incident: otto unreachable")
    assert ian.status_code == 200 and ian.json()["status"] == "committed", ian.content
    audit = AuditEvent.objects.get(action="effect.reconcile", outcome="allowed")
    assert audit.context["override"] is True and audit.context["overridden"] == "otto"

    _, other = _unknown_effect(worker, "k-2")
    Run.objects.filter(effects__pk=other).update(decision_authority=cast["otto"][0])
    assert _reconcile(as_user("otto"), other).status_code == 200
    assert _reconcile(as_user("vera"), other).status_code == 403  # a viewer never reconciles
