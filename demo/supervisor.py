"""`make run`: start every process of the demo, restart any that dies, stop them all on Ctrl-C.

ASGI server (console + API) on :8000, a Celery worker and beat, the demo world on :8100, and the demo
agent fleet. Embedded defaults (SQLite, in-memory channel layer, SQLite Celery broker) unless
DATABASE_URL / REDIS_URL are set.

Order: the services first; the agents and the traffic once the console and the world answer; Ctrl-C
stops the agents first (their last calls are heard), then the services. A process that dies after the
demo is up is restarted with a log line and a backoff (1 s, 2 s, 4 s ... at most ``RESTART_MAX_S``; the
count starts over once it has stayed up ``RESTART_STABLE_S``) while the others keep running -- so an
operator can kill an agent and watch the control plane recover its run. A service that dies while the
demo is still starting (a taken port, a broken install) stops everything instead: restarting would only
repeat the error.

Why not honcho: it stops every process when one exits, by design (nickstenning/honcho#175; a respawn
option was never merged, #195), which is exactly the behaviour this supervisor must not have.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
HOST = os.environ.get("HOST", "127.0.0.1")
PORT = os.environ.get("PORT", "8000")
WORLD_PORT = os.environ.get("WORLD_PORT", "8100")
AGENTS = int(os.environ.get("DEMO_AGENTS", "3"))
RESTART_MIN_S = float(os.environ.get("DEMO_RESTART_MIN_S", "1"))
RESTART_MAX_S = float(os.environ.get("DEMO_RESTART_MAX_S", "30"))
RESTART_STABLE_S = float(os.environ.get("DEMO_RESTART_STABLE_S", "60"))
PRUNE_EVERY_S = 600
#: where seed_demo wrote the worker token and where the world keeps its file (settings.VAR_DIR)
VAR = Path(os.environ.get("CONTROLPLANE_VAR_DIR") or ROOT / "var")


def processes() -> list[tuple[str, list[str]]]:
    celery = [PY, "-m", "celery", "-A", "controlplane"]
    procs = [
        ("web", [PY, "manage.py", "runserver", f"{HOST}:{PORT}", "--noreload"]),
        (
            "world",
            [PY, "-m", "world", "--host", "127.0.0.1", "--port", WORLD_PORT]
            + ["--db", str(VAR / "world.sqlite3")],
        ),
        ("celery", celery + ["worker", "-l", "info", "-P", "threads", "-c", "4"]),
        ("beat", celery + ["beat", "-l", "info"]),
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


def say(text: str) -> None:
    sys.stdout.write(f"{'supervisor':>10} | {text}\n")
    sys.stdout.flush()


def _pump(name: str, stream) -> None:
    for line in iter(stream.readline, b""):
        sys.stdout.write(f"{name:>10} | {line.decode(errors='replace')}")
        sys.stdout.flush()


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"code {code}"


def backoff_s(failures: int) -> float:
    """Delay before restart number ``failures`` (1-based) of a process that keeps dying."""
    return min(RESTART_MAX_S, RESTART_MIN_S * 2 ** max(failures - 1, 0))


@dataclass
class Child:
    name: str
    cmd: list[str]
    proc: subprocess.Popen | None = None
    started_at: float = 0.0
    failures: int = 0  # deaths in a row, each before it had been up RESTART_STABLE_S
    restarts: int = 0
    restart_at: float | None = None

    def start(self, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            self.cmd,
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        self.started_at, self.restart_at = time.monotonic(), None
        threading.Thread(target=_pump, args=(self.name, self.proc.stdout), daemon=True).start()

    def exited(self) -> bool:
        return self.proc is not None and self.restart_at is None and self.proc.poll() is not None

    def schedule_restart(self) -> None:
        """Log the death, clear what the dead process left in its group, pick the restart time."""
        assert self.proc is not None
        code = self.proc.returncode
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # helpers it started, if any
        except (ProcessLookupError, PermissionError):
            pass
        up_s = time.monotonic() - self.started_at
        self.failures = 1 if up_s >= RESTART_STABLE_S else self.failures + 1
        delay = backoff_s(self.failures)
        self.restart_at = time.monotonic() + delay
        say(
            f"{self.name} (pid {self.proc.pid}) exited with {describe_exit(code)} after {up_s:.0f} s; "
            f"restarting it in {delay:.0f} s (restart #{self.restarts + 1}); the others keep running"
        )

    def restart_if_due(self, env: dict[str, str]) -> None:
        if self.restart_at is not None and time.monotonic() >= self.restart_at:
            self.restarts += 1
            self.start(env)
            assert self.proc is not None
            say(f"{self.name} restarted (pid {self.proc.pid}, restart #{self.restarts})")


def child_env() -> dict[str, str]:
    env = dict(
        os.environ,
        PYTHONUNBUFFERED="1",
        WORLD_URL=f"http://127.0.0.1:{WORLD_PORT}",
        CONTROLPLANE_URL=f"http://{HOST}:{PORT}",
    )
    # The demo agents think at human speed (demo_agents/common.py), so an operator can watch and pause.
    env.setdefault("DEMO_STEP_SECONDS", "3")
    # The traffic also starts runs of the LangGraph and OpenAI Agents SDK agents (served by every
    # demo worker: demo_agents.worker's default agent list).
    env.setdefault("DEMO_FRAMEWORK_AGENTS", "1")
    env.setdefault("DEMO_DISPATCH_SECONDS", "1.5")
    # ...and the world's processors take a while to commit (world/__main__.py --commit-delay), well
    # under the agents' 2 s world timeout (AGENT_WORLD_TIMEOUT_S), so it is latency, not a fault.
    env.setdefault("WORLD_COMMIT_SECONDS", "0.5")
    token_file = VAR / "demo-worker-token"
    if token_file.exists():
        env["CONTROLPLANE_TOKEN"] = token_file.read_text().strip()
    requester = VAR / "demo-requester-token"  # seed_demo's rita: purchases started in person
    if requester.exists():
        env["CONTROLPLANE_REQUESTER_TOKEN"] = requester.read_text().strip()
    return env


def _broker_file() -> Path | None:
    """The embedded Celery broker's SQLite file (controlplane/settings.py), None with REDIS_URL."""
    if os.environ.get("REDIS_URL"):
        return None
    return Path(os.environ.get("CELERY_BROKER_PATH") or VAR / "celery-broker.sqlite3")


