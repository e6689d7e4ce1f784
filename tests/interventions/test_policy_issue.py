"""One issue path for people and for the control plane: ``base.issue(policy=...)`` skips the role and
decision-authority checks only for a system actor, and records the policy in their place."""

from __future__ import annotations

import pytest

from audit.models import AuditEvent
from core.actors import system_actor
from core.auth import actor_for_user
from core.errors import Forbidden
from interventions.base import issue
from interventions.plugins import Request
from runs.models import Run
from tests.conftest import claim, start_run

pytestmark = pytest.mark.django_db


def test_a_person_cannot_issue_by_policy_and_the_refusal_is_audited(worker, cast):
    run = start_run(worker)
    claim(worker, run["id"])
    vera = actor_for_user(cast["vera"][0])  # a viewer: may not pause
    with pytest.raises(Forbidden, match="policy"):
        issue(actor=vera, run_id=run["id"], req=Request(kind="pause", reason="x"), policy="mine")
    assert Run.objects.get(pk=run["id"]).state == "running"
    denied = AuditEvent.objects.filter(action="intervention.pause").get()
    assert denied.outcome == AuditEvent.DENIED and denied.actor == "vera"


def test_the_control_plane_issues_by_policy_with_the_same_records(worker):
    run = start_run(worker)
    claim(worker, run["id"])
    intervention = issue(
        actor=system_actor("test"),
        run_id=run["id"],
        req=Request(kind="pause", reason="policy pause"),
        policy="test policy",
    )
    assert intervention.receipt["policy"] == "test policy" and not intervention.override
    assert Run.objects.get(pk=run["id"]).state in ("pausing", "paused")
    allowed = AuditEvent.objects.filter(action="intervention.pause", outcome="allowed").get()
    assert allowed.context["policy"] == "test policy" and allowed.actor_kind == "system"
