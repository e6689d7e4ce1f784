"""A fleet operation on real parts: waves delivered by a Celery worker process on Redis, the pause
between waves honoured, and the error budget halting the rollout when a wave fails.

The API call that starts the operation runs in this process (its outbox job is published to this
suite's Redis database on commit); a real ``celery worker -B`` runs the waves against the test
database. Three runs in waves of one, 1 s apart; the second run finishes before its wave reaches it,
so its pause is refused -- with a budget of 0 failures the operation halts there, the third run is
never touched, and each decided run has its own receipt.
"""

from __future__ import annotations

import os
import time

import pytest

from interventions.models import FleetOperation, Intervention, Job
from runs.models import Run
from tests.conftest import place_run_in
from tests.interventions.helpers import running_run
from tests.live import Procs, server_env, start_celery, wait_for

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("postgres_only"),
]


@pytest.fixture
def redis_url():
    import redis

    from controlplane.celery import app

    url = os.environ.get("REDIS_URL", "")
    if not url:
        pytest.skip("needs Redis (REDIS_URL)")
    client = redis.Redis.from_url(url)
    client.flushdb()  # this suite's own Redis database (REDIS_URL); nothing else lives there
    app.conf.broker_url, app._pool, app.amqp._producer_pool = url, None, None
    yield url
    client.flushdb()
    client.close()


def test_a_real_worker_runs_the_waves_and_the_budget_halts_the_rollout(
    tmp_path, worker, as_user, redis_url
):
    ids = [running_run(worker)[0]["id"] for _ in range(3)]
    procs = Procs(tmp_path)
    env = server_env(tmp_path, CELERY_TASK_ALWAYS_EAGER="0", DB_POOL_MIN="1", REDIS_URL=redis_url)
    try:
        log = start_celery(procs, env | {"JOB_SWEEP_INTERVAL_S": "1"}, beat=True)
        started = as_user("otto").post(
            "/fleet",
            {
                "kind": "pause",
                "filter": "&".join(f"id={i}" for i in ids),
                "reason": "payments incident",
                "wave_size": 1,
                "pause_s": 2,
                "max_failures": 0,
            },
        )
        assert started.status_code == 202, started.content
        op_id = started.json()["id"]
        began = time.monotonic()
        wait_for(
            "wave 1 to pause the first run",
            lambda: Run.objects.get(pk=ids[0]).state == "paused",
            20,
            logs=(log,),
        )
        place_run_in(ids[1], "succeeded")  # the world moves on before wave 2 (2 s later)
        wait_for(
            "the operation to halt",
            lambda: FleetOperation.objects.get(pk=op_id).state != "running",
            30,
            logs=(log,),
        )
        took = time.monotonic() - began
    finally:
        procs.stop()
    op = FleetOperation.objects.get(pk=op_id)
    assert (op.state, op.halted_automatically) == ("halted", True)
    assert (op.succeeded, op.failed, op.skipped) == (1, 1, 1)
    assert took >= 2  # the second wave waited for the pause between waves
    assert Run.objects.get(pk=ids[2]).state == "running"  # never reached
    assert list(Intervention.objects.values_list("run_id", flat=True)) == [
        Run.objects.get(pk=ids[0]).pk
    ]
    assert set(Job.objects.filter(kind="fleet_wave").values_list("status", flat=True)) == {"done"}
