"""Fixtures that run the real demo world as a subprocess (its own process, its own SQLite file).

No Django database is involved; only ``settings`` (pytest-django) is used, to point the adapters at
the world under test.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from world.client import WorldClient

ROOT = Path(__file__).resolve().parents[2]
SEND_DELAY_S = 0.5  # queued notifications go out this long after enqueue (2 s in production)


@dataclass
class RunningWorld:
    proc: subprocess.Popen
    url: str
    db: Path
    log: Path

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_world(db: Path, log: Path, port: int = 0) -> RunningWorld:
    """Start ``python -m world``; port 0 lets the OS pick a free port, which the server prints."""
    out = log.open("w")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "world",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--db",
            str(db),
            "--send-delay",
            str(SEND_DELAY_S),
        ],
        cwd=ROOT,
        stdout=out,
        stderr=subprocess.STDOUT,
    )
    out.close()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        match = re.search(r"listening on (http://\S+)", log.read_text())
        if match:
            return RunningWorld(proc, match.group(1), db, log)
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"world did not start:\n{log.read_text()}")


@pytest.fixture(scope="session")
def world_server(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("world")
    server = start_world(tmp / "world.sqlite3", tmp / "world.log")
    yield server
    server.stop()


@pytest.fixture
def world(world_server: RunningWorld):
    """A client on a freshly reset world (seed items, no faults, no history)."""
    with WorldClient(world_server.url, timeout=3.0) as client:
        client.reset()
        yield client
        client.clear_faults()


@pytest.fixture
def send_delay() -> float:
    return SEND_DELAY_S


@pytest.fixture
def world_process():
    """Start extra worlds (e.g. to restart one on the same file); all are stopped afterwards."""
    started: list[RunningWorld] = []

    def start(db: Path, log: Path) -> RunningWorld:
        started.append(start_world(db, log))
        return started[-1]

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def world_settings(settings, world_server: RunningWorld):
    """Point the adapters at the world under test, with short timeouts."""
    settings.WORLD_URL = world_server.url
    settings.WORLD_TIMEOUT_S = 0.5
    return settings
