"""Follow-up jobs in the outbox: written with the decision, done exactly once, given up after
JOB_MAX_ATTEMPTS failures -- and a run whose job gave up lands in needs_attention, where the page
says what failed and the operator's pause, cancel and close still work.

Real processes (a flushed Redis, Redis down at commit) are in tests/e2e/test_job_outbox.py.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from audit.models import AuditEvent
from interventions import jobs
from interventions.models import Intervention, Job
from interventions.recover import run_recovery, scan_expired_leases
from interventions.resume import revalidate_run
from runs.models import ExecutionLease, HistoryEvent, Run
from tests.conftest import claim, place_run_in, start_run
from tests.interventions.helpers import intervene
from tests.interventions.test_compensate import FakeWorld, saga_run

pytestmark = pytest.mark.django_db


def recovering_run(worker) -> tuple[str, Intervention]:
    """Claimed, then the worker vanished: the beat scan orphans it and issues its recovery. It pins no
    versions, so recovery's rules reach the retry-policy check."""
    run = start_run(worker, versions={})
    claim(worker, run["id"])
    ExecutionLease.objects.filter(run_id=run["id"]).update(expires_at="2000-01-01T00:00:00Z")
    assert scan_expired_leases() == [run["id"]]
    return run["id"], Intervention.objects.get(run_id=run["id"], kind="recover")


def paused_run(worker, as_user) -> str:
    run = start_run(worker)
    assert intervene(as_user("ian"), run["id"], "pause").status_code == 202
    return run["id"]


def test_the_job_row_commits_with_the_decision_and_a_second_delivery_is_a_no_op(worker, as_user):
    run_id = paused_run(worker, as_user)
    resp = intervene(as_user("ian"), run_id, "resume")
    assert resp.status_code == 202, resp.content
    job = Job.objects.get(kind="revalidation", target_id=resp.json()["id"])
    assert resp.json()["receipt"]["job"]["id"] == str(job.pk)
    assert (job.status, job.attempts, job.run_id) == ("pending", 0, Run.objects.get(pk=run_id).pk)

    revalidate_run(resp.json()["id"])
    job.refresh_from_db()
    assert (job.status, job.attempts, job.failures) == ("done", 1, 0) and job.finished_at
    assert revalidate_run(resp.json()["id"]) == {"skipped": "already concluded"}
    job.refresh_from_db()
    assert (job.status, job.attempts) == ("done", 1)  # the duplicate did not even start
    assert HistoryEvent.objects.filter(run_id=run_id, kind="revalidation").count() == 1
    assert Run.objects.get(pk=run_id).state == "queued"


def test_a_poisoned_job_gives_up_after_max_attempts_and_the_run_needs_attention(
    worker, as_user, settings, monkeypatch
):
    settings.JOB_MAX_ATTEMPTS = 3
    run_id, recovery = recovering_run(worker)

    # A bug in the job's own code (a bad stored retry_policy used to be one; the policy reader now
    # falls back to the defaults): every delivery raises.
    def broken(run):
        raise TypeError("'<=' not supported between instances of 'int' and 'str'")

    monkeypatch.setattr("interventions.recover.retry_policy", broken)
    for attempt in (1, 2):
        assert "failed" in run_recovery(str(recovery.pk))
        job = Job.objects.get(kind="recovery", target_id=str(recovery.pk))
        assert (job.status, job.attempts, job.failures) == ("pending", attempt, attempt)
        assert "TypeError" in job.last_error
        assert Run.objects.get(pk=run_id).state == "recovering"
    run_recovery(str(recovery.pk))

    job.refresh_from_db()
    assert (job.status, job.attempts, job.failures) == ("failed", 3, 3) and job.finished_at
    run = Run.objects.get(pk=run_id)
    assert run.state == "needs_attention"
    recovery.refresh_from_db()
    assert recovery.status == "failed" and recovery.receipt["job"]["outcome"] == "gave_up"
    assert "TypeError" in recovery.receipt["job"]["error"]
    moved = HistoryEvent.objects.filter(run_id=run_id, kind="state_changed").latest("seq").data
    assert (moved["event"], moved["to"], moved["failures"]) == ("job_failed", "needs_attention", 3)
    audit = AuditEvent.objects.get(action="job.failed", object_id=str(job.pk))
    assert audit.outcome == "error" and audit.context["run_state"] == "needs_attention"
    # a later delivery (a late message, the sweep) does nothing to a job that gave up
    assert run_recovery(str(recovery.pk)) == {"skipped": "already concluded"}
    assert Job.objects.get(pk=job.pk).attempts == 3

    # The run page says what failed, how often, and the operator's exits are offered.
    page = Client()
    assert page.login(username="ian", password="pw-ian")
    html = page.get(f"/runs/{run_id}/").content.decode()
    banner = html[html.index('class="job-banner"') :][:800]
    assert "The recovery job failed" in banner and "after 3 attempts" in banner
    assert "TypeError" in banner and "needs an operator" in banner
    for kind in ("pause", "cancel", "close", "resume", "recover"):
        assert f'data-kind="{kind}"' in html, kind

    resp = intervene(as_user("ian"), run_id, "cancel", reason="recovery keeps crashing")
    assert resp.status_code == 202, resp.content
    assert Run.objects.get(pk=run_id).state == "cancelled"
    html = page.get(f"/runs/{run_id}/").content.decode()
    assert 'class="job-banner"' not in html  # the operator moved past it
    assert intervene(as_user("ian"), run_id, "close").status_code == 202


