"""The embedded Celery broker (no REDIS_URL: kombu's SQLAlchemy transport on SQLite, see
controlplane/broker.py) under what `make run` does to it: a Celery worker consuming, beat publishing
every half second and several other processes publishing at once. Real processes, real files.

The filesystem transport it replaces is shown failing the way `make run` died after 21 minutes: a
message file that is empty when the worker reads it (the writer creates the file before it writes
it) kills the worker (celery/kombu#1551).
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.demo.embedded import embedded_env
from tests.live import wait_for

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.demo.broker_app"
PUBLISHER = """
import sys
from tests.demo.broker_app import record
name, n = sys.argv[1], int(sys.argv[2])
for i in range(n):
    record.delay(f"{name}-{i}")
"""

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def _env(tmp: Path, **extra: str) -> dict[str, str]:
    return embedded_env(
        tmp, BROKER_TEST_DIR=str(tmp), BROKER_TEST_LOG=str(tmp / "done.log"), **extra
    )


def _celery(tmp: Path, env: dict[str, str], *args: str) -> tuple[subprocess.Popen, Path]:
    log = tmp / f"{args[0]}.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", APP, *args, "-l", "info"],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return proc, log


def _done(tmp: Path) -> Counter:
    path = tmp / "done.log"
    return Counter(path.read_text().split()) if path.exists() else Counter()


def _stop(*procs: subprocess.Popen) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait(timeout=10)


def test_worker_beat_and_three_publishers_share_the_embedded_broker_without_loss_or_crash(tmp_path):
    env = _env(tmp_path)
    # As under `make run`, where migrate has made the demo database (in WAL mode) before Celery
    # starts: a worker and a beat that both create it at the same instant race on the switch to WAL
    # ("database is locked" from Django's check at beat start-up; seen once in CI).
    (tmp_path / "var").mkdir(exist_ok=True)
    db = sqlite3.connect(tmp_path / "var" / "controlplane.sqlite3")
    db.execute("PRAGMA journal_mode=WAL")
    db.close()
    worker, worker_log = _celery(tmp_path, env, "worker", "-P", "threads", "-c", "4")
    beat, _ = _celery(tmp_path, env, "beat")
    publishers: list[subprocess.Popen] = []
    try:
        wait_for("the worker", lambda: " ready." in worker_log.read_text(), 60, logs=(worker_log,))
        n, names = 150, ["p1", "p2", "p3"]
        publishers = [
            subprocess.Popen([sys.executable, "-c", PUBLISHER, name, str(n)], cwd=ROOT, env=env)
            for name in names
        ]
        assert [p.wait(timeout=120) for p in publishers] == [0, 0, 0]  # no "database is locked"
        expected = {f"{name}-{i}" for name in names for i in range(n)}
        wait_for(
            "every published task to run",
            lambda: expected <= set(_done(tmp_path)) and _done(tmp_path)["beat"] >= 10,
            120,
            logs=(worker_log,),
        )
        time.sleep(2)  # a duplicate delivery would show up now
        done = _done(tmp_path)
        assert {t: c for t, c in done.items() if t != "beat"} == dict.fromkeys(expected, 1)

        # A row that is not a message (a disk error, a hand edit): dropped with a log line, the worker
        # keeps serving.
        broker = tmp_path / "var" / "celery-broker.sqlite3"
        with sqlite3.connect(broker, timeout=30) as db:
            [(queue_id,)] = db.execute("SELECT id FROM kombu_queue WHERE name = 'celery'")
            for payload in ("", "{not json"):
                db.execute(
                    "INSERT INTO kombu_message (queue_id, visible, payload, version) "
                    "VALUES (?, 1, ?, 1)",
                    (queue_id, payload),
                )
        db.close()
        subprocess.run(
            [sys.executable, "-c", PUBLISHER, "late", "5"], cwd=ROOT, env=env, check=True
        )
        wait_for(
            "tasks published after the bad rows to run",
            lambda: {f"late-{i}" for i in range(5)} <= set(_done(tmp_path)),
            60,
            logs=(worker_log,),
        )
        assert worker.poll() is None and beat.poll() is None
        assert worker_log.read_text().count("dropped an undecodable message") == 2
        assert "Unrecoverable error" not in worker_log.read_text()
    finally:
        _stop(worker, beat, *publishers)


def test_the_filesystem_transport_it_replaces_dies_on_an_empty_message_file(tmp_path):
    env = _env(tmp_path, BROKER_TEST_FILESYSTEM="1")
    worker, worker_log = _celery(tmp_path, env, "worker", "-P", "threads", "-c", "2")
    try:
        wait_for("the worker", lambda: " ready." in worker_log.read_text(), 60, logs=(worker_log,))
        # What a reader sees when it lists the folder between the writer's open() and its write().
        (tmp_path / "fs-broker" / f"{int(time.monotonic() * 1000)}_x.celery.msg").write_bytes(b"")
        wait_for("the worker to die", lambda: worker.poll() is not None, 30, logs=(worker_log,))
        assert "Unrecoverable error: JSONDecodeError" in worker_log.read_text()
    finally:
        _stop(worker)
