"""A timer that fires during a pause is recorded then, and delivered to the worker on resume -- with
real parts: daphne serving the API on the test database, a Celery worker with beat (it fires due
timers every second and runs the resume's revalidation job) on this suite's own Redis database
(``E2E_REDIS_DB``), and an agent worker process written on the SDK (below) that sets the timer.

What is shown: the worker sets a 4 s timer and checkpoints; an operator pauses the run and the worker
releases at its boundary; the timer comes due while the run is paused: beat fires it, recorded as
fired while ``paused`` and NOT delivered (no worker holds the run); the resume preview names it; on
resume the worker claims attempt 2 from the checkpoint and its first heartbeats deliver the timer,
with ``fired_while: paused``; the timer row ends ``delivered`` and the history has both events.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import httpx
import pytest

from runs.models import HistoryEvent, Run, Timer
from tests.live import Procs, server_env, start_celery, start_daphne, wait_for

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(180),
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("postgres_only"),
]

AGENT = """
import json, sys, time
from controlplane_sdk import Client, PauseRequested
from controlplane_sdk.runtime import Worker

url, token, out_path = sys.argv[1:4]
worker = Worker(Client(url, token, timeout=15), "timer-worker", "purchasing", heartbeat_interval=0.3)

def emit(**kw):
    with open(out_path, "a") as f:
        f.write(json.dumps(kw) + "\\n")

deadline = time.monotonic() + 120
while time.monotonic() < deadline:
    ctx = worker.claim_next(wait_s=2)
    if ctx is None:
        continue
    with ctx:
        start = ctx.start_checkpoint.seq if ctx.start_checkpoint else None
        emit(event="claimed", attempt=ctx.attempt.number, checkpoint=start)
        if start is None:
            ctx.set_timer("reminder", in_s=4)
            ctx.checkpoint("waiting", {"timer": "reminder"})
            emit(event="timer_set")
        try:
            while time.monotonic() < deadline:
                ctx.check_directive()
                fired = ctx.pop_fired_timers()
                if fired:
                    emit(event="timers", attempt=ctx.attempt.number, timers=fired)
                    ctx.finish("succeeded")
                    sys.exit(0)
                time.sleep(0.2)
        except PauseRequested:
            emit(event="paused", attempt=ctx.attempt.number, timers=ctx.pop_fired_timers())
            ctx.release("paused at a boundary")
"""


def _events(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture
def redis_db():
    import redis

    # The suite's Redis (REDIS_URL: make test and CI set it), on this test's own database number.
    base = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
    db = int(os.environ.get("E2E_REDIS_DB", "9"))
    url = urlunsplit(urlsplit(base)._replace(path=f"/{db}"))
    client = redis.Redis.from_url(url)
    try:
        client.ping()
    except redis.RedisError as exc:
        if os.environ.get("CONTROLPLANE_REQUIRE_POSTGRES"):  # make test: never silently skipped
            raise
        pytest.skip(f"needs Redis at {url}: {exc}")
    client.flushdb()  # this test's own Redis database (E2E_REDIS_DB); nothing else lives there
    yield url
    client.flushdb()
    client.close()


def test_a_timer_fired_during_a_pause_is_delivered_on_resume(tmp_path, agent, cast, redis_db):
    from runs.models import ApiToken

    _, worker_secret = ApiToken.issue(kind=ApiToken.WORKER, name="timers", agents=["purchasing"])
    operator = cast["otto"][1]
    env = server_env(
        tmp_path,
        REDIS_URL=redis_db,
        CELERY_TASK_ALWAYS_EAGER="0",
        RECOVERY_SCAN_INTERVAL_S="1",
        JOB_SWEEP_INTERVAL_S="1",
        DB_POOL_MIN="1",
    )
    procs = Procs(tmp_path)
    out = tmp_path / "agent-events.jsonl"
    script = tmp_path / "timer_agent.py"
    script.write_text(AGENT)
    try:
        base = start_daphne(procs, env)
        start_celery(procs, env, beat=True)
        api = httpx.Client(base_url=f"{base}/api/v1", timeout=15)
        as_worker = {"Authorization": f"Bearer {worker_secret}"}
        as_otto = {"Authorization": f"Bearer {operator}"}
        made = api.post(
            "/runs",
            json={"agent": "purchasing", "goal": "remind me", "authority": []},
            headers=as_worker,
        )
        assert made.status_code == 201, made.text
        run_id = made.json()["id"]
        procs.start("agent", [sys.executable, str(script), base, worker_secret, str(out)], env)

        wait_for(
            "the timer to be set", lambda: any(e["event"] == "timer_set" for e in _events(out)), 30
        )
        paused = api.post(
            f"/runs/{run_id}/interventions",
            json={"kind": "pause", "reason": "look before the reminder goes out"},
            headers=as_otto,
        )
        assert paused.status_code == 202, paused.text
        wait_for("the worker to release at its boundary",
                 lambda: Run.objects.get(pk=run_id).state == "paused", 15)  # fmt: skip
        timer = Timer.objects.get(run_id=run_id, name="reminder")
        assert timer.status == Timer.PENDING, "the pause came after the timer fired: too slow"

        fired = wait_for(
            "beat to fire the due timer",
            lambda: (t := Timer.objects.get(pk=timer.pk)).status == Timer.FIRED and t,
            20,
        )
        assert fired.fired_while == "paused" and fired.delivered_at is None
        assert HistoryEvent.objects.filter(run_id=run_id, kind="timer_fired").exists()
        time.sleep(1.0)  # a paused run has no worker to deliver to: nothing arrives meanwhile
        assert not [e for e in _events(out) if e["event"] == "timers"]

        shown = api.post(
            f"/runs/{run_id}/interventions/preview",
            json={"kind": "resume", "reason": "checked"},
            headers=as_otto,
        ).json()
        assert [t["name"] for t in shown["timers_fired_while_paused"]] == ["reminder"]
        resumed = api.post(
            f"/runs/{run_id}/interventions",
            json={"kind": "resume", "reason": "checked", "preview_digest": shown["digest"]},
            headers=as_otto,
        )
        assert resumed.status_code == 202, resumed.text

        delivered = wait_for(
            "the worker to be handed the timer",
            lambda: next((e for e in _events(out) if e["event"] == "timers"), None),
            40,
        )
        assert delivered["attempt"] == 2
        assert [(t["name"], t["fired_while"]) for t in delivered["timers"]] == [
            ("reminder", "paused")
        ]
        claims = [e for e in _events(out) if e["event"] == "claimed"]
        assert [(c["attempt"], c["checkpoint"]) for c in claims] == [(1, None), (2, 1)]
        paused_events = [e for e in _events(out) if e["event"] == "paused"]
        assert paused_events and paused_events[0]["timers"] == []
        wait_for("the run to finish", lambda: Run.objects.get(pk=run_id).state == "succeeded", 15)
        final = Timer.objects.get(pk=timer.pk)
        assert final.status == Timer.DELIVERED and final.delivered_at > final.fired_at
        assert HistoryEvent.objects.filter(run_id=run_id, kind="timers_delivered").count() == 1
    except BaseException:
        print(procs.logs())
        raise
    finally:
        procs.stop()
