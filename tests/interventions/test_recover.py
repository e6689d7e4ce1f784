"""Recover: an orphaned run is rebuilt from checkpoint + history, verified, reconciled with the world,
and sent on by an explicit rule whose reason is recorded. Reconcilers and compensators are fakes
registered through interventions.registry (restored afterwards)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from audit.models import AuditEvent
from core.actors import system_actor
from interventions import jobs as job_outbox
from interventions import registry
from interventions.compensate import run_compensation_plan
from interventions.models import CompensationPlan, Intervention, Job
from interventions.recover import on_orphaned, run_recovery, scan_expired_leases
from interventions.registry import CompensationResult, ReconcileResult
from runs.models import Agent, Effect, ExecutionLease, HistoryEvent, Run
from runs.services.lifecycle import expire_leases
from tests.conftest import declare, start_run

pytestmark = pytest.mark.django_db

VERSIONS = {"code": "1.0.0", "model": "m-1", "tools": {"payments": "3.1"}, "config_hash": "abc"}
AUTHORITY = [{"scope": s, "ttl_s": 3600} for s in ("inventory:*", "payments:charge")]


class FakeWorld:
    def __init__(self):
        self.committed: dict[str, str] = {}  # idempotency key -> external ref
        self.answer_unknown = False
        self.asked: list[str] = []
        self.compensated: list[str] = []
        self.voided: list[str] = []

    def reconcile(self, tool: str, action: str, key: str) -> ReconcileResult:
        self.asked.append(key)
        if self.answer_unknown:
            return ReconcileResult("unknown", evidence={"error": "unavailable"})
        if key in self.committed:
            return ReconcileResult(
                "committed", external_ref=self.committed[key], evidence={"found": True, "key": key}
            )
        return ReconcileResult("not_found", evidence={"found": False, "key": key})

    def void(self, tool: str, action: str, key: str) -> ReconcileResult:
        """By-key void: the world refuses the key from now on, unless it already committed it."""
        if self.answer_unknown:
            return ReconcileResult("unknown", evidence={"error": "unavailable"})
        if key in self.committed:
            return ReconcileResult("committed", external_ref=self.committed[key])
        self.voided.append(key)
        return ReconcileResult("failed", evidence={"voided": True, "key": key})

    def compensate(self, effect, key: str) -> CompensationResult:
        self.compensated.append(key)
        return CompensationResult(ok=True, external_ref=f"undo-{effect.idempotency_key}")


@pytest.fixture
def world():
    registry.load_adapters()
    saved = dict(registry._reconcilers), dict(registry._compensators), dict(registry._voiders)
    fake = FakeWorld()
    for tool in ("inventory", "payments"):
        registry.reconciler(tool)(fake.reconcile)
        registry.key_voider(tool)(fake.void)
    registry.compensator("inventory", "reserve")(fake.compensate)
    registry.compensator("payments", "charge")(fake.compensate)
    yield fake
    live_maps = (registry._reconcilers, registry._compensators, registry._voiders)
    for live, old in zip(live_maps, saved, strict=False):
        live.clear()
        live.update(old)


def orphaned_run(worker, world, *, versions=VERSIONS, charge_reached_world=True) -> dict:
    """reserve committed, checkpoint 1, charge dispatched -- then the worker vanished (SIGKILL)."""
    run = start_run(worker, authority=AUTHORITY, versions=VERSIONS)
    c = worker.post(f"/runs/{run['id']}/claim", {"worker": "worker-7", "versions": versions}).json()
    token = c["lease"]["fencing_token"]
    reserve = declare(
        worker,
        run["id"],
        token,
        key="order-9-reserve",
        step="reserve",
        tool="inventory",
        action="reserve",
        compensation={"tool": "inventory", "action": "release"},
    ).json()
    worker.post(
        f"/effects/{reserve['id']}/outcome",
        {"fencing_token": token, "status": "committed", "external_ref": "res-1"},
    )
    worker.post(
        f"/runs/{run['id']}/checkpoints",
        {"fencing_token": token, "step": "reserve", "state": {"reserved": "res-1"}},
    )
    worker.post(
        f"/runs/{run['id']}/events",
        {"fencing_token": token, "events": [{"kind": "step_started", "data": {"step": "charge"}}]},
    )
    assert declare(worker, run["id"], token, key="order-9-charge").status_code == 201
    if charge_reached_world:
        world.committed["order-9-charge"] = "ch_1"
    ExecutionLease.objects.filter(run_id=run["id"]).update(expires_at="2000-01-01T00:00:00Z")
    return run | {"token": token, "lease": c["lease"]}


def jobs(callbacks) -> list:
    """On-commit work other than the live-update pushes."""
    return [cb for cb in callbacks if "send_live_hints" not in cb.__qualname__]


def recover_now(run_id: str, django_capture_on_commit_callbacks) -> Intervention:
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        assert scan_expired_leases() == [run_id]  # the beat scan: orphaned, then recovery issued
    assert len(jobs(callbacks)) == 1, "the recovery job is enqueued on commit"
    intervention = Intervention.objects.get(run_id=run_id, kind="recover")
    run_recovery(str(intervention.pk))
    intervention.refresh_from_db()
    return intervention


def test_an_orphan_is_redriven_from_its_checkpoint_with_the_reason_it_is_safe(
    worker, world, django_capture_on_commit_callbacks
):
    run = orphaned_run(worker, world)
    intervention = recover_now(run["id"], django_capture_on_commit_callbacks)
    assert intervention.actor_label == "system:controlplane" and intervention.role == "system"
    assert intervention.receipt["policy"] == "automatic on lease expiry"
    job = intervention.receipt["job"]
    assert (
        intervention.status == "completed"
        and job["action"] == "redrive"
        and job["state"] == "queued"
    )
    report = job["report"]
    assert report["trigger"] == "lease_expired" and report["dead_lease"]["worker"] == "worker-7"
    assert (
        report["rebuilt"]["checkpoint"]["seq"] == 1
        and report["rebuilt"]["checkpoint"]["step"] == "reserve"
    )
    assert report["rebuilt"]["steps_to_rerun"] == ["charge"]
    [charge] = report["rebuilt"]["effects_after_checkpoint"]
    assert charge["idempotency_key"] == "order-9-charge" and charge["status"] == "committed"
    assert charge["on_redrive"].startswith("replays")
    assert report["history"]["ok"] and report["checkpoint"]["ok"] and report["versions"]["runnable"]
    assert [(r["idempotency_key"], r["outcome"]) for r in report["reconciliation"]] == [
        ("order-9-charge", "committed")
    ]
    why = job["why"]
    assert "1 reconciled" in why and "checkpoint 1" in why and "same idempotency keys" in why
    assert f"fencing token {run['token']} is refused" in why

    row = Run.objects.get(pk=run["id"])
    assert row.state == "queued" and row.resume_checkpoint.seq == 1
    effect = Effect.objects.get(run_id=run["id"], idempotency_key="order-9-charge")
    assert effect.status == "committed" and effect.reconciled and effect.external_ref == "ch_1"
    decided = AuditEvent.objects.get(run_id=run["id"], action="recovery.decided")
    assert decided.actor_kind == "system" and decided.reason == why
    assert HistoryEvent.objects.filter(run_id=run["id"], kind="recovery_report").exists()


def test_the_dead_workers_token_is_refused_and_the_redrive_duplicates_nothing(
    worker, world, django_capture_on_commit_callbacks
):
    run = orphaned_run(worker, world)
    recover_now(run["id"], django_capture_on_commit_callbacks)
    zombie = declare(
        worker, run["id"], run["token"], key="order-9-notify", tool="inventory", action="reserve"
    )
    assert zombie.status_code == 409 and zombie.json()["reason"] == "lease_lost"
    beat = worker.post(f"/leases/{run['lease']['id']}/heartbeat", {"fencing_token": run["token"]})
    assert beat.status_code == 409 and beat.json()["error"] == "lease_lost"

    again = worker.post(
        f"/runs/{run['id']}/claim", {"worker": "worker-8", "versions": VERSIONS}
    ).json()
    token = again["lease"]["fencing_token"]
    assert (
        token == run["token"] + 1
        and again["checkpoint"]["seq"] == 1
        and again["attempt"]["number"] == 2
    )
    replay = declare(worker, run["id"], token, key="order-9-charge")
    assert (
        replay.status_code == 200
        and replay.json()["decision"] == "replayed"
        and replay.json()["external_ref"] == "ch_1"
    )
    done = worker.post(
        f"/runs/{run['id']}/finish", {"fencing_token": token, "outcome": "succeeded"}
    )
    assert done.json()["state"] == "succeeded"
    assert (
        Effect.objects.filter(
            run_id=run["id"], idempotency_key="order-9-charge", decision="authorized"
        ).count()
        == 1
    )


def test_a_charge_the_world_never_saw_is_reconciled_failed_and_runs_again(
    worker, world, django_capture_on_commit_callbacks
):
    run = orphaned_run(worker, world, charge_reached_world=False)
    job = recover_now(run["id"], django_capture_on_commit_callbacks).receipt["job"]
    assert job["action"] == "redrive"
    assert job["report"]["rebuilt"]["effects_after_checkpoint"][0]["on_redrive"].startswith(
        "runs again"
    )
    charge = Effect.objects.get(run_id=run["id"], idempotency_key="order-9-charge")
    assert charge.status == "failed" and world.voided == ["order-9-charge"]
    assert charge.reconciliation["evidence"]["lease_fenced"] is True


def test_tampered_history_escalates_to_a_human(worker, world, django_capture_on_commit_callbacks):
    run = orphaned_run(worker, world)
    victim = HistoryEvent.objects.filter(run_id=run["id"], kind="effect_intent").first()
    with connection.cursor() as cur:
        cur.execute("SET CONSTRAINTS ALL IMMEDIATE")  # no pending FK checks may block the ALTER
        cur.execute("ALTER TABLE runs_historyevent DISABLE TRIGGER USER")
        cur.execute(
            "UPDATE runs_historyevent SET data = %s WHERE id = %s",
            ['{"effect": "forged"}', victim.pk],
        )
        cur.execute("ALTER TABLE runs_historyevent ENABLE TRIGGER USER")
        cur.execute("SET CONSTRAINTS ALL DEFERRED")
    intervention = recover_now(run["id"], django_capture_on_commit_callbacks)
    job = intervention.receipt["job"]
    assert job["action"] == "escalate" and job["state"] == "paused"
    assert f"history chain broken at seq {victim.seq} (edited)" in job["why"]
    assert job["report"]["history"] == {
        "ok": False,
        "first_broken_seq": victim.seq,
        "problem": "edited",
        "detail": f"seq {victim.seq}'s stored hash does not match its content",
    }
    assert Run.objects.get(pk=run["id"]).state == "paused"
    assert AuditEvent.objects.filter(run_id=run["id"], action="run.recovery_escalate").exists()


def test_an_effect_the_world_cannot_answer_for_escalates(
    worker, world, django_capture_on_commit_callbacks
):
    run = orphaned_run(worker, world)
    world.answer_unknown = True
    job = recover_now(run["id"], django_capture_on_commit_callbacks).receipt["job"]
    assert (
        job["action"] == "escalate"
        and "still of unknown outcome" in job["why"]
        and "order-9-charge" in job["why"]
    )
    assert [e["idempotency_key"] for e in job["report"]["unresolved_after"]] == ["order-9-charge"]
    assert (
        Effect.objects.get(run_id=run["id"], idempotency_key="order-9-charge").status == "in_flight"
    )
    assert Run.objects.get(pk=run["id"]).state == "paused"


def test_versions_no_worker_runs_escalate(worker, world, django_capture_on_commit_callbacks):
    run = orphaned_run(worker, world)
    Agent.objects.filter(name="purchasing").update(
        current_versions={**VERSIONS, "tools": {"payments": "4.0"}}
    )
    job = recover_now(run["id"], django_capture_on_commit_callbacks).receipt["job"]
    assert job["action"] == "escalate" and job["why"].startswith("versions not runnable")
    assert job["report"]["versions"]["differences"] == [
        {"key": "tools.payments", "then": "3.1", "now": "4.0"}
    ]


def test_unreported_versions_are_unknown_and_not_runnable(
    worker, world, django_capture_on_commit_callbacks
):
    run = orphaned_run(worker, world, versions={})
    job = recover_now(run["id"], django_capture_on_commit_callbacks).receipt["job"]
    assert job["action"] == "escalate" and job["report"]["versions"]["unknown"] is True


def test_an_operator_may_recover_preferring_compensation(
    worker, world, as_user, django_capture_on_commit_callbacks
):
    run = orphaned_run(worker, world)
    assert expire_leases(actor=system_actor("test")) == [run["id"]]
    body = {
        "kind": "recover",
        "reason": "customer cancelled meanwhile",
        "options": {"prefer": "compensate"},
    }
    assert as_user("vera").post(f"/runs/{run['id']}/interventions", body).status_code == 403
    with django_capture_on_commit_callbacks(execute=False):
        resp = as_user("otto").post(f"/runs/{run['id']}/interventions", body)
    assert resp.status_code == 202 and resp.json()["receipt"]["state"] == "recovering"
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        run_recovery(resp.json()["id"])
    assert len(jobs(callbacks)) == 1  # the compensation plan's job
    intervention = Intervention.objects.get(pk=resp.json()["id"])
    assert (
        intervention.receipt["job"]["action"] == "compensate"
        and Run.objects.get(pk=run["id"]).state == "compensating"
    )
    plan = CompensationPlan.objects.get(run_id=run["id"])
    assert plan.intervention_id == intervention.pk
    assert [s.effect.idempotency_key for s in plan.steps.order_by("position")] == [
        "order-9-charge",
        "order-9-reserve",
    ]
    assert run_compensation_plan(str(plan.pk))["status"] == "completed"
    assert world.compensated == ["compensate:order-9-charge", "compensate:order-9-reserve"]
    intervention.refresh_from_db()
    assert intervention.receipt["compensation"]["plan_status"] == "completed"
    assert intervention.receipt["job"]["action"] == "compensate"  # the recovery's own result stays
    assert Run.objects.get(pk=run["id"]).state == "compensated"


def test_recovery_runs_once_however_often_it_is_delivered(
    worker, world, django_capture_on_commit_callbacks
):
    run = orphaned_run(worker, world)
    intervention = recover_now(run["id"], django_capture_on_commit_callbacks)
    assert run_recovery(str(intervention.pk)) == {"skipped": "already concluded"}
    assert (
        on_orphaned(run["id"]) is None
    )  # the run moved on: a second scan cannot start another recovery
    assert Intervention.objects.filter(run_id=run["id"], kind="recover").count() == 1
    assert AuditEvent.objects.filter(run_id=run["id"], action="recovery.decided").count() == 1
    assert world.asked == ["order-9-charge"]


def test_the_lease_scan_starts_forgotten_recoveries_and_the_job_sweep_delivers_lost_ones(
    worker, world, monkeypatch, django_capture_on_commit_callbacks
):
    run = orphaned_run(worker, world)
    assert expire_leases(actor=system_actor("test")) == [
        run["id"]
    ]  # orphaned, but on_orphaned never ran
    assert scan_expired_leases() == []  # within the grace period: leave it
    long_ago = timezone.now() - timedelta(minutes=5)
    Run.objects.filter(pk=run["id"]).update(state_changed_at=long_ago)
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        assert scan_expired_leases() == [run["id"]]
    assert len(jobs(callbacks)) == 1 and Run.objects.get(pk=run["id"]).state == "recovering"

    # Its message was lost: the recovery is an outbox job, and the one job sweep delivers it again.
    intervention = Intervention.objects.get(run_id=run["id"], kind="recover")
    job = Job.objects.get(kind="recovery", target_id=str(intervention.pk))
    Job.objects.filter(pk=job.pk).update(due_at=long_ago)
    sent = []
    monkeypatch.setattr(
        job_outbox, "deliver", lambda kind, target, countdown=None: sent.append((kind, target))
    )
    assert job_outbox.sweep_jobs() == {"delivered": [str(job.pk)], "failed": []}
    assert sent == [("recovery", str(intervention.pk))]
    assert run_recovery.run(str(intervention.pk))["decision"]["action"]
    assert Job.objects.get(pk=job.pk).status == Job.DONE


def test_a_retry_policy_stored_before_the_edge_checked_it_does_not_trap_recovery(
    worker, world, django_capture_on_commit_callbacks
):
    """{"max_attempts": "never"} once sent the recovery job into a TypeError loop, leaving the run in
    recovering for good. The API refuses it now; one already stored is read with the defaults."""
    run = orphaned_run(worker, world)
    Run.objects.filter(pk=run["id"]).update(retry_policy={"max_attempts": "never", "backoff_s": []})
    intervention = recover_now(run["id"], django_capture_on_commit_callbacks)
    job = intervention.receipt["job"]
    assert intervention.status == "completed" and job["action"] == "redrive", job
    assert job["report"]["attempts"]["max"] == 3  # the default, in place of "never"
    assert Run.objects.get(pk=run["id"]).state == "queued"
