"""A child never does what its parent may not do now (runs/services/delegation.py): a frozen,
suspended, revoked or paused parent's worker cannot create a child delegated the capability, and so
the child's charge is never authorised. Each refusal is a 403 naming the scope, and audited."""

from __future__ import annotations

import pytest

from audit.models import AuditEvent
from runs.models import Run
from tests.conftest import declare
from tests.interventions.helpers import intervene, running_run

pytestmark = pytest.mark.django_db


def child(worker, parent_id: str, scope: str):
    return worker.post(
        "/runs",
        {
            "agent": "purchasing",
            "goal": "charge through a child",
            "parent_run_id": parent_id,
            "authority": [{"scope": scope, "ttl_s": 600}],
        },
    )


def refused(resp, scope: str, why: str) -> None:
    assert resp.status_code == 403, resp.content
    body = resp.json()
    assert body["error"] == "authority_not_allowed" and body["scope"] == scope, body
    assert why in body["detail"], body


def test_a_frozen_parent_cannot_delegate_the_frozen_capability(worker, as_user, agent):
    agent.allowed_scopes = [*agent.allowed_scopes, "payments:*"]
    agent.save()
    parent, _ = running_run(worker, authority=[{"scope": "payments:*", "ttl_s": 3600}])
    freeze = intervene(
        as_user("sam"), parent["id"], "freeze_capability", options={"scope": "payments:charge"}
    )
    assert freeze.status_code == 202, freeze.content

    refused(child(worker, parent["id"], "payments:charge"), "payments:charge", "frozen")
    # A wildcard would carry the frozen action along: refused too.
    refused(child(worker, parent["id"], "payments:*"), "payments:*", "frozen")
    assert Run.objects.count() == 1
    assert AuditEvent.objects.filter(action="run.create", outcome="denied").count() == 2
    # What the freeze leaves alone may still be handed on.
    assert child(worker, parent["id"], "payments:refund").status_code == 201

    restore = intervene(
        as_user("sam"), parent["id"], "restore_capability", options={"scope": "payments:charge"}
    )
    assert restore.status_code == 202, restore.content
    ok = child(worker, parent["id"], "payments:charge")
    assert ok.status_code == 201, ok.content


def test_a_child_made_under_a_frozen_parent_never_charges(worker, as_user):
    """The issue's exploit end to end: the child is refused, so no charge is ever authorised."""
    parent, _ = running_run(worker)
    intervene(as_user("sam"), parent["id"], "freeze_capability", options={"scope": "payments:*"})
    resp = worker.post(
        "/runs",
        {
            "agent": "purchasing",
            "goal": "g",
            "parent_run_id": parent["id"],
            "authority": [{"scope": "payments:charge"}],
        },
    )
    refused(resp, "payments:charge", "frozen")
    assert not Run.objects.exclude(pk=parent["id"]).exists()
    # ... and the parent's own charge is denied by the freeze it tried to step around.
    denied = declare(worker, parent["id"], 1, key="k-parent")
    assert denied.json().get("reason") == "capability_frozen", denied.content


@pytest.mark.parametrize("kind", ["suspend_authority", "revoke_authority"])
def test_a_suspended_or_revoked_grant_cannot_be_delegated(worker, as_user, kind):
    parent, _ = running_run(worker)
    resp = intervene(as_user("sam"), parent["id"], kind, options={"scope": "payments:charge"})
    assert resp.status_code == 202, resp.content
    refused(child(worker, parent["id"], "payments:charge"), "payments:charge", "no active grant")


def test_a_paused_parent_cannot_delegate(worker, as_user):
    parent, _ = running_run(worker)
    assert intervene(as_user("otto"), parent["id"], "pause").status_code == 202
    assert Run.objects.get(pk=parent["id"]).state == "paused"
    refused(child(worker, parent["id"], "payments:charge"), "payments:charge", "paused")
    # A child with no authority widens nothing: it may still be recorded (it can charge nothing).
    plain = worker.post(
        "/runs", {"agent": "purchasing", "goal": "g", "parent_run_id": parent["id"]}
    )
    assert plain.status_code == 201, plain.content
    assert plain.json()["authority"] == []
