"""`make run` uses the embedded defaults (SQLite, in-memory channel layer, SQLite Celery broker) while the
suite runs on PostgreSQL. So the protocol and intervention tests are run once more, in a child pytest,
on SQLite: vendor-specific SQL on a hot path must not break the newcomer's demo."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SUBSET = [
    "tests/runs/test_protocol.py",
    "tests/core/pg/test_rows.py",
    "tests/interventions/test_pause_resume.py",
    "tests/interventions/test_contracts.py",
]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def test_protocol_and_interventions_pass_on_the_embedded_sqlite_defaults(tmp_path):
    env = {
        k: v
        for k, v in os.environ.items()
        if k
        not in ("DATABASE_URL", "REDIS_URL", "CONTROLPLANE_REQUIRE_POSTGRES", "TEST_DATABASE_NAME")
    }
    env["CONTROLPLANE_VAR_DIR"] = str(tmp_path / "var")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *SUBSET],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert " passed" in proc.stdout.splitlines()[-1]
