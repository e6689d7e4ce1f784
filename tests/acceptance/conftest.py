"""The live system for the run-control test: daphne, a Celery worker with beat, the demo world and
real agent worker processes, on the test database (PostgreSQL) and a Redis database of its own."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import httpx
import pytest
from django.db import connection

from tests.acceptance import report
from tests.live import Procs, server_env, start_celery, start_daphne, start_world, wait_for
from world.client import WorldClient

LEASE_TTL_S = 6
PEOPLE = {
    "otto": "operator",
    "olga": "operator",
    "ian": "incident_commander",
    "sam": "security_responder",
    "april": "approver",
    "vera": "viewer",
}


logging.getLogger("httpx").setLevel(logging.WARNING)  # every poll would be logged otherwise


def pytest_sessionfinish(session, exitstatus):
    path = report.write_report()
    if path:
        print(f"\nrun-control report: {path}/run-control.html and run-control.json")


@pytest.fixture(autouse=True)
def _scenario_status(request):
    yield
    rep = getattr(request.node, "rep_call", None)
    for s in report.SCENARIOS.values():
        if s.status == "running":
            s.status = "passed" if rep is not None and rep.passed else "failed"
            if rep is not None and rep.failed:
                s.error = str(rep.longrepr)[-3000:]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    rep = yield
    if rep.when == "call":
        item.rep_call = rep
    return rep


@pytest.fixture(scope="package")
def system(django_db_setup, django_db_blocker, tmp_path_factory):
    """One live system for the whole package: every test here is transactional (they run one after
    another), and each test's ``live`` resets what a test can change -- the database (flushed), the
    world (reset, faults cleared) and its own agent workers (stopped)."""
    if connection.vendor != "postgresql" or not os.environ.get("REDIS_URL"):
        pytest.skip("the run-control test runs on PostgreSQL and Redis (make test)")
    tmp = tmp_path_factory.mktemp("run-control")
    redis_url = urlunsplit(
        urlsplit(os.environ["REDIS_URL"])._replace(
            path=f"/{os.environ.get('ACCEPTANCE_REDIS_DB', '11')}"
        )
    )
    import redis

    redis.Redis.from_url(redis_url).flushdb()
    procs = Procs(tmp)
    try:
        world_url = start_world(procs, server_env(tmp), send_delay=0.5)
        env = server_env(
            tmp,
            REDIS_URL=redis_url,
            WORLD_URL=world_url,
            LEASE_TTL_S=str(LEASE_TTL_S),
            RECOVERY_SCAN_INTERVAL_S="1",
        )
        base = start_daphne(procs, env)
        start_celery(procs, env, name="celery", beat=True)
        yield {"url": base, "world_url": world_url, "env": env, "procs": procs}
    except BaseException:
        print(procs.logs())
        raise
    finally:
        procs.stop()
        redis.Redis.from_url(redis_url).flushdb()


class Api:
    def __init__(self, base: str, token: str):
        self.http = httpx.Client(
            base_url=f"{base}/api/v1", headers={"Authorization": f"Bearer {token}"}, timeout=20
        )

    def get(self, path: str, **params) -> httpx.Response:
        return self.http.get(path, params=params)

    def post(self, path: str, body: dict | None = None) -> httpx.Response:
        return self.http.post(path, json=body or {})

    def run(self, run_id: str) -> dict:
        return self.get(f"/runs/{run_id}").json()

    def effects(self, run_id: str) -> list[dict]:
        return self.get(f"/runs/{run_id}/effects").json()["effects"]

    def history(self, run_id: str) -> dict:
        return self.get(f"/runs/{run_id}/history").json()

    def intervene(self, run_id: str, kind: str, reason: str, **body) -> httpx.Response:
        return self.post(f"/runs/{run_id}/interventions", {"kind": kind, "reason": reason, **body})

    def preview(self, run_id: str, kind: str, reason: str = "preview", **body) -> dict:
        resp = self.post(
            f"/runs/{run_id}/interventions/preview", {"kind": kind, "reason": reason, **body}
        )
        assert resp.status_code == 200, resp.text
        return resp.json()


@pytest.fixture
def live(system, transactional_db):
    """Seeded agents, people and tokens; a reset world; a starter for agent worker processes."""
    from django.contrib.auth.models import Group, User

    from runs.management.commands.seed_demo import DEMO_AGENTS
    from runs.models import Agent, ApiToken

    for name, (scopes, description) in DEMO_AGENTS.items():
        Agent.objects.create(name=name, allowed_scopes=scopes, description=description)
    _, worker_secret = ApiToken.issue(
        kind=ApiToken.WORKER, name="acceptance-agents", agents=list(DEMO_AGENTS)
    )
    people = {}
    for username, role in PEOPLE.items():
        user = User.objects.create_user(username)
        user.groups.add(Group.objects.get_or_create(name=role)[0])
        people[username] = Api(
            system["url"], ApiToken.issue(kind=ApiToken.OPERATOR, name=username, user=user)[1]
        )
    world = WorldClient(system["world_url"], timeout=10)
    world.reset()
    # The beat anchors the audit chains every ANCHOR_INTERVAL_S: an anchor written during an earlier
    # test names chains its flush removed, and /audit/verify would call them cut. Each test starts
    # with no anchors, as the in-process tests do (tests/conftest.py).
    anchor_dir = (
        system["env"].get("ANCHOR_DIR") or f"{system['env']['CONTROLPLANE_VAR_DIR']}/anchors"
    )
    (Path(anchor_dir) / "anchors.jsonl").unlink(missing_ok=True)
    procs: Procs = system["procs"]
    started: list[str] = []

    def start_workers(
        n: int = 1, agents: str = "purchasing:2,address-verifier:1", **extra_env: str
    ) -> list[str]:
        env = dict(
            system["env"],
            CONTROLPLANE_URL=system["url"],
            CONTROLPLANE_TOKEN=worker_secret,
            AGENT_WORLD_TIMEOUT_S="8",
            CHILD_TIMEOUT_S="60",
        )
        env.update(extra_env)
        names = []
        for _ in range(n):
            name = f"acc-worker-{len(started) + 1}"
            _, log = procs.start(
                name,
                [
                    sys.executable,
                    "-m",
                    "demo_agents.worker",
                    "--name",
                    name,
                    "--poll",
                    "0.3",
                    "--grace",
                    "2",
                    "--agents",
                    agents,
                ],
                env,
            )
            wait_for(
                f"{name} to start", lambda log=log: "started" in log.read_text(), 60, logs=(log,)
            )
            started.append(name)
            names.append(name)
        return names

    worker = Api(system["url"], worker_secret)
    try:
        yield {
            "worker": worker,
            "world": world,
            "people": people,
            "start_workers": start_workers,
            "procs": procs,
            "url": system["url"],
            "worker_secret": worker_secret,
            "started": started,
        }
    except BaseException:
        print(procs.logs())
        raise
    finally:
        procs.kill(set(started) & {n for n, _, _ in procs.procs})
        world.clear_faults()
        world.close()
