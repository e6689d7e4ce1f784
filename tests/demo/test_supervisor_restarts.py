"""`make run` keeps going when one of its processes dies: the real supervisor, on the embedded defaults
(SQLite, the SQLite Celery broker), with the real console, world, Celery worker and beat, traffic and
two demo agent workers. A SIGKILLed agent and a SIGKILLed Celery worker are each restarted with a log
line while every other process keeps its pid; Ctrl-C then stops everything and leaves nothing behind."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import pytest

from tests.demo.embedded import embedded_env, start_demo
from tests.live import free_port, wait_for

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def _children(ppid: int) -> dict[str, int]:
    """Supervised processes of ``ppid`` by supervisor name (from their command lines)."""
    out = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) != ppid:
                continue
            cmd = (stat.parent / "cmdline").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        text = " ".join(c.decode() for c in cmd)
        if m := re.search(r"--name demo-worker-(\d+)", text):
            out[f"agent-{m.group(1)}"] = int(stat.parent.name)
        for name, marker in (
            ("celery", " worker "),
            ("beat", " beat "),
            ("web", "runserver"),
            ("world", "-m world"),
            ("traffic", "demo_agents.traffic"),
        ):
            if marker in text:
                out[name] = int(stat.parent.name)
    return out


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"


def test_a_killed_agent_and_a_killed_celery_worker_are_restarted_and_the_rest_keeps_running(
    tmp_path,
):
    env = embedded_env(
        tmp_path,
        PORT=str(free_port()),
        WORLD_PORT=str(free_port()),
        DEMO_AGENTS="2",
        DEMO_STEP_SECONDS="0.2",
        DEMO_DISPATCH_SECONDS="0.1",
        WORLD_COMMIT_SECONDS="0.1",
        DEMO_RESTART_MIN_S="0.5",
    )
    sup, log = start_demo(tmp_path, env)
    text = log.read_text
    seen: set[int] = set()
    try:
        wait_for(
            "the demo to be up",
            lambda: (
                "celery@" in text()
                and " ready." in text()
                and text().count("demo_agents.worker demo-worker-") >= 2
            ),
            120,
            logs=(log,),
        )
        before = _children(sup.pid)
        assert set(before) == {"web", "world", "celery", "beat", "traffic", "agent-1", "agent-2"}
        seen |= set(before.values())

        os.kill(before["agent-1"], signal.SIGKILL)
        wait_for(
            "agent-1 to be restarted",
            lambda: (
                "agent-1 restarted" in text()
                and text().count("demo_agents.worker demo-worker-1 started") == 2
            ),
            60,
            logs=(log,),
        )
        assert re.search(
            rf"agent-1 \(pid {before['agent-1']}\) exited with signal SIGKILL .*restarting it",
            text(),
        )

        os.kill(before["celery"], signal.SIGKILL)
        wait_for(
            "the Celery worker to be restarted and to take jobs again",
            lambda: (
                "celery restarted" in text()
                and text().count(" ready.") >= 2
                and "succeeded" in text().rsplit(" ready.", 1)[1]
            ),
            90,
            logs=(log,),
        )
        assert re.search(rf"celery \(pid {before['celery']}\) exited with signal SIGKILL", text())

        after = _children(sup.pid)
        seen |= set(after.values())
        assert after["agent-1"] != before["agent-1"] and after["celery"] != before["celery"]
        untouched = {"web", "world", "beat", "traffic", "agent-2"}
        assert {n: after[n] for n in untouched} == {n: before[n] for n in untouched}
        assert "stopping everything" not in text()
        # the restarted agent works: a run it finishes after its restart
        wait_for(
            "the restarted agent-1 to finish a run",
            lambda: re.search(
                r"agent-1 \| .*demo-worker-1 .*run \S+: succeeded",
                text().rsplit("agent-1 restarted", 1)[1],
            ),
            90,
            logs=(log,),
        )
    finally:
        sup.send_signal(signal.SIGINT)  # Ctrl-C
        try:
            assert sup.wait(timeout=60) == 0
        finally:
            if sup.poll() is None:
                os.killpg(sup.pid, signal.SIGKILL)
    left = [pid for pid in seen if _alive(pid)]
    assert not left, f"still running after Ctrl-C: {left}"
