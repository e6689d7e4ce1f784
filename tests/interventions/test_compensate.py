"""Compensate: the plan from the ledger, its execution by the job, failures, retries and exactly-once.

Compensators are fakes registered through interventions.registry (restored afterwards); the job is
driven by calling its service directly, which is what the Celery task does. The real worker, the real
world and a SIGKILL are in tests/e2e/test_celery_worker.py.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from audit.models import AuditEvent
from core.actors import system_actor
from interventions import jobs, registry
from interventions.compensate import (
    _claim_next_step,
    execute_compensation_plan,
    run_compensation_plan,
)
from interventions.models import CompensationPlan, CompensationStep, Intervention, Job
from interventions.registry import CompensationResult, EffectInfo
from runs.integrity import verify_ledger
from runs.models import Effect, Run
from runs.selectors import verify_history
from tests.conftest import claim, declare, start_run

pytestmark = pytest.mark.django_db

AUTHORITY = [
    {"scope": s, "ttl_s": 3600}
    for s in ("inventory:*", "shipping:*", "payments:charge", "notifications:*")
]
SAGA = [  # step, tool, action, compensation
    ("reserve", "inventory", "reserve", {"tool": "inventory", "action": "release"}),
    ("label", "shipping", "create_label", {"tool": "shipping", "action": "void_label"}),
    ("charge", "payments", "charge", {"tool": "payments", "action": "refund"}),
]


class FakeWorld:
    """Honours compensation keys like a real provider: the same key twice is a replay, not a second undo.
    Injected failures (per original tool:action) are not stored under the key, as in the demo world."""

    def __init__(self):
        self.calls: list[tuple[str, str, str]] = []  # (tool, action, compensation key)
        self.applied: dict[str, str] = {}  # compensation key -> original key
        self.failures: dict[tuple[str, str], list[CompensationResult]] = {}
        self.delay_s = 0.0
        self.lock = threading.Lock()

    def fail(self, tool: str, action: str, *results: CompensationResult) -> None:
        self.failures.setdefault((tool, action), []).extend(results)

    def compensate(self, effect: EffectInfo, key: str) -> CompensationResult:
        with self.lock:
            self.calls.append((effect.tool, effect.action, key))
            injected = self.failures.get((effect.tool, effect.action))
            if injected:
                return injected.pop(0)
        time.sleep(self.delay_s)
        with self.lock:
            replayed = key in self.applied
            self.applied.setdefault(key, effect.idempotency_key)
        return CompensationResult(
            ok=True, external_ref=f"undo-{effect.idempotency_key}", detail={"replayed": replayed}
        )

    def undo_count(self, original_key: str) -> int:
        return sum(1 for orig in self.applied.values() if orig == original_key)


@pytest.fixture
def world():
    registry.load_adapters()  # first, so the real adapters cannot overwrite the fakes later
    saved = dict(registry._compensators)
    fake = FakeWorld()
    for tool, action in [
        ("inventory", "reserve"),
        ("shipping", "create_label"),
        ("payments", "charge"),
        ("notifications", "enqueue"),
    ]:
        registry.compensator(tool, action)(fake.compensate)
    yield fake
    registry._compensators.clear()
    registry._compensators.update(saved)


def saga_run(worker, *, extra=(), finish="succeeded") -> dict:
    """A run that committed reserve, label and charge (plus ``extra`` effects), then finished."""
    run = start_run(worker, authority=AUTHORITY)
    token = claim(worker, run["id"])["lease"]["fencing_token"]
    for step, tool, action, comp in [*SAGA, *extra]:
        body = {"step": step, "tool": tool, "action": action, "args": {"step": step}}
        if isinstance(comp, dict):
            body["compensation"] = comp
        elif comp == "irreversible":
            body.update(compensation=None, irreversible=True)
        else:
            body["compensation"] = None
        resp = declare(worker, run["id"], token, key=f"order-1-{step}", **body)
        assert resp.status_code == 201, resp.content
        out = worker.post(
            f"/effects/{resp.json()['id']}/outcome",
            {"fencing_token": token, "status": "committed", "external_ref": f"ref-{step}"},
        )
        assert out.status_code == 200, out.content
    fin = worker.post(f"/runs/{run['id']}/finish", {"fencing_token": token, "outcome": finish})
    assert fin.status_code == 200, fin.content
    return run


def compensate(api, run_id: str, **options):
    return api.post(
        f"/runs/{run_id}/interventions",
        {"kind": "compensate", "reason": "order cancelled by customer", "options": options},
    )


def issued_plan(
    api, run_id: str, django_capture_on_commit_callbacks, **options
) -> tuple[dict, CompensationPlan]:
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        resp = compensate(api, run_id, **options)
    assert resp.status_code == 202, resp.content
    assert callbacks, "the job is enqueued on commit"
    receipt = resp.json()
    return receipt, CompensationPlan.objects.get(pk=receipt["receipt"]["plan_id"])


def test_it_plans_in_reverse_order_calls_out_irreversible_and_uncompensable(
    worker, as_user, world, django_capture_on_commit_callbacks
):
    run = saga_run(
        worker,
        extra=[
            ("notify", "notifications", "enqueue", "irreversible"),
            ("audit-note", "notifications", "enqueue", None),
        ],
    )
    ian = as_user("ian")
    shown = ian.post(
        f"/runs/{run['id']}/interventions/preview", {"kind": "compensate", "reason": "r"}
    ).json()
    assert [s["step"] for s in shown["plan"]["steps"]] == ["charge", "label", "reserve"]
    assert {c["step"]: c["why"].split(":")[0] for c in shown["plan"]["called_out"]} == {
        "notify": "irreversible",
        "audit-note": "no compensation was declared with this effect",
    }
    assert Run.objects.get(pk=run["id"]).state == "succeeded"  # the preview changed nothing

    receipt, plan = issued_plan(ian, run["id"], django_capture_on_commit_callbacks)
    assert receipt["status"] == "pending" and receipt["receipt"]["state"] == "compensating"
    steps = receipt["receipt"]["plan"]["steps"]
    assert [(s["position"], s["compensation"]["action"], s["compensation_key"]) for s in steps] == [
        (1, "refund", "compensate:order-1-charge"),
        (2, "void_label", "compensate:order-1-label"),
        (3, "release", "compensate:order-1-reserve"),
    ]
    assert len(receipt["receipt"]["plan"]["called_out"]) == 2
    assert set(
        Effect.objects.filter(
            run_id=run["id"], step__in=["reserve", "label", "charge"]
        ).values_list("compensation_status", flat=True)
    ) == {"pending"}

    assert run_compensation_plan(str(plan.pk))["status"] == "completed"
    assert [c[1] for c in world.calls] == [
        "charge",
        "create_label",
        "reserve",
    ]  # strictly in plan order
    run_row = Run.objects.get(pk=run["id"])
    assert run_row.state == "compensated"
    comps = Effect.objects.filter(run_id=run["id"], kind="compensation").order_by("declared_at")
    assert [(c.action, c.status, c.compensates.step) for c in comps] == [
        ("refund", "committed", "charge"),
        ("void_label", "committed", "label"),
        ("release", "committed", "reserve"),
    ]
    notify = Effect.objects.get(run_id=run["id"], step="notify")
    assert (
        notify.status == "committed" and notify.compensation_status == ""
    )  # called out, never touched
    intervention = Intervention.objects.get(pk=receipt["id"])
    assert (
        intervention.status == "completed"
        and intervention.receipt["job"]["plan_status"] == "completed"
    )
    assert "2 called out" in intervention.receipt["job"]["summary"]
    assert AuditEvent.objects.filter(run_id=run["id"], action="compensation.plan_finished").exists()
    assert AuditEvent.objects.filter(
        run_id=run["id"], action="run.compensation_completed", actor_kind="system"
    ).exists()
    assert verify_history(run_row)["ok"]


def test_a_failure_is_recorded_and_retried_with_backoff_then_succeeds(
    worker, as_user, world, django_capture_on_commit_callbacks, monkeypatch
):
    run = saga_run(worker)
    world.fail(
        "payments", "charge", CompensationResult(ok=False, detail={"error": "card_network_down"})
    )
    _, plan = issued_plan(as_user("ian"), run["id"], django_capture_on_commit_callbacks)
    enqueued = []
    monkeypatch.setattr(
        execute_compensation_plan,
        "apply_async",
        lambda args, countdown, **publish: enqueued.append((args, countdown)),
    )

    first = execute_compensation_plan.apply(args=(str(plan.pk),)).get()
    assert first["status"] == "retry_scheduled" and first["countdown"] == 1.0
    assert enqueued == [((str(plan.pk),), 1.0)]  # the task came back later, as a new message
    step = CompensationStep.objects.get(plan=plan, position=1)
    assert (
        step.status == "pending"
        and step.failures == 1
        and step.last_error["error"] == "card_network_down"
    )
    assert timezone.now() < step.next_attempt_at <= timezone.now() + timedelta(seconds=1)
    assert (
        CompensationStep.objects.get(plan=plan, position=2).attempts == 0
    )  # later steps wait their turn
    assert AuditEvent.objects.filter(
        run_id=run["id"], action="compensation.attempt_failed", outcome="error"
    ).exists()

    assert run_compensation_plan(str(plan.pk))["status"] == "waiting"  # too early: backoff holds
    CompensationStep.objects.filter(pk=step.pk).update(next_attempt_at=timezone.now())
    assert run_compensation_plan(str(plan.pk))["status"] == "completed"
    refunds = [c for c in world.calls if c[1] == "charge"]
    assert (
        refunds == [("payments", "charge", "compensate:order-1-charge")] * 2
    )  # same key both times
    assert world.undo_count("order-1-charge") == 1
    step.refresh_from_db()
    assert step.status == "done" and step.attempts == 2 and len(step.errors) == 1
    assert Run.objects.get(pk=run["id"]).state == "compensated"


def test_a_step_that_cannot_succeed_fails_and_the_plan_goes_on_partially_failed(
    worker, as_user, world, django_capture_on_commit_callbacks
):
    run = saga_run(worker)
    world.fail(
        "shipping",
        "create_label",
        CompensationResult(ok=False, retryable=False, detail={"error": "unknown_label"}),
    )
    world.fail(
        "inventory", "reserve", *[CompensationResult(ok=False, detail={"error": "down"})] * 2
    )
    receipt, plan = issued_plan(
        as_user("ian"), run["id"], django_capture_on_commit_callbacks, backoff_s=0
    )

    assert run_compensation_plan(str(plan.pk))["status"] == "partially_failed"
    steps = {s.position: s for s in plan.steps.all()}
    assert (steps[1].status, steps[2].status, steps[3].status) == ("done", "failed", "done")
    assert steps[2].failures == 1 and steps[3].failures == 2 and steps[3].attempts == 3
    label = Effect.objects.get(run_id=run["id"], step="label")
    assert label.compensation_status == "failed"
    assert Effect.objects.get(compensates=label).status == "failed"
    assert (
        Run.objects.get(pk=run["id"]).state == "compensation_failed"
    )  # never silently "compensated"
    intervention = Intervention.objects.get(pk=receipt["id"])
    assert (
        intervention.status == "failed"
        and intervention.receipt["job"]["plan_status"] == "partially_failed"
    )
    assert [s["step"] for s in intervention.receipt["job"]["plan"]["result"]["failed_steps"]] == [
        "label"
    ]
    assert (
        AuditEvent.objects.filter(run_id=run["id"], action="compensation.step_failed").count() == 1
    )
    # The failed compensation's status change has its history event, like every ledger change.
    assert verify_ledger()["ok"], verify_ledger()


def test_a_second_plan_skips_what_was_compensated_and_retries_a_failure_under_a_fresh_key(
    worker, as_user, world, django_capture_on_commit_callbacks
):
    run = saga_run(worker)
    world.fail(
        "payments",
        "charge",
        CompensationResult(ok=False, retryable=False, detail={"error": "declined"}),
    )
    world.fail(
        "shipping",
        "create_label",
        CompensationResult(ok=False, retryable=False, detail={"error": "declined"}),
    )
    world.fail(
        "inventory",
        "reserve",
        CompensationResult(ok=False, retryable=False, detail={"error": "declined"}),
    )
    _, first = issued_plan(as_user("ian"), run["id"], django_capture_on_commit_callbacks)
    assert run_compensation_plan(str(first.pk))["status"] == "failed"  # all failed
    assert Run.objects.get(pk=run["id"]).state == "compensation_failed"

    world.fail(
        "shipping",
        "create_label",
        CompensationResult(ok=False, retryable=False, detail={"error": "declined"}),
    )
    _, second = issued_plan(as_user("ian"), run["id"], django_capture_on_commit_callbacks)
    assert run_compensation_plan(str(second.pk))["status"] == "partially_failed"
    _, third = issued_plan(as_user("ian"), run["id"], django_capture_on_commit_callbacks)
    assert [s.effect.step for s in third.steps.all()] == ["label"]
    assert {s["step"] for s in third.skipped} == {
        "charge",
        "reserve",
    }  # already compensated: skipped
    assert third.steps.get().idempotency_key == "compensate:order-1-label:3"
    assert run_compensation_plan(str(third.pk))["status"] == "completed"
    assert Run.objects.get(pk=run["id"]).state == "compensated"
    assert all(world.undo_count(f"order-1-{s}") == 1 for s in ("charge", "label", "reserve"))


def test_after_a_failed_plan_forward_retry_is_refused_and_compensate_or_close_remain(
    worker, as_user, world, django_capture_on_commit_callbacks
):
    run = saga_run(worker)
    world.fail(
        "shipping",
        "create_label",
        CompensationResult(ok=False, retryable=False, detail={"error": "declined"}),
    )
    _, plan = issued_plan(as_user("ian"), run["id"], django_capture_on_commit_callbacks)
    assert run_compensation_plan(str(plan.pk))["status"] == "partially_failed"
    assert Run.objects.get(pk=run["id"]).state == "compensation_failed"
    # A forward retry would replay the reservation and the charge that were just undone.
    retry = as_user("ian").post(
        f"/runs/{run['id']}/interventions", {"kind": "retry", "reason": "try again"}
    )
    assert retry.status_code == 409 and retry.json()["state"] == "compensation_failed", (
        retry.content
    )
    assert retry.json()["detail"] == "retry is not allowed while the run is compensation_failed"
    assert AuditEvent.objects.filter(
        run_id=run["id"], action="intervention.retry", outcome="denied"
    ).exists()
    assert Run.objects.get(pk=run["id"]).state == "compensation_failed"
    # The worker is told to stop; the contracts document lists only compensate and close from here.
    contracts = as_user("ian").get("/contracts").json()
    edges = {
        (row["event"], row["to"])
        for row in contracts["state_machine"]
        if row["from"] == "compensation_failed"
    }
    assert edges == {("compensate", "compensating"), ("close", "closed")}, edges
    # Compensating again finishes the job: only the label is left, under a fresh key.
    _, again = issued_plan(as_user("ian"), run["id"], django_capture_on_commit_callbacks)
    assert [s.effect.step for s in again.steps.all()] == ["label"]
    assert run_compensation_plan(str(again.pk))["status"] == "completed"
    assert Run.objects.get(pk=run["id"]).state == "compensated"


def test_compensate_is_refused_while_an_effect_is_unresolved_naming_it(worker, as_user, world):
    run = start_run(worker, authority=AUTHORITY)
    claim(worker, run["id"])
    effect = declare(worker, run["id"], 1, key="order-2-charge").json()
    worker.post(f"/effects/{effect['id']}/outcome", {"fencing_token": 1, "status": "unknown"})
    worker.post(
        f"/runs/{run['id']}/finish",
        {"fencing_token": 1, "outcome": "failed", "failure_class": "timeout"},
    )
    resp = compensate(as_user("ian"), run["id"])
    assert resp.status_code == 409 and resp.json()["error"] == "effects_unresolved"
    assert "order-2-charge" in resp.json()["detail"] and resp.json()["state"] == "failed"
    assert not CompensationPlan.objects.exists() and Run.objects.get(pk=run["id"]).state == "failed"
    assert AuditEvent.objects.filter(action="intervention.compensate", outcome="denied").exists()


def test_only_incident_commanders_and_admins_may_compensate(worker, as_user, world):
    run = saga_run(worker)
    assert compensate(as_user("otto"), run["id"]).status_code == 403
    assert compensate(as_user("ian"), run["id"], max_attempts=0).status_code == 422


def test_running_the_job_twice_compensates_once(
    worker, as_user, world, django_capture_on_commit_callbacks
):
    run = saga_run(worker)
    _, plan = issued_plan(as_user("ian"), run["id"], django_capture_on_commit_callbacks)
    assert run_compensation_plan(str(plan.pk))["status"] == "completed"
    assert run_compensation_plan(str(plan.pk)) == {"status": "completed", "finished": True}
    assert len(world.calls) == 3
    assert Effect.objects.filter(run_id=run["id"], kind="compensation").count() == 3
    assert (
        AuditEvent.objects.filter(run_id=run["id"], action="compensation.plan_finished").count()
        == 1
    )


def test_a_crash_between_call_and_record_recalls_with_the_same_key(
    worker, as_user, world, django_capture_on_commit_callbacks
):
    """The dead delivery declared, claimed and called the world, then died before recording."""
    run = saga_run(worker)
    _, plan = issued_plan(
        as_user("ian"), run["id"], django_capture_on_commit_callbacks, claim_ttl_s=30
    )
    dead = _claim_next_step(str(plan.pk), "task-dead", system_actor("test"))
    world.compensate(dead.info, dead.key)  # reached the world; the answer was lost with the worker
    assert (
        run_compensation_plan(str(plan.pk), task_id="task-other")["status"] == "busy"
    )  # its claim is live
    assert (
        run_compensation_plan(str(plan.pk), task_id="task-dead")["status"] == "completed"
    )  # redelivery takes over
    assert [c[2] for c in world.calls].count("compensate:order-1-charge") == 2
    assert world.undo_count("order-1-charge") == 1
    assert (
        Effect.objects.filter(run_id=run["id"], kind="compensation", action="refund").count() == 1
    )
    assert CompensationStep.objects.get(plan=plan, position=1).attempts == 2


def test_a_delivery_that_died_holding_a_step_is_delivered_again_by_the_job_sweep(
    worker, as_user, world, django_capture_on_commit_callbacks, monkeypatch
):
    """One outbox, one sweep: the plan's job, started and never heard from again, is delivered again
    by ``sweep_jobs`` (a failure counted on the job), and that delivery takes over the dead one's step
    once its claim has expired."""
    run = saga_run(worker)
    _, plan = issued_plan(as_user("ian"), run["id"], django_capture_on_commit_callbacks)
    sent: list[tuple[str, str]] = []
    monkeypatch.setattr(
        jobs, "deliver", lambda kind, target, countdown=None: sent.append((kind, target))
    )
    assert jobs.sweep_jobs() == {"delivered": [], "failed": []}  # just enqueued: not due
    # A delivery began (the job's attempt), claimed the first step, and its worker died.
    job = Job.objects.get(kind="compensation", target_id=str(plan.pk))
    past = timezone.now() - timedelta(seconds=1)
    Job.objects.filter(pk=job.pk).update(status=Job.RUNNING, attempts=1, due_at=past)
    _claim_next_step(str(plan.pk), "task-dead", system_actor("test"))
    CompensationStep.objects.filter(plan=plan, position=1).update(claimed_until=past)
    assert jobs.sweep_jobs()["delivered"] == [str(job.pk)]
    assert sent == [("compensation", str(plan.pk))]
    job.refresh_from_db()
    assert (job.status, job.attempts, job.failures) == (Job.PENDING, 1, 1)
    assert execute_compensation_plan.run(str(plan.pk))["status"] == "completed"
    job.refresh_from_db()
    assert (job.status, job.attempts) == (Job.DONE, 2)


@pytest.mark.django_db(transaction=True)
def test_two_deliveries_at_once_compensate_each_effect_once(
    postgres_only, worker, as_user, world, monkeypatch
):
    monkeypatch.setattr(
        execute_compensation_plan, "delay", lambda plan_id: None
    )  # the threads below deliver it
    run = saga_run(worker)
    resp = compensate(as_user("ian"), run["id"])
    plan_id = resp.json()["receipt"]["plan_id"]
    world.delay_s = 0.05
    barrier, results = threading.Barrier(4), []

    def deliver(i: int) -> None:
        try:
            barrier.wait(timeout=10)
            results.append(run_compensation_plan(plan_id, task_id=f"task-{i}"))
        finally:
            connection.close()

    threads = [threading.Thread(target=deliver, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    assert run_compensation_plan(plan_id)["status"] == "completed"
    assert sorted(c[2] for c in world.calls) == sorted(
        f"compensate:order-1-{s}" for s in ("charge", "label", "reserve")
    )
    assert Effect.objects.filter(run_id=run["id"], kind="compensation").count() == 3
    assert Run.objects.get(pk=run["id"]).state == "compensated"