def prune_broker() -> None:
    broker = _broker_file()
    if broker is not None:
        from controlplane.embedded import prune_consumed

        prune_consumed(broker)


def main() -> int:
    env = child_env()
    children = [Child(name, cmd) for name, cmd in processes()]
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    prune_broker()
    try:
        if _start_all(children, env, stop):
            say(
                f"controlplane console: http://{HOST}:{PORT}/  (logins above; Ctrl-C stops everything)"
            )
            _watch(children, env, stop)
    finally:
        # Clients first: the agents finish their current step and release their leases while the
        # control plane and the world are still there to hear it; then the services.
        _stop([c.proc for c in children if c.proc and is_client(c.name)], grace_s=12)
        _stop([c.proc for c in children if c.proc and not is_client(c.name)], grace_s=10)
    return 0


def _start_all(children: list[Child], env: dict[str, str], stop: threading.Event) -> bool:
    """Services, then (once the console and the world answer) the clients. False if a service died
    while starting (its log says why) or Ctrl-C came first."""
    services = [c for c in children if not is_client(c.name)]
    for child in services:
        child.start(env)

    def dead() -> Child | None:
        return next((c for c in services if c.proc and c.proc.poll() is not None), None)

    clients = [c for c in children if is_client(c.name)]
    ready = not clients or wait_ready(
        [f"http://{HOST}:{PORT}/accounts/login/", f"http://127.0.0.1:{WORLD_PORT}/"],
        stopping=lambda: stop.is_set() or dead() is not None,
    )
    if (failed := dead()) is not None:
        assert failed.proc is not None
        say(
            f"{failed.name} exited with {describe_exit(failed.proc.returncode)} while the demo was "
            "starting (see its log above); stopping everything"
        )
        return False
    if stop.is_set():
        return False
    if not ready:
        say("the console or the world did not answer within 90 s; starting the agents anyway")
    for child in clients:
        child.start(env)
    return True


def _watch(children: list[Child], env: dict[str, str], stop: threading.Event) -> None:
    """Until Ctrl-C: restart whatever dies, and now and then drop consumed broker messages."""
    next_prune = time.monotonic() + PRUNE_EVERY_S
    while not stop.wait(0.5):
        for child in children:
            if child.exited():
                child.schedule_restart()
            child.restart_if_due(env)
        if time.monotonic() >= next_prune:
            next_prune = time.monotonic() + PRUNE_EVERY_S
            prune_broker()


def _stop(procs: list[subprocess.Popen], grace_s: float) -> None:
    """SIGTERM each process group, wait up to ``grace_s`` for all, then SIGKILL what is left."""
    for proc in procs:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.time() + grace_s
    for proc in procs:
        try:
            proc.wait(timeout=max(deadline - time.time(), 0.1))
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the process, or what it left in its group
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait(timeout=5)


if __name__ == "__main__":
    sys.exit(main())