@pytest.mark.parametrize("kind", ["pause", "close"])
def test_pause_and_close_work_from_needs_attention(worker, as_user, kind):
    run_id, _ = recovering_run(worker)
    place_run_in(run_id, "needs_attention")
    resp = intervene(as_user("ian"), run_id, kind, reason="taking it from here")
    assert resp.status_code == 202, resp.content
    assert Run.objects.get(pk=run_id).state == {"pause": "paused", "close": "closed"}[kind]


def test_the_sweep_redelivers_overdue_jobs_and_counts_only_started_ones(
    worker, as_user, monkeypatch, settings
):
    settings.JOB_MAX_ATTEMPTS = 2
    sent = []
    monkeypatch.setattr(jobs, "deliver", lambda kind, target, countdown=None: sent.append(target))
    run_id = paused_run(worker, as_user)
    resume = intervene(as_user("ian"), run_id, "resume").json()
    job = Job.objects.get(target_id=resume["id"])
    assert jobs.sweep_jobs() == {"delivered": [], "failed": []}  # not due yet

    # never started (message lost, broker down): delivered again, no failure counted
    past = timezone.now() - timedelta(seconds=1)
    Job.objects.filter(pk=job.pk).update(due_at=past)
    assert jobs.sweep_jobs()["delivered"] == [str(job.pk)] and sent == [resume["id"]]
    job.refresh_from_db()
    assert (job.status, job.failures) == ("pending", 0) and job.due_at > timezone.now()

    # started and never reported back (worker killed): a failure, delivered again ...
    Job.objects.filter(pk=job.pk).update(status="running", attempts=1, due_at=past)
    assert jobs.sweep_jobs()["delivered"] == [str(job.pk)]
    job.refresh_from_db()
    assert (job.status, job.failures) == ("pending", 1) and "no result within" in job.last_error
    # ... until JOB_MAX_ATTEMPTS: then given up, and the run handed to an operator
    Job.objects.filter(pk=job.pk).update(status="running", attempts=2, due_at=past)
    assert jobs.sweep_jobs()["failed"] == [str(job.pk)]
    job.refresh_from_db()
    assert (job.status, job.failures) == ("failed", 2)
    assert Run.objects.get(pk=run_id).state == "needs_attention"
    assert Intervention.objects.get(pk=resume["id"]).status == "failed"
    assert len(sent) == 2


