"""One live stack for the adversarial replay: daphne (the ASGI app as deployed, with its static
handler), a Celery worker with beat on its own Redis database (``E2E_REDIS_DB``), and the test's
PostgreSQL database. Started once per module; each test seeds its own rows (committed:
``transaction=True``), so the processes see them."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.live import Procs, server_env, start_celery, start_daphne


@dataclass
class Stack:
    base: str
    procs: Procs
    env: dict[str, str]
    celery_log: Path

    def api(self, token: str) -> httpx.Client:
        return httpx.Client(
            base_url=f"{self.base}/api/v1",
            headers={"Authorization": f"Bearer {token}"},
            timeout=15,
        )


def _redis_url() -> str:
    base = os.environ.get("REDIS_URL", "")
    if not base.startswith("redis://"):
        pytest.skip("needs Redis (REDIS_URL)")
    db = os.environ.get("E2E_REDIS_DB", "9")
    return base.rsplit("/", 1)[0] + f"/{db}"


@pytest.fixture(scope="module")
def stack(django_db_setup, django_db_blocker, tmp_path_factory):
    import redis

    url = _redis_url()
    redis.Redis.from_url(url).flushdb()  # this suite's own Redis database, nothing else lives there
    tmp = tmp_path_factory.mktemp("adversarial")
    procs = Procs(tmp)
    with django_db_blocker.unblock():
        env = server_env(
            tmp,
            REDIS_URL=url,
            CELERY_TASK_ALWAYS_EAGER="0",
            RECOVERY_SCAN_INTERVAL_S="1",  # the beat's timer and recovery scans, every second
            ANCHOR_INTERVAL_S="0",
        )
    try:
        base = start_daphne(procs, env)
        log = start_celery(procs, env, name="celery-adversarial", beat=True)
        yield Stack(base, procs, env, log)
    finally:
        procs.stop()
        redis.Redis.from_url(url).flushdb()
