"""Nothing is lost when Redis is: every follow-up job kind, with real processes.

For every job kind (revalidation, reconcile, compensation, recovery) a decision is taken through the
API in this process, on the test database, with this process's Celery app publishing to this
suite's Redis database (``REDIS_URL``). Then either

1. the Redis database is flushed right after the decision commits (its message is gone), or
2. the broker is unreachable at commit (this process publishes to a closed port): the API still
   answers 2xx with its receipt, and no message ever left;

and only then a real ``celery worker -B`` (worker + beat, short sweep interval) starts on the good
broker, next to the demo world process. The job sweep finds the job overdue in PostgreSQL, delivers
it again, and the job completes exactly once: the job row is done, the decision's outcome is
recorded once in the run's history, and the world saw each undo once.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

import pytest

from core.actors import system_actor
from interventions.models import CompensationPlan, Intervention, Job
from runs.models import Effect, ExecutionLease, HistoryEvent, Run
from runs.services.lifecycle import expire_leases
from tests.conftest import claim, declare, start_run
from tests.interventions.helpers import intervene
from tests.live import Procs, server_env, start_celery, start_world, wait_for
from world.client import WorldClient

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("postgres_only"),
]

KINDS = ["revalidation", "reconcile", "compensation", "recovery"]
JOB_TIMEOUT_S = 4  # a lost message is delivered again this long after it was sent
CLOSED_PORT = "redis://127.0.0.1:1/0"  # nothing listens on port 1
AUTHORITY = [{"scope": "inventory:*", "ttl_s": 3600}]


@pytest.fixture
def redis_url():
    import redis

    url = os.environ.get("REDIS_URL", "")
    if not url:
        pytest.skip("needs Redis (REDIS_URL)")
    client = redis.Redis.from_url(url)
    client.flushdb()  # this suite's own Redis database (REDIS_URL); nothing else lives there
    yield url, client
    client.flushdb()
    client.close()


@pytest.fixture(scope="module")
def world_url(tmp_path_factory):
    """The demo world, shared by this module's tests: each test resets it (``live``)."""
    tmp = tmp_path_factory.mktemp("outbox-world")
    procs = Procs(tmp)
    try:
        yield start_world(procs, server_env(tmp))
    finally:
        procs.stop()


@pytest.fixture
def live(tmp_path, settings, world_url):
    settings.JOB_TIMEOUT_S = JOB_TIMEOUT_S  # the rows this process writes carry it
    with WorldClient(world_url, timeout=5) as world:
        world.reset()  # objects, keys, requests and faults back to the seed: as if just started
    procs = Procs(tmp_path)
    env = server_env(tmp_path, CELERY_TASK_ALWAYS_EAGER="0", DB_POOL_MIN="1")
    env |= {
        "WORLD_URL": world_url,
        "JOB_TIMEOUT_S": str(JOB_TIMEOUT_S),
        "JOB_SWEEP_INTERVAL_S": "1",
        "JOB_RETRY_BACKOFF_S": "1",
    }
    settings.WORLD_URL = world_url
    yield procs, env, world_url
    procs.stop()


def use_broker(url: str) -> None:
    """Point this process's Celery app somewhere else (its connection pools rebuilt)."""
    from controlplane.celery import app

    app.conf.broker_url, app._pool, app.amqp._producer_pool = url, None, None


# -- the decisions, one per job kind; each returns (job target id, run id) --------------------------


def committed_reservation(worker, world: WorldClient, *, status: str = "committed") -> tuple:
    run = start_run(worker, authority=AUTHORITY, versions={})
    token = claim(worker, run["id"])["lease"]["fencing_token"]
    effect = declare(
        worker,
        run["id"],
        token,
        key=f"outbox-{run['id'][:8]}",
        step="reserve",
        tool="inventory",
        action="reserve",
        args={"sku": "sku-1", "qty": 1},
        compensation={"tool": "inventory", "action": "release"},
    ).json()
    result = world.perform(
        "inventory", "reserve", {"sku": "sku-1", "qty": 1}, effect["idempotency_key"]
    )
    body = {"fencing_token": token, "status": status}
    if status == "committed":
        body["external_ref"] = result["id"]
    assert worker.post(f"/effects/{effect['id']}/outcome", body).status_code == 200
    return run["id"], token, effect


def decide(kind: str, worker, ian, world: WorldClient) -> tuple:
    """The decision whose job is under test, through the API. Returns (response, target id)."""
    if kind == "revalidation":
        run = start_run(worker, versions={})
        assert intervene(ian, run["id"], "pause").status_code == 202
        resp = intervene(ian, run["id"], "resume", reason="the world is back")
        return resp, resp.json()["id"] if resp.status_code < 300 else None
    if kind == "reconcile":
        # the agent timed out on its call: the world committed it, the ledger says unknown
        run_id, _, _ = committed_reservation(worker, world, status="unknown")
        resp = intervene(ian, run_id, "reconcile", reason="ask the world")
        return resp, resp.json()["id"] if resp.status_code < 300 else None
    if kind == "compensation":
        run_id, token, _ = committed_reservation(worker, world)
        finished = worker.post(
            f"/runs/{run_id}/finish", {"fencing_token": token, "outcome": "succeeded"}
        )
        assert finished.status_code == 200, finished.content
        resp = intervene(ian, run_id, "compensate", reason="order cancelled")
        return resp, resp.json()["receipt"]["plan_id"] if resp.status_code < 300 else None
    run = start_run(worker, versions={})
    claim(worker, run["id"])
    ExecutionLease.objects.filter(run_id=run["id"]).update(expires_at="2000-01-01T00:00:00Z")
    assert expire_leases(actor=system_actor("test")) == [run["id"]]  # orphaned, no recovery yet
    resp = intervene(ian, run["id"], "recover", reason="the worker vanished")
    return resp, resp.json()["id"] if resp.status_code < 300 else None