def test_a_failed_reconcile_job_leaves_the_run_in_its_state_with_the_banner(
    worker, as_user, monkeypatch, settings
):
    from interventions import reconcile

    settings.JOB_MAX_ATTEMPTS = 1
    run_id = paused_run(worker, as_user)
    resp = intervene(as_user("ian"), run_id, "reconcile")
    assert resp.status_code == 202, resp.content

    def broken(intervention_id):
        raise RuntimeError("reconciler registry unavailable")

    monkeypatch.setattr(reconcile, "_reconcile_all", broken)
    reconcile.reconcile_run_effects(resp.json()["id"])
    assert Job.objects.get(target_id=resp.json()["id"]).status == "failed"
    assert Run.objects.get(pk=run_id).state == "paused"  # not trapped: paused has its exits
    assert HistoryEvent.objects.filter(run_id=run_id, kind="job_failed").count() == 1
    page = Client()
    assert page.login(username="ian", password="pw-ian")
    html = page.get(f"/runs/{run_id}/").content.decode()
    assert "The reconcile job failed" in html and "reconciler registry unavailable" in html


# -- compensation: a cancel stops the plan; a job that gives up closes it ---------------------------


@pytest.fixture
def world():
    """test_compensate's fake world: compensators that record what they undid."""
    from interventions import registry

    registry.load_adapters()
    saved = dict(registry._compensators)
    fake = FakeWorld()
    for tool, action in [
        ("inventory", "reserve"),
        ("shipping", "create_label"),
        ("payments", "charge"),
    ]:
        registry.compensator(tool, action)(fake.compensate)
    yield fake
    registry._compensators.clear()
    registry._compensators.update(saved)


def test_a_cancel_during_compensation_stops_the_plan_before_its_next_step(worker, as_user, world):
    from interventions.compensate import run_compensation_plan
    from interventions.models import CompensationPlan
    from runs.integrity import verify_ledger

    run = saga_run(worker)
    resp = intervene(as_user("ian"), run["id"], "compensate", reason="order cancelled")
    assert resp.status_code == 202, resp.content
    plan_id = resp.json()["receipt"]["plan_id"]
    assert intervene(as_user("ian"), run["id"], "cancel", reason="stop undoing").status_code == 202

    outcome = run_compensation_plan(plan_id)
    assert outcome["finished"] and world.applied == {}  # no compensator was called
    plan = CompensationPlan.objects.get(pk=plan_id)
    assert plan.status == "failed"
    assert {s.status for s in plan.steps.all()} == {"failed"}
    assert all("cancelled by an operator" in s.last_error["message"] for s in plan.steps.all())
    assert Run.objects.get(pk=run["id"]).state == "cancelled"  # the plan's end does not move it
    assert verify_ledger()["ok"]


def test_a_compensation_job_that_gives_up_closes_its_plan_and_hands_the_run_over(
    worker, as_user, world, monkeypatch, settings
):
    from interventions import compensate
    from interventions.models import CompensationPlan
    from runs.integrity import verify_ledger
    from runs.models import Effect

    settings.JOB_MAX_ATTEMPTS = 2
    run = saga_run(worker)
    resp = intervene(as_user("ian"), run["id"], "compensate", reason="order cancelled")
    plan_id = resp.json()["receipt"]["plan_id"]

    def crash(claim):  # after the step's claim committed: its compensation effect is in flight
        raise RuntimeError("adapter module failed to import")

    monkeypatch.setattr(compensate, "_call_compensator", crash)
    for _ in range(2):
        # the same message delivered again (same task id): it takes its own step claim over
        out = compensate.execute_compensation_plan.apply(args=(plan_id,), task_id="m-1").get()
        assert "RuntimeError" in out["failed"]

    job = Job.objects.get(kind="compensation", target_id=plan_id)
    assert (job.status, job.failures) == ("failed", 2)
    plan = CompensationPlan.objects.get(pk=plan_id)
    assert plan.status == "failed" and plan.result["gave_up"]
    assert {s.status for s in plan.steps.all()} == {"failed"}
    # the compensation that may have been called is unknown: another plan waits for a reconcile
    [comp] = Effect.objects.filter(run_id=run["id"], kind="compensation")
    assert comp.status == "unknown"
    assert Run.objects.get(pk=run["id"]).state == "needs_attention"
    intervention = Intervention.objects.get(pk=resp.json()["id"])
    assert (
        intervention.status == "failed" and intervention.receipt["job"]["plan_status"] == "failed"
    )
    assert verify_ledger()["ok"]
    assert intervene(as_user("ian"), run["id"], "close", reason="done by hand").status_code == 202
