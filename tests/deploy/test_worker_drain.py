"""A Celery worker's drain (issue 22 item 3; docs/operations/drain.md): SIGTERM is Celery's warm
shutdown, so a worker stopped in the middle of a job finishes it, once, and exits 0; a worker that is
SIGKILLed after its SIGTERM (a grace period too short) leaves the job to the sweep, which delivers it
to a second worker that finishes it, and the job's effect is recorded once.

The job is a recovery reconciling with the world, its by-key call held open 4 s by a slow fault (as
tests/e2e/test_celery_recovery_kill.py). Real worker processes on Redis and PostgreSQL; ~145 s on a
loaded machine, so outside the suite: ``make worker-drain-test`` (run by .ci/run)."""

from __future__ import annotations

import os
import signal
import time

import pytest
from django.utils import timezone

from audit.models import AuditEvent
from audit.services import verify_chain
from core.actors import system_actor
from interventions.jobs import sweep_jobs
from interventions.models import Intervention, Job
from interventions.recover import on_orphaned
from runs.models import Effect, ExecutionLease, Run
from runs.services.lifecycle import expire_leases
from tests.conftest import declare, start_run
from tests.e2e.test_celery_worker import Process, broker, start_celery, start_world  # noqa: F401 (broker: fixture)
from tests.live import wait_for
from world.client import WorldClient

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("postgres_only"),
    pytest.mark.skipif(
        os.environ.get("CONTROLPLANE_WORKER_DRAIN_TEST") != "1",
        reason="the Celery drain test runs under `make worker-drain-test` (~145 s under load)",
    ),
]

SLOW_MS = 4000
READY_S = 120  # a worker's start-up (imports, broker) took over 30 s at load 12


def _recovery_in_flight(
    worker, world: WorldClient, tmp_path, name: str, broker_url: str, world_url, processes: list
):
    """An orphaned run whose recovery job is in the middle of its (slow) call to the world."""
    run = start_run(worker, authority=[{"scope": "payments:charge", "ttl_s": 3600}])
    token = worker.post(
        f"/runs/{run['id']}/claim", {"worker": "worker-7", "versions": run["versions"]}
    ).json()["lease"]["fencing_token"]
    effect = declare(worker, run["id"], token, key=f"{name}-charge", args={"amount": 30.0}).json()
    world.perform("payments", "charge", {"amount": 30.0}, effect["idempotency_key"])
    ExecutionLease.objects.filter(run_id=run["id"]).update(expires_at=timezone.now())
    assert expire_leases(actor=system_actor("test")) == [run["id"]]
    world.set_fault("payments", "slow", action="by_key", count=1, delay_ms=SLOW_MS)
    proc = start_celery(tmp_path, name, broker_url, world_url, ready_s=READY_S)
    processes.append(proc)  # stopped by the test even if what follows fails
    intervention = on_orphaned(run["id"])  # enqueues the recovery job on commit
    assert intervention is not None
    wait_for(
        "the recovery's call to be in flight", lambda: not world.faults(), 90, logs=(proc.log,)
    )
    return proc, run, effect, intervention


def _recovered_once(run, effect, intervention, world: WorldClient) -> None:
    done = Intervention.objects.get(pk=intervention.pk)
    assert done.status == Intervention.COMPLETED, (done.status, done.receipt)
    settled = Effect.objects.get(pk=effect["id"])
    job = Job.objects.get(kind="recovery", target_id=str(intervention.pk))
    assert settled.status == "committed" and settled.reconciled, (
        settled.status,
        settled.reconciled,
        done.receipt,
        (job.status, job.attempts, job.failures, job.last_error),
    )
    reconciled = AuditEvent.objects.filter(action="effect.reconcile", object_id=str(settled.pk))
    assert reconciled.count() == 1  # recorded once
    assert Run.objects.get(pk=run["id"]).state == "queued"
    job = Job.objects.get(kind="recovery", target_id=str(intervention.pk))
    assert job.status == Job.DONE, job.status
    charges = [r for r in world.requests(system="payments", action="charge") if r["committed"]]
    assert len(charges) == 1
    assert verify_chain().ok


def test_sigterm_mid_job_finishes_the_job_once_and_exits_0(worker, broker, tmp_path):  # noqa: F811
    processes: list[Process] = []
    try:
        world_proc, world_url = start_world(tmp_path)
        processes.append(world_proc)
        with WorldClient(world_url, timeout=5) as world:
            proc, run, effect, intervention = _recovery_in_flight(
                worker, world, tmp_path, "drain-term", broker, world_url, processes
            )
            sent = time.monotonic()
            proc.proc.send_signal(signal.SIGTERM)
            rc = proc.proc.wait(timeout=60)
            took = time.monotonic() - sent
            log = proc.log.read_text()
            assert rc == 0, log[-3000:]
            assert "Warm shutdown" in log, log[-3000:]
            # it finished the job in hand before exiting: no second worker, no sweep
            _recovered_once(run, effect, intervention, world)
            assert Job.objects.get(kind="recovery", target_id=str(intervention.pk)).attempts == 1
            print(f"worker drained mid-job: exit 0 after {took:.1f} s (the call held {SLOW_MS} ms)")
    finally:
        for p in processes:
            p.stop()


def test_sigterm_then_sigkill_leaves_the_job_to_the_sweep_and_a_second_worker(
    worker,
    broker,  # noqa: F811
    tmp_path,
):
    processes: list[Process] = []
    try:
        world_proc, world_url = start_world(tmp_path)
        processes.append(world_proc)
        with WorldClient(world_url, timeout=5) as world:
            first, run, effect, intervention = _recovery_in_flight(
                worker, world, tmp_path, "drain-kill-1", broker, world_url, processes
            )
            first.proc.send_signal(signal.SIGTERM)
            time.sleep(0.5)  # a grace period far shorter than the job
            first.sigkill()
            assert Intervention.objects.get(pk=intervention.pk).status == Intervention.PENDING
            assert Effect.objects.get(pk=effect["id"]).status == "in_flight"

            second = start_celery(tmp_path, "drain-kill-2", broker, world_url, ready_s=READY_S)
            processes.append(second)
            # the killed delivery never reports back: once overdue, the sweep delivers it again
            job = Job.objects.get(kind="recovery", target_id=str(intervention.pk))
            Job.objects.filter(pk=job.pk).update(due_at=timezone.now())
            assert sweep_jobs()["delivered"] == [str(job.pk)]
            wait_for(
                "the second worker to finish the recovery",
                lambda: Intervention.objects.get(pk=intervention.pk).status != Intervention.PENDING,
                60,
                logs=(second.log, world_proc.log),
            )
            _recovered_once(run, effect, intervention, world)
            job.refresh_from_db()
            # two deliveries started; the killed one counted as a failure by the sweep
            assert (job.attempts, job.failures) == (2, 1), (job.attempts, job.failures)
            assert "succeeded in" in second.log.read_text(), second.log.read_text()[-3000:]
    finally:
        for p in processes:
            p.stop()