def concluded_once(kind: str, job: Job) -> None:
    """The decision's outcome is recorded exactly once, and the world undid what it undid once."""
    history = HistoryEvent.objects.filter(run_id=job.run_id)
    if kind == "revalidation":
        assert history.filter(kind="revalidation").count() == 1
        assert Intervention.objects.get(pk=job.target_id).status in ("completed", "failed")
        assert Run.objects.get(pk=job.run_id).state in ("queued", "paused")
    elif kind == "reconcile":
        assert history.filter(kind="effect_reconciled").count() == 1
        effect = Effect.objects.get(run_id=job.run_id, kind="action")
        assert (effect.status, effect.reconciled) == ("committed", True)
        assert Intervention.objects.get(pk=job.target_id).status == "completed"
    elif kind == "compensation":
        assert CompensationPlan.objects.get(pk=job.target_id).status == "completed"
        assert history.filter(kind="compensation_step_done").count() == 1
        assert Run.objects.get(pk=job.run_id).state == "compensated"
    else:
        assert history.filter(kind="recovery_report").count() == 1
        assert Intervention.objects.get(pk=job.target_id).status == "completed"
        assert Run.objects.get(pk=job.run_id).state in ("queued", "paused")


def finish_and_check(targets: list[tuple[str, str]], procs: Procs, env: dict, world: WorldClient):
    """One real ``celery worker -B`` for every kind's lost job (a worker start costs seconds; the
    kinds are independent rows of the one outbox): each is delivered by the sweep and done once."""
    log = start_celery(procs, env, name="celery-outbox", beat=True)
    jobs = []
    for kind, target in targets:
        jobs.append(
            wait_for(
                f"the {kind} job to be done",
                lambda kind=kind, target=target: Job.objects.filter(
                    kind=kind, target_id=target, status="done"
                ).first(),
                45,
                logs=(log,),
            )
        )
    # two more sweeps (one a second) after they were done: nothing delivers one again
    sweeps = re.compile(r"sweep_jobs\[[^\]]+\] succeeded")
    seen = len(sweeps.findall(log.read_text()))
    wait_for(
        "two more job sweeps",
        lambda: len(sweeps.findall(log.read_text())) >= seen + 2,
        15,
        interval=0.1,
        logs=(log,),
    )
    for (kind, _), job in zip(targets, jobs, strict=True):
        job.refresh_from_db()
        assert job.status == "done" and job.failures == 0, (kind, job.status, job.last_error)
        # the sweep delivered it (once it was overdue), not the lost first message
        assert (job.enqueued_at - job.created_at).total_seconds() >= JOB_TIMEOUT_S - 0.5, kind
        concluded_once(kind, job)
    if any(kind == "compensation" for kind, _ in targets):
        released = world.counts()["requests"]["by_action"]["inventory:release"]
        assert released["committed"] == 1
    assert "sweep_jobs" in Path(log).read_text()
    return jobs


def test_redis_flushed_after_commit_the_sweep_delivers_and_the_job_completes_once(
    worker, as_user, redis_url, live
):
    url, client = redis_url
    procs, env, world_url = live
    env = env | {"REDIS_URL": url}
    use_broker(url)
    targets = []
    with WorldClient(world_url, timeout=5) as world:
        for kind in KINDS:
            resp, target = decide(kind, worker, as_user("ian"), world)
            assert resp.status_code == 202, (kind, resp.content)
            job = Job.objects.get(kind=kind, target_id=target)
            assert job.status == "pending", kind
            assert client.llen("celery") >= 1, kind  # the message went to Redis ...
            client.flushdb()  # ... and Redis lost it
            targets.append((kind, target))
        finish_and_check(targets, procs, env, world)


def test_redis_down_at_commit_the_api_answers_and_the_job_completes_later(
    worker, as_user, redis_url, live, caplog
):
    url, client = redis_url
    procs, env, world_url = live
    env = env | {"REDIS_URL": url}
    targets = []
    with WorldClient(world_url, timeout=5) as world:
        for kind in KINDS:
            caplog.clear()
            use_broker(CLOSED_PORT)
            try:
                with caplog.at_level(logging.WARNING, logger="interventions.jobs"):
                    resp, target = decide(kind, worker, as_user("ian"), world)
            finally:
                use_broker(url)
            assert resp.status_code == 202, (kind, resp.content)
            assert resp.json()["receipt"]["job"]["status"] == "queued", kind  # not a 500
            assert any("job sweep will deliver it" in r.getMessage() for r in caplog.records), kind
            assert client.llen("celery") == 0, kind  # no message ever reached Redis
            job = Job.objects.get(kind=kind, target_id=target)
            assert (job.status, job.attempts) == ("pending", 0), kind
            targets.append((kind, target))
        finish_and_check(targets, procs, env, world)
