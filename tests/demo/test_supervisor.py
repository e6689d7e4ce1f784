"""demo.supervisor (`make run`): on Ctrl-C the agents and the traffic stop first, while the control plane
and the world are still up to hear their last calls; the services stop after them. Real processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CHILD = textwrap.dedent("""
    import signal, sys, time
    name, log, linger = sys.argv[1], sys.argv[2], float(sys.argv[3])
    def on_term(*_):
        with open(log, "a") as f:
            f.write(f"term {name} {time.monotonic()}\\n")
        time.sleep(linger)  # an agent finishing its step
        with open(log, "a") as f:
            f.write(f"exit {name} {time.monotonic()}\\n")
        sys.exit(0)
    signal.signal(signal.SIGTERM, on_term)
    with open(log, "a") as f:
        f.write(f"up {name} {time.monotonic()}\\n")
    while True:
        time.sleep(0.1)
""")

SUPERVISOR = textwrap.dedent("""
    import sys
    from demo import supervisor
    child, log = sys.argv[1], sys.argv[2]
    def fake():
        def cmd(name, linger):
            return [sys.executable, child, name, log, str(linger)]
        return [("web", cmd("web", 0)), ("world", cmd("world", 0)), ("traffic", cmd("traffic", 0.2)),
                ("agent-1", cmd("agent-1", 1.0))]
    supervisor.processes = fake

    def ready(urls, timeout_s=90.0, stopping=lambda: False):
        # Stands in for the HTTP check: ready once both services have started.
        import os, time
        def services_up():
            if not os.path.exists(log):
                return 0
            return sum(line.split()[1] in ("web", "world") for line in open(log) if line.startswith("up "))
        while services_up() < 2:
            time.sleep(0.05)
        with open(log, "a") as f:
            f.write(f"ready all {time.monotonic()}\\n")
        return True

    supervisor.wait_ready = ready
    sys.exit(supervisor.main())
""")


def _events(log: Path) -> list[tuple[str, str, float]]:
    rows = [line.split() for line in log.read_text().splitlines()] if log.exists() else []
    return [(kind, name, float(t)) for kind, name, t in rows]


def test_wait_ready_waits_for_an_answer_and_gives_up_at_its_timeout():
    import http.server
    import socket
    import threading

    from demo.supervisor import wait_ready

    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), http.server.BaseHTTPRequestHandler
    )  # answers 501
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        assert (
            wait_ready(
                [f"http://127.0.0.1:{server.server_address[1]}/accounts/login/"], timeout_s=5
            )
            is True
        )
    finally:
        server.shutdown()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    started = time.monotonic()
    assert wait_ready([f"http://127.0.0.1:{closed}/"], timeout_s=0.6) is False
    assert time.monotonic() - started < 5
    assert wait_ready([f"http://127.0.0.1:{closed}/"], timeout_s=30, stopping=lambda: True) is False


def test_services_start_first_and_ctrl_c_stops_agents_before_the_services(tmp_path):
    child, log = tmp_path / "child.py", tmp_path / "events.log"
    child.write_text(CHILD)
    proc = subprocess.Popen(
        [sys.executable, "-c", SUPERVISOR, str(child), str(log)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while sum(kind == "up" for kind, _, _ in _events(log)) < 4:
            assert time.monotonic() < deadline, _events(log)
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)  # what Ctrl-C delivers to the supervisor
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    at = {(kind, name): t for kind, name, t in _events(log)}
    # Started in order: services, then (once they answer) the clients.
    for service in ("web", "world"):
        assert at[("up", service)] < at[("ready", "all")], at
    for client in ("agent-1", "traffic"):
        assert at[("up", client)] > at[("ready", "all")], at
    for service in ("web", "world"):
        assert ("term", service) in at, at
        for client in ("agent-1", "traffic"):
            assert at[("exit", client)] <= at[("term", service)], (client, service, at)


def test_a_service_that_dies_while_the_demo_starts_stops_everything_instead_of_looping(tmp_path):
    """A taken port or a broken install: restarting would only repeat the error."""
    child, log = tmp_path / "child.py", tmp_path / "events.log"
    child.write_text(CHILD)
    script = SUPERVISOR.replace(
        '("world", cmd("world", 0))', '("world", [sys.executable, "-c", "raise SystemExit(3)"])'
    ).replace("while services_up() < 2:", "while not stopping():")  # until the supervisor sees it
    proc = subprocess.run(
        [sys.executable, "-c", script, str(child), str(log)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0
    assert "world exited with code 3 while the demo was starting" in proc.stdout
    assert "restart" not in proc.stdout
    names = {name for kind, name, _ in _events(log) if kind == "up"}
    assert "agent-1" not in names and "traffic" not in names  # the clients never started


def test_restart_backoff_doubles_up_to_its_cap():
    from demo.supervisor import RESTART_MAX_S, backoff_s

    assert [backoff_s(n) for n in (1, 2, 3, 4)] == [1, 2, 4, 8]
    assert backoff_s(50) == RESTART_MAX_S == 30
