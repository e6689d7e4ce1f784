"""`make run`: start every process of the demo and stop them all on Ctrl-C.

ASGI server (console + API) on :8000, a Celery worker and beat, the demo world on :8100, and the demo
agent fleet. Embedded defaults (SQLite, in-memory channel layer, filesystem broker) unless
DATABASE_URL / REDIS_URL are set.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
HOST = os.environ.get("HOST", "127.0.0.1")
PORT = os.environ.get("PORT", "8000")
WORLD_PORT = os.environ.get("WORLD_PORT", "8100")
AGENTS = int(os.environ.get("DEMO_AGENTS", "3"))


def processes() -> list[tuple[str, list[str]]]:
    procs = [
        ("web", [PY, "manage.py", "runserver", f"{HOST}:{PORT}", "--noreload"]),
        (
            "world",
            [
                PY,
                "-m",
                "world",
                "--host",
                "127.0.0.1",
                "--port",
                WORLD_PORT,
                "--db",
                "var/world.sqlite3",
            ],
        ),
        (
            "celery",
            [
                PY,
                "-m",
                "celery",
                "-A",
                "controlplane",
                "worker",
                "-l",
                "info",
                "-P",
                "threads",
                "-c",
                "4",
            ],
        ),
        ("beat", [PY, "-m", "celery", "-A", "controlplane", "beat", "-l", "info"]),
    ]
    if (ROOT / "demo_agents").is_dir():
        procs.append(("traffic", [PY, "-m", "demo_agents.traffic"]))
        procs += [
            (f"agent-{i}", [PY, "-m", "demo_agents.worker", "--name", f"demo-worker-{i}"])
            for i in range(1, AGENTS + 1)
        ]
    return procs


def _die_with_parent() -> None:
    """Linux: children get SIGTERM if the supervisor itself dies, so nothing is left running."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def is_client(name: str) -> bool:
    """The processes that call the others: started after, stopped before."""
    return name == "traffic" or name.startswith("agent-")


def wait_ready(urls: list[str], timeout_s: float = 90.0, stopping=lambda: False) -> bool:
    """True once every URL answers HTTP (any status); False after ``timeout_s`` or when ``stopping()``."""
    import urllib.error
    import urllib.request

    deadline, pending = time.monotonic() + timeout_s, list(urls)
    while pending and time.monotonic() < deadline and not stopping():
        try:
            urllib.request.urlopen(pending[0], timeout=2).close()
            pending.pop(0)
        except urllib.error.HTTPError:
            pending.pop(0)  # it answered
        except OSError:
            time.sleep(0.3)
    return not pending


def _pump(name: str, stream) -> None:
    for line in iter(stream.readline, b""):
        sys.stdout.write(f"{name:>10} | {line.decode(errors='replace')}")
        sys.stdout.flush()


def main() -> int:
    env = dict(
        os.environ,
        PYTHONUNBUFFERED="1",
        WORLD_URL=f"http://127.0.0.1:{WORLD_PORT}",
        CONTROLPLANE_URL=f"http://{HOST}:{PORT}",
    )
    token_file = ROOT / "var" / "demo-worker-token"
    if token_file.exists():
        env["CONTROLPLANE_TOKEN"] = token_file.read_text().strip()
    running: list[tuple[str, subprocess.Popen]] = []

    def start(name: str, cmd: list[str]) -> None:
        proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        threading.Thread(target=_pump, args=(name, proc.stdout), daemon=True).start()
        running.append((name, proc))

    stopping = False

    def stop(*_):
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    try:
        # Services first; the agents and the traffic once the console and the world answer, so the
        # log does not open with a screen of connection-refused retries.
        planned = processes()
        clients = [(n, c) for n, c in planned if is_client(n)]
        for name, cmd in planned:
            if not is_client(name):
                start(name, cmd)

        def crashed() -> bool:
            return any(p.poll() is not None for _, p in running)

        ready = not clients or wait_ready(
            [f"http://{HOST}:{PORT}/accounts/login/", f"http://127.0.0.1:{WORLD_PORT}/"],
            stopping=lambda: stopping or crashed(),
        )
        if not (ready or stopping or crashed()):
            print(
                "the console or the world did not answer within 90 s; starting the agents anyway",
                flush=True,
            )
        for name, cmd in clients:
            if not (
                stopping or crashed()
            ):  # a crashed service: the loop below reports it and stops
                start(name, cmd)
        print(
            f"\ncontrolplane console: http://{HOST}:{PORT}/  (logins above; Ctrl-C stops everything)\n",
            flush=True,
        )
        while not stopping:
            for name, proc in running:
                if proc.poll() is not None:
                    print(f"{name} exited with {proc.returncode}; stopping everything", flush=True)
                    stopping = True
            time.sleep(0.5)
    finally:
        # Clients first: the agents finish their current step and release their leases while the
        # control plane and the world are still there to hear it; then the services.
        _stop([(n, p) for n, p in running if is_client(n)], grace_s=12)
        _stop([(n, p) for n, p in running if not is_client(n)], grace_s=10)
    return 0


def _stop(procs: list[tuple[str, subprocess.Popen]], grace_s: float) -> None:
    """SIGTERM each process group, wait up to ``grace_s`` for all, then SIGKILL what is left."""
    for _, proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.time() + grace_s
    for _, proc in procs:
        try:
            proc.wait(timeout=max(deadline - time.time(), 0.1))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)


if __name__ == "__main__":
    sys.exit(main())
