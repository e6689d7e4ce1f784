"""The live system for end-to-end and acceptance tests: real processes on the test database.

Every process runs in its own process group; ``Procs.stop`` kills whole groups, so nothing outlives a
test. Servers see the *test* database (pytest-django's), so tests that use them need
``django_db(transaction=True)``: rows must be committed to be seen by another process.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
from django.db import connection

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(
    what: str,
    predicate: Callable[[], Any],
    timeout: float,
    interval: float = 0.2,
    logs: tuple[Path, ...] = (),
) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    tails = "\n".join(f"--- {p.name} ---\n{p.read_text()[-3000:]}" for p in logs if p.exists())
    raise AssertionError(f"timed out after {timeout}s waiting for {what}\n{tails}")


def test_database_url() -> str:
    db = connection.settings_dict
    auth = quote(db.get("USER") or "postgres") + (
        f":{quote(db['PASSWORD'])}" if db.get("PASSWORD") else ""
    )
    return (
        f"postgresql://{auth}@{db.get('HOST') or '127.0.0.1'}:{db.get('PORT') or 5432}/{db['NAME']}"
    )


test_database_url.__test__ = False  # a helper, not a test


def server_env(tmp: Path, **extra: str) -> dict[str, str]:
    env = dict(
        os.environ,
        DATABASE_URL=test_database_url(),
        DEBUG="0",
        ALLOWED_HOSTS="127.0.0.1,localhost",
        PYTHONUNBUFFERED="1",
        CONTROLPLANE_VAR_DIR=str(tmp / "var"),
        # the demo agents' human-speed pauses (demo_agents/common.py) would only slow the tests down
        DEMO_STEP_SECONDS="0",
        DEMO_DISPATCH_SECONDS="0",
        WORLD_COMMIT_SECONDS="0",  # the world's commit latency likewise; tests inject "slow" faults
    )
    env.update(extra)
    return env


class Procs:
    """Subprocesses in their own process groups; ``stop()`` kills every group."""

    def __init__(self, tmp: Path):
        self.tmp, self.procs = tmp, []

    def start(
        self, name: str, cmd: list[str], env: dict[str, str], cwd: Path = ROOT
    ) -> tuple[subprocess.Popen, Path]:
        """``cwd`` is where ``python -m`` finds the code: another tree runs another release."""
        log = self.tmp / f"{name}.log"
        with log.open("w") as out:
            proc = subprocess.Popen(
                cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.procs.append((name, proc, log))
        return proc, log

    def get(self, name: str) -> subprocess.Popen:
        return next(p for n, p, _ in self.procs if n == name)

    def sigkill(self, name: str) -> None:
        """The crash the recovery contract is about: no cleanup, no goodbye."""
        proc = self.get(name)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        self.procs = [t for t in self.procs if t[0] != name]

    def stop(self, names: set[str] | None = None) -> dict[str, int | None]:
        """SIGTERM the chosen groups, SIGKILL what is left after 10 s. Returns exit codes (None: killed)."""
        chosen = [(n, p, log) for n, p, log in self.procs if names is None or n in names]
        for _, proc, _ in chosen:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        deadline, codes = time.monotonic() + 10, {}
        for name, proc, _ in chosen:
            try:
                codes[name] = proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                codes[name] = None
            finally:  # whatever the leader did, nothing of its group may survive
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait(timeout=5)
        self.procs = [t for t in self.procs if t not in chosen]
        return codes

    def kill(self, names: set[str]) -> None:
        """SIGKILL the chosen groups at once: for a test's teardown, where nothing the processes
        would still write matters (the database is flushed next) and a graceful stop only waits
        out the workers' long-polls (~2 s a test)."""
        chosen = [(n, p, log) for n, p, log in self.procs if n in names]
        for _, proc, _ in chosen:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for _, proc, _ in chosen:
            proc.wait(timeout=5)
        self.procs = [t for t in self.procs if t not in chosen]

    def logs(self) -> str:
        return "\n".join(f"--- {n} ---\n{log.read_text()[-4000:]}" for n, _, log in self.procs)


def start_world(procs: Procs, env: dict[str, str], send_delay: float = 0.5) -> str:
    _, log = procs.start(
        "world",
        [
            sys.executable,
            "-m",
            "world",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--db",
            str(procs.tmp / "world.sqlite3"),
            "--send-delay",
            str(send_delay),
        ],
        env,
    )
    return wait_for(
        "the world to listen",
        lambda: (m := re.search(r"listening on (http://\S+)", log.read_text())) and m.group(1),
        15,
        logs=(log,),
    )


def start_daphne(
    procs: Procs,
    env: dict[str, str],
    ready_path: str = "/api/v1/openapi.json",
    name: str = "daphne",
) -> str:
    port = free_port()
    _, log = procs.start(
        name,
        [str(BIN / "daphne"), "-b", "127.0.0.1", "-p", str(port), "controlplane.asgi:application"],
        env,
    )
    base = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            return httpx.get(f"{base}{ready_path}", timeout=2).status_code in (200, 401)
        except httpx.HTTPError:
            return False

    wait_for("daphne to serve", up, 30, logs=(log,))
    return base


def start_celery(
    procs: Procs, env: dict[str, str], name: str = "celery", beat: bool = False
) -> Path:
    cmd = [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "controlplane",
        "worker",
        "-l",
        "info",
        "-P",
        "solo",
        "-n",
        f"{name}@%h",
        # mingle waits a second at start for replies from other workers; gossip chatters with them.
        # A test's worker has no neighbours to sync with.
        "--without-mingle",
        "--without-gossip",
    ]
    if beat:
        cmd += ["-B", "-s", str(procs.tmp / f"{name}-beat-schedule")]
    _, log = procs.start(name, cmd, env)
    wait_for(f"{name} to be ready", lambda: "ready." in log.read_text(), 30, logs=(log,))
    return log


def log_in(base: str, username: str) -> httpx.Client:
    """A browser session on a live server: the login form, its CSRF token, the cast's password."""
    browser = httpx.Client(base_url=base, timeout=15)
    browser.get("/accounts/login/")
    response = browser.post(
        "/accounts/login/",
        data={
            "username": username,
            "password": f"pw-{username}",
            "csrfmiddlewaretoken": browser.cookies["csrftoken"],
        },
    )
    assert response.status_code == 302, response.text[:500]
    return browser
