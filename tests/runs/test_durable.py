"""Each decision is its own transaction: opened inside someone else's, it refuses to start (Django's
durable atomic) instead of quietly becoming a savepoint whose locks and audit row commit later."""

from __future__ import annotations

import pytest
from django.db import transaction

from core.actors import system_actor
from interventions.base import issue
from interventions.plugins import Request
from runs.models import Run
from runs.services import lifecycle
from tests.conftest import start_run

pytestmark = pytest.mark.django_db


def test_a_worker_decision_inside_an_open_transaction_is_refused(worker):
    run = start_run(worker)
    with pytest.raises(RuntimeError, match="durable"), transaction.atomic():
        lifecycle.claim_run(actor=system_actor("test"), run_id=run["id"], worker="w-1")
    assert Run.objects.get(pk=run["id"]).state == "queued"


def test_an_intervention_inside_an_open_transaction_is_refused(worker):
    run = start_run(worker)
    req = Request(kind="pause", reason="nested")
    with pytest.raises(RuntimeError, match="durable"), transaction.atomic():
        issue(actor=system_actor("test"), run_id=run["id"], req=req, policy="test")
    assert Run.objects.get(pk=run["id"]).state == "queued"


def test_a_decision_on_its_own_commits(worker):
    run = start_run(worker)
    lifecycle.claim_run(actor=system_actor("test"), run_id=run["id"], worker="w-1")
    assert Run.objects.get(pk=run["id"]).state == "running"
