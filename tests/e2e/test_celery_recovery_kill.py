"""Recovery survives its own Celery worker being SIGKILLed mid-job: the job is reconciling with the
world (the reconciler's by-key call is held open by a slow fault) when the worker dies; a new worker
picks the job up again (the beat sweep re-enqueues a stuck recovery) and the run is reconciled once
and requeued -- with the world still holding exactly one charge."""

from __future__ import annotations

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
]


def test_a_sigkilled_celery_worker_mid_recovery_still_recovers_once(worker, broker, tmp_path):  # noqa: F811
    processes: list[Process] = []
    try:
        world_proc, world_url = start_world(tmp_path)
        processes.append(world_proc)
        with WorldClient(world_url, timeout=5) as world:
            # The agent's side: a charge dispatched to the world, then the agent vanished before recording it.
            run = start_run(worker, authority=[{"scope": "payments:charge", "ttl_s": 3600}])
            # The worker reports the versions it runs at claim: recovery must find them runnable to redrive.
            token = worker.post(
                f"/runs/{run['id']}/claim", {"worker": "worker-7", "versions": run["versions"]}
            ).json()["lease"]["fencing_token"]
            effect = declare(
                worker, run["id"], token, key="order-7-charge", args={"amount": 30.0}
            ).json()
            world.perform("payments", "charge", {"amount": 30.0}, effect["idempotency_key"])
            ExecutionLease.objects.filter(run_id=run["id"]).update(expires_at=timezone.now())
            assert expire_leases(actor=system_actor("test")) == [run["id"]]

            world.set_fault("payments", "slow", action="by_key", count=1, delay_ms=4000)
            first = start_celery(tmp_path, "recovery-1", broker, world_url)
            processes.append(first)
            intervention = on_orphaned(run["id"])  # enqueues the recovery job on commit
            assert intervention is not None
            # The job has taken the world's by-key call (the slow fault is consumed) and waits for it.
            wait_for(
                "the reconciler's call to be in flight",
                lambda: not world.faults(),
                20,
                logs=(first.log, world_proc.log),
            )
            first.sigkill()
            assert Intervention.objects.get(pk=intervention.pk).status == Intervention.PENDING
            assert Run.objects.get(pk=run["id"]).state == "recovering"
            assert Effect.objects.get(pk=effect["id"]).status == "in_flight"

            second = start_celery(tmp_path, "recovery-2", broker, world_url)
            processes.append(second)
            # The killed delivery never reports back: once its job is overdue, the job sweep counts
            # the failure and delivers it again.
            job = Job.objects.get(kind="recovery", target_id=str(intervention.pk))
            Job.objects.filter(pk=job.pk).update(due_at=timezone.now())
            assert sweep_jobs()["delivered"] == [str(job.pk)]
            done = wait_for(
                "the recovery to finish",
                lambda: (
                    (i := Intervention.objects.get(pk=intervention.pk)).status
                    != Intervention.PENDING
                    and i
                ),
                30,
                logs=(second.log, world_proc.log),
            )
            assert done.status == Intervention.COMPLETED
            # No checkpoint was written, so the safe next action is a retry from the start (same keys).
            assert done.receipt["job"]["action"] == "retry", done.receipt["job"]
            settled = Effect.objects.get(pk=effect["id"])
            assert settled.status == "committed" and settled.reconciled
            assert (
                AuditEvent.objects.filter(
                    action="effect.reconcile", object_id=str(settled.pk)
                ).count()
                == 1
            )
            assert Run.objects.get(pk=run["id"]).state == "queued"
            charges = [
                r for r in world.requests(system="payments", action="charge") if r["committed"]
            ]
            assert len(charges) == 1
            assert verify_chain().ok
    finally:
        for proc in processes:
            proc.stop()
