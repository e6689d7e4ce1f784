"""Contract claims checked against behaviour (the claims are listed in interventions/contracts.py)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from core.actors import system_actor
from interventions.contracts import contracts_document
from interventions.plugins import REGISTRY
from interventions.resume import revalidate_run
from runs.models import Timer
from runs.services.records import fire_due_timers
from runs.states import TRANSITIONS
from tests.interventions.helpers import intervene, running_run

pytestmark = pytest.mark.django_db


def test_timers_continue_during_pause_and_are_delivered_on_resume(worker, as_user):
    otto = as_user("otto")
    run, c = running_run(worker)
    worker.post(
        f"/runs/{run['id']}/events",
        {
            "fencing_token": 1,
            "events": [{"kind": "timer_set", "data": {"name": "reminder", "in_s": 3600}}],
        },
    )
    intervene(otto, run["id"], "pause", "investigating")
    Timer.objects.filter(run_id=run["id"]).update(fire_at=timezone.now() - timedelta(seconds=1))
    assert fire_due_timers(actor=system_actor("timers")) == 1
    timer = Timer.objects.get(run_id=run["id"])
    assert timer.status == "fired" and timer.fired_while == "paused"
    history = worker.get(f"/runs/{run['id']}/history").json()["events"]
    assert any(e["kind"] == "timer_fired" and e["data"]["run_state"] == "paused" for e in history)
    resume = intervene(otto, run["id"], "resume", "all clear")
    revalidate_run(resume.json()["id"])
    c2 = worker.post(f"/runs/{run['id']}/claim", {"worker": "w2"}).json()
    beat = worker.post(
        f"/leases/{c2['lease']['id']}/heartbeat", {"fencing_token": c2["lease"]["fencing_token"]}
    ).json()
    assert [t["name"] for t in beat["timers_fired"]] == ["reminder"] and beat["timers_fired"][0][
        "fired_while"
    ] == "paused"
    assert Timer.objects.get(run_id=run["id"]).status == "delivered"


def test_every_contract_names_its_roles_states_and_a_reason_requirement(as_user):
    doc = as_user("vera").get("/contracts").json()
    assert set(doc["contracts"]) == set(REGISTRY)
    for kind, spec in doc["contracts"].items():
        assert spec["reason_required"] is True
        assert spec["may_issue"], kind
        if spec["event"]:
            assert spec["from_states"] == sorted(
                s.value for s, e in TRANSITIONS.items() if spec["event"] in e
            ), kind
    assert contracts_document()["state_machine"]
