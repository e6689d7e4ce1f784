"""A tree-scoped pause or cancel of a big tree: the request does a bounded amount of work, the
cascade job reaches the rest child by child (each in its own transaction, with history and audit),
progress is reported, receipts and previews are paged, and a job killed halfway resumes without
reaching any child twice (interventions/cascade.py, interventions/paging.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from audit.models import AuditEvent
from core.actors import system_actor
from interventions.cascade import run_cascade
from interventions.models import CascadeTarget, Intervention, Job
from runs.models import HistoryEvent, Run
from runs.services.lifecycle import create_run
from tests.conftest import place_run_in, start_run
from tests.live import ROOT, test_database_url, wait_for

CHILDREN = 200


def grow(root_id: str, n: int = CHILDREN) -> list[str]:
    """``n`` real children of the root (the service, not the API: its cost is the rows, not HTTP)."""
    actor = system_actor("test")
    return [
        str(create_run(actor=actor, agent="purchasing", goal="leaf", parent_run_id=root_id).pk)
        for _ in range(n)
    ]


def pause_tree(otto, run_id: str):
    return otto.post(
        f"/runs/{run_id}/interventions", {"kind": "pause", "reason": "stale", "scope": "tree"}
    )


def reached_once(root_id: str, kind: str, intervention_id: str) -> None:
    """Every child moved exactly once, by this cascade, with its history link and audit event."""
    children = Run.objects.filter(parent_id=root_id)
    moved = HistoryEvent.objects.filter(
        run__parent_id=root_id, kind="state_changed", data__cascade_of=intervention_id
    )
    assert moved.count() == children.count(), (moved.count(), children.count())
    assert moved.values("run_id").distinct().count() == children.count()
    audits = AuditEvent.objects.filter(action=f"run.{kind}", run_id__in=children.values("pk"))
    assert audits.count() == children.count()


@pytest.mark.django_db
def test_a_tree_pause_of_200_children_answers_bounded_and_the_job_reaches_the_rest(
    worker, as_user, settings
):
    settings.CASCADE_INLINE_CHILDREN, settings.RECEIPT_PAGE_ITEMS = 20, 50
    otto = as_user("otto")
    root = start_run(worker)
    kids = grow(root["id"])

    started = time.monotonic()
    resp = pause_tree(otto, root["id"])
    took = time.monotonic() - started
    assert resp.status_code == 202, resp.content
    body = resp.json()
    receipt = body["receipt"]
    assert body["status"] == "pending"
    assert receipt["cascade"] | {"job": None} == {
        "children": CHILDREN,
        "reached": 20,
        "changed": 20,
        "unchanged": 0,
        "status": "running",
        "job": None,
    }
    # The first page, the total, and where the rest is.
    assert len(receipt["children"]) == 50 and receipt["children_total"] == CHILDREN
    assert receipt["children_more"] == f"/api/v1/interventions/{body['id']}/children?after=50"
    assert len(resp.content) < 40_000, len(resp.content)
    assert Run.objects.filter(parent_id=root["id"], state="paused").count() == 20
    print(f"tree pause of {CHILDREN}: {took:.2f}s, {len(resp.content)} bytes")

    assert run_cascade(body["id"])["status"] == "done"
    assert set(Run.objects.filter(pk__in=kids).values_list("state", flat=True)) == {"paused"}
    reached_once(root["id"], "pause", body["id"])
    done = otto.get(f"/interventions/{body['id']}").json()
    assert done["status"] == "completed"
    assert done["receipt"]["cascade"]["reached"] == CHILDREN
    assert done["receipt"]["cascade"]["status"] == "done"
    assert AuditEvent.objects.filter(action="intervention.pause.cascaded").count() == 1
    job = Job.objects.get(kind="cascade", target_id=body["id"])
    assert job.status == Job.DONE

    page = otto.get(f"/interventions/{body['id']}/children", after=50, limit=100).json()
    assert [c["position"] for c in page["children"]] == list(range(50, 150))
    assert {c["status"] for c in page["children"]} == {"changed"}
    assert page["next"] == f"/api/v1/interventions/{body['id']}/children?after=150&limit=100"
    # A second delivery of the finished job reaches nobody again.
    assert run_cascade(body["id"]) == {"skipped": "already concluded"}
    reached_once(root["id"], "pause", body["id"])


@pytest.mark.django_db
def test_a_preview_of_a_big_tree_is_paged_and_its_digest_still_covers_the_rest(
    worker, as_user, settings
):
    settings.RECEIPT_PAGE_ITEMS = 10
    otto = as_user("otto")
    root = start_run(worker)
    kids = grow(root["id"], 30)
    ask = {"kind": "pause", "reason": "x", "scope": "tree"}
    first = otto.post(f"/runs/{root['id']}/interventions/preview", ask).json()
    assert len(first["children"]) == 10 and first["children_total"] == 30
    assert first["children_more"] == f"/api/v1/runs/{root['id']}/tree?after=10"
    tree = otto.get(f"/runs/{root['id']}/tree", after=10, limit=15).json()
    assert tree["total"] == 30 and [c["id"] for c in tree["children"]] == kids[10:25]
    assert tree["next"] == f"/api/v1/runs/{root['id']}/tree?after=25&limit=15"

    place_run_in(kids[25], "succeeded")  # past the first page
    second = otto.post(f"/runs/{root['id']}/interventions/preview", ask).json()
    assert second["children"] == first["children"] and second["digest"] != first["digest"]
    stale = otto.post(
        f"/runs/{root['id']}/interventions", ask | {"preview_digest": first["digest"]}
    )
    assert stale.status_code == 409 and "children" in stale.json()["detail"], stale.content


@pytest.mark.django_db
def test_a_tree_cancel_says_which_children_it_did_not_change_and_why(worker, as_user, settings):
    settings.CASCADE_INLINE_CHILDREN = 5
    otto = as_user("otto")
    root = start_run(worker)
    kids = grow(root["id"], 12)
    place_run_in(kids[2], "succeeded")  # reached inline
    place_run_in(kids[9], "compensating")  # reached by the job: a cascade never interrupts it
    resp = otto.post(
        f"/runs/{root['id']}/interventions", {"kind": "cancel", "reason": "x", "scope": "tree"}
    )
    assert resp.status_code == 202, resp.content
    assert resp.json()["receipt"]["cascade"]["reached"] == 5
    assert run_cascade(resp.json()["id"])["status"] == "done"
    targets = {t.run_id.hex: t for t in CascadeTarget.objects.all()}
    assert targets[kids[2].replace("-", "")].note == "cancel does not apply to a succeeded run"
    assert "not cancelled by the cascade" in targets[kids[9].replace("-", "")].note
    states = Run.objects.filter(parent_id=root["id"]).values_list("state", flat=True)
    assert sorted(states).count("cancelled") == 10


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_cascade_job_killed_halfway_resumes_and_reaches_no_child_twice(
    worker, as_user, postgres_only, tmp_path
):
    from interventions.jobs import sweep_jobs

    otto = as_user("otto")
    root = start_run(worker)
    grow(root["id"])
    resp = pause_tree(otto, root["id"])
    intervention_id = resp.json()["id"]
    reached = lambda: CascadeTarget.objects.exclude(status=CascadeTarget.PENDING).count()  # noqa: E731
    assert reached() == 20

    # The job's delivery in its own process (a Celery worker's, without the broker), SIGKILLed
    # while it is part way through the tree.
    code = (
        "import django; django.setup(); from interventions.cascade import run_cascade; "
        f"run_cascade({intervention_id!r})"
    )
    log = (tmp_path / "cascade.log").open("w")
    env = dict(
        os.environ, DATABASE_URL=test_database_url(), DJANGO_SETTINGS_MODULE="controlplane.settings"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
    )
    try:
        wait_for("the job to reach some children", lambda: reached() >= 40, 60, interval=0.02)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    at_kill = reached()
    assert at_kill < CHILDREN, "the job finished before it could be killed"
    assert Intervention.objects.get(pk=intervention_id).status == Intervention.PENDING
    job = Job.objects.get(kind="cascade", target_id=intervention_id)
    assert job.status == Job.RUNNING and job.attempts == 1

    # The killed delivery never reports back: once overdue, the sweep counts it and delivers again.
    Job.objects.filter(pk=job.pk).update(due_at=job.started_at)
    assert sweep_jobs()["delivered"] == [str(job.pk)]
    assert run_cascade(intervention_id)["status"] == "done"
    reached_once(root["id"], "pause", intervention_id)
    job.refresh_from_db()
    assert job.status == Job.DONE and job.failures == 1 and job.attempts == 2
    done = Intervention.objects.get(pk=intervention_id)
    assert done.status == Intervention.COMPLETED and done.receipt["cascade"]["reached"] == CHILDREN
    print(f"killed at {at_kill} of {CHILDREN} reached; resumed to {CHILDREN}")
    assert json.dumps(done.receipt)  # stays JSON


@pytest.mark.django_db
def test_the_console_shows_a_cascade_in_progress_and_pages_its_children(
    worker, as_user, cast, settings
):
    from django.test import Client

    settings.CASCADE_INLINE_CHILDREN, settings.RECEIPT_PAGE_ITEMS = 3, 5
    root = start_run(worker)
    grow(root["id"], 12)
    receipt = pause_tree(as_user("otto"), root["id"]).json()
    vera = Client()
    assert vera.login(username="vera", password="pw-vera")
    card = vera.get(f"/receipts/{receipt['id']}/").content.decode()
    assert "3 of 12 children reached (the rest in the background)" in card
    assert "the first 5 of 12 children" in card
    assert f'href="/receipts/{receipt["id"]}/children/?after=5"' in card
    run_page = vera.get(f"/runs/{root['id']}/").content.decode()
    assert 'data-testid="cascade-progress"' in run_page and "3 of 12 children" in run_page

    run_cascade(receipt["id"])
    rest = vera.get(f"/receipts/{receipt['id']}/children/?after=5").content.decode()
    assert "children 6–12 of 12" in rest and rest.count('data-testid="child"') == 7
    assert "12 of 12 children reached" in rest and "children-next" not in rest
    done = vera.get(f"/receipts/{receipt['id']}/").content.decode()
    assert "12 of 12 children reached" in done and "in the background" not in done
    assert 'data-testid="cascade-progress"' not in vera.get(f"/runs/{root['id']}/").content.decode()
