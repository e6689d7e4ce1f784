"""Compensation on real parts: a Celery worker process on Redis, the demo world process, PostgreSQL --
and a SIGKILL in the middle of the plan.

The worker is ``celery -A controlplane worker -P solo`` pointed at this test's database (the one
pytest-django created) and at a Redis database of its own (``E2E_REDIS_DB``, default 9: it is flushed,
so keep it for this test). The world is ``python -m world`` on a free port with its own SQLite file;
the compensators really call it. What is shown:

- the first refund is refused (injected fault): recorded, retried after the 1 s backoff, then refunded;
- the worker is SIGKILLed while the label void is in flight (a ``slow`` fault holds the call) -- the
  world still commits the void, the answer is lost with the worker;
- a new worker takes the plan over (the sweep finds the expired step claim), calls void again with
  the SAME compensation key -- the world replays instead of voiding twice -- and finishes the plan;
- the world's own counts: one refund, one void, one release. Exactly once each.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
from django.utils import timezone

from audit.services import verify_chain
from interventions.jobs import sweep_jobs
from interventions.models import CompensationPlan, CompensationStep, Intervention, Job
from runs.models import Effect, Run
from runs.selectors import verify_history
from tests.conftest import claim, declare, start_run
from tests.live import test_database_url, wait_for
from world.client import WorldClient

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("postgres_only"),
]

ROOT = Path(__file__).resolve().parents[2]
AUTHORITY = [{"scope": s, "ttl_s": 3600} for s in ("inventory:*", "shipping:*", "payments:charge")]
SAGA = [  # step, tool, action, args, compensation
    (
        "reserve",
        "inventory",
        "reserve",
        {"sku": "sku-1", "qty": 1},
        {"tool": "inventory", "action": "release"},
    ),
    (
        "label",
        "shipping",
        "create_label",
        {"order": "o-1", "address": "1 Main St"},
        {"tool": "shipping", "action": "void_label"},
    ),
    ("charge", "payments", "charge", {"amount": 25.0}, {"tool": "payments", "action": "refund"}),
]


class Process:
    def __init__(self, args: list[str], log: Path, env: dict[str, str] | None = None):
        self.log = log
        with log.open("w") as out:
            self.proc = subprocess.Popen(
                args, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=env
            )

    def wait_for_line(self, pattern: str, timeout: float) -> re.Match:
        def seen():
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"{self.log.name} exited early:\n{self.log.read_text()[-3000:]}"
                )
            return re.search(pattern, self.log.read_text())

        return wait_for(f"{pattern!r} in {self.log.name}", seen, timeout, 0.1, logs=(self.log,))

    def sigkill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


@pytest.fixture
def broker():
    """This test's own Redis database, for the worker and for this process's Celery app."""
    import redis

    from controlplane.celery import app

    base = os.environ.get("REDIS_URL", "")
    if not base:
        pytest.skip("needs Redis (REDIS_URL)")
    url = urlunsplit(urlsplit(base)._replace(path=f"/{int(os.environ.get('E2E_REDIS_DB', '9'))}"))
    client = redis.Redis.from_url(url)
    try:
        client.flushdb()
    except redis.RedisError as exc:
        pytest.skip(f"Redis at {url} is not reachable: {exc}")
    old = app.conf.broker_url
    app.conf.broker_url, app._pool, app.amqp._producer_pool = url, None, None
    yield url
    app.conf.broker_url, app._pool, app.amqp._producer_pool = old, None, None
    client.flushdb()
    client.close()


def start_world(tmp: Path) -> tuple[Process, str]:
    world = Process(
        [
            sys.executable,
            "-m",
            "world",
            "--port",
            "0",
            "--db",
            str(tmp / "world.sqlite3"),
            "--send-delay",
            "0.5",
        ],
        tmp / "world.log",
    )
    return world, world.wait_for_line(r"listening on (http://\S+)", 15).group(1)


def start_celery(
    tmp: Path, name: str, broker_url: str, world_url: str, ready_s: float = 30
) -> Process:
    env = {
        **os.environ,
        "DATABASE_URL": test_database_url(),
        "REDIS_URL": broker_url,
        "WORLD_URL": world_url,
        "CELERY_TASK_ALWAYS_EAGER": "0",
        "DB_POOL_MIN": "1",
        "PYTHONUNBUFFERED": "1",
    }
    worker = Process(
        [
            str(ROOT / ".venv/bin/celery"),
            "-A",
            "controlplane",
            "worker",
            "-l",
            "info",
            "-P",
            "solo",
            "--concurrency",
            "1",
            "--without-gossip",
            "--without-mingle",
            "-n",
            f"{name}-{uuid.uuid4().hex[:6]}@%h",
        ],
        tmp / f"{name}.log",
        env,
    )
    try:
        worker.wait_for_line(r"ready\.", ready_s)
    except BaseException:
        worker.stop()  # a worker left running would take later tests' messages from the broker
        raise
    return worker


def commit_saga(worker, world: WorldClient) -> str:
    """The agent's side: declare, dispatch to the real world with the effect's key, record the outcome."""
    run = start_run(worker, authority=AUTHORITY)
    token = claim(worker, run["id"])["lease"]["fencing_token"]
    for step, tool, action, args, comp in SAGA:
        effect = declare(
            worker,
            run["id"],
            token,
            key=f"e2e-{step}",
            step=step,
            tool=tool,
            action=action,
            args=args,
            compensation=comp,
        ).json()
        result = world.perform(tool, action, args, effect["idempotency_key"])
        out = worker.post(
            f"/effects/{effect['id']}/outcome",
            {"fencing_token": token, "status": "committed", "external_ref": result["id"]},
        )
        assert out.status_code == 200, out.content
    assert (
        worker.post(
            f"/runs/{run['id']}/finish", {"fencing_token": token, "outcome": "succeeded"}
        ).status_code
        == 200
    )
    return run["id"]


def steps(plan_id: str) -> dict[int, CompensationStep]:
    return {s.position: s for s in CompensationStep.objects.filter(plan_id=plan_id)}


def test_a_sigkilled_worker_mid_plan_still_compensates_each_effect_exactly_once(
    worker, as_user, broker, tmp_path
):
    processes: list[Process] = []
    try:
        world_proc, world_url = start_world(tmp_path)
        processes.append(world_proc)
        with WorldClient(world_url, timeout=5) as world:
            run_id = commit_saga(worker, world)
            world.set_fault(
                "payments", "reject", action="refund", count=1
            )  # the first refund is refused
            world.set_fault(
                "shipping", "slow", action="void_label", count=1, delay_ms=2500
            )  # holds the void in flight
            first = start_celery(tmp_path, "worker-1", broker, world_url)
            processes.append(first)
            logs = (first.log, world_proc.log)

            resp = as_user("ian").post(
                f"/runs/{run_id}/interventions",
                {
                    "kind": "compensate",
                    "reason": "customer cancelled the order",
                    "options": {"claim_ttl_s": 5},
                },
            )
            assert resp.status_code == 202, resp.content
            plan_id, intervention_id = resp.json()["receipt"]["plan_id"], resp.json()["id"]

            # The refund failed once, was retried after its backoff and committed; the void is in flight:
            # the world has taken the call (its slow fault is consumed) and is holding the answer.
            wait_for(
                "refund done and void in flight",
                lambda: (
                    steps(plan_id)[1].status == "done"
                    and steps(plan_id)[2].status == "running"
                    and not any(f["system"] == "shipping" for f in world.faults())
                ),
                20,
                logs=logs,
            )
            first.sigkill()
            killed_at = steps(plan_id)
            assert killed_at[1].failures == 1 and killed_at[1].attempts == 2
            void = Effect.objects.get(pk=killed_at[2].compensation_effect_id)
            assert void.status == "in_flight" and void.idempotency_key == "compensate:e2e-label"
            # The world finishes the call the dead worker made: the void committed, nobody heard.
            wait_for(
                "the orphaned void to commit in the world",
                lambda: any(
                    r["committed"] for r in world.requests(system="shipping", action="void_label")
                ),
                10,
                logs=logs,
            )

            second = start_celery(tmp_path, "worker-2", broker, world_url)
            processes.append(second)
            wait_for(
                "the dead worker's step claim to expire",
                lambda: steps(plan_id)[2].claimed_until <= timezone.now(),
                10,
            )
            # The dead delivery's job is overdue once its timeout passes: the one job sweep (what
            # celery beat runs periodically) delivers it again.
            Job.objects.filter(kind="compensation", target_id=str(plan_id)).update(
                due_at=timezone.now()
            )
            sweep_jobs.delay()
            plan = wait_for(
                "the plan to finish",
                lambda: CompensationPlan.objects.filter(
                    pk=plan_id, status__in=CompensationPlan.FINAL
                ).first(),
                30,
                logs=(second.log, world_proc.log),
            )

            assert plan.status == "completed"
            final = steps(plan_id)
            assert [(s.status, s.attempts, s.failures) for s in final.values()] == [
                ("done", 2, 1),
                ("done", 2, 0),
                ("done", 1, 0),
            ]
            voids = world.requests(system="shipping", action="void_label")
            assert {r["idempotency_key"] for r in voids} == {
                "compensate:e2e-label"
            }  # the same key, twice
            assert sorted((bool(r["committed"]), bool(r["replayed"])) for r in voids) == [
                (False, True),
                (True, False),
            ]
            counts = world.counts()
            by_action = counts["requests"]["by_action"]
            assert by_action["payments:refund"]["committed"] == 1
            assert by_action["shipping:void_label"]["committed"] == 1
            assert by_action["inventory:release"]["committed"] == 1
            assert counts["charges"]["refunded"] == 1 and counts["labels"]["voided"] == 1
            assert counts["reservations"]["released"] == 1

        run = Run.objects.get(pk=run_id)
        assert run.state == "compensated"
        comps = Effect.objects.filter(run_id=run_id, kind="compensation")
        assert sorted(comps.values_list("idempotency_key", "status")) == [
            ("compensate:e2e-charge", "committed"),
            ("compensate:e2e-label", "committed"),
            ("compensate:e2e-reserve", "committed"),
        ]
        intervention = Intervention.objects.get(pk=intervention_id)
        assert (
            intervention.status == "completed"
            and intervention.receipt["job"]["plan_status"] == "completed"
        )
        assert verify_history(run)["ok"] and verify_chain().ok
    finally:
        for proc in reversed(processes):
            proc.stop()
