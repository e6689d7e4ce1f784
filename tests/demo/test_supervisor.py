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
    sys.exit(supervisor.main())
""")


def _events(log: Path) -> list[tuple[str, str, float]]:
    rows = [line.split() for line in log.read_text().splitlines()] if log.exists() else []
    return [(kind, name, float(t)) for kind, name, t in rows]


def test_ctrl_c_stops_agents_before_the_services(tmp_path):
    child, log = tmp_path / "child.py", tmp_path / "events.log"
    child.write_text(CHILD)
    proc = subprocess.Popen([sys.executable, "-c", SUPERVISOR, str(child), str(log)], cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
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
    for service in ("web", "world"):
        assert ("term", service) in at, at
        for client in ("agent-1", "traffic"):
            assert at[("exit", client)] <= at[("term", service)], (client, service, at)
