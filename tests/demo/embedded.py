"""`make run`'s embedded defaults for the tests that start its real processes: no DATABASE_URL, no
REDIS_URL (SQLite, the SQLite Celery broker, the SQLite live bus), everything under ``tmp/var``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def embedded_env(tmp: Path, **extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DATABASE_URL", "REDIS_URL", "CONTROLPLANE_REQUIRE_POSTGRES")
    }
    env.update(CONTROLPLANE_VAR_DIR=str(tmp / "var"), PYTHONUNBUFFERED="1", **extra)
    return env


def start_demo(tmp: Path, env: dict[str, str]) -> tuple[subprocess.Popen, Path]:
    """migrate, seed_demo, then the real supervisor (demo/supervisor.py); its log in ``tmp``."""
    for cmd in (["migrate", "--noinput"], ["seed_demo"]):
        subprocess.run(
            [sys.executable, "manage.py", *cmd], cwd=ROOT, env=env, check=True, capture_output=True
        )
    log = tmp / "supervisor.log"
    with log.open("w") as out:
        sup = subprocess.Popen(
            [sys.executable, "-m", "demo.supervisor"],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return sup, log
