"""core/live_bus.py, the embedded default's channel layer: a group_send in one process reaches the
group's members in another (the Celery worker's facts reach the web process's pages), within a
second; nothing is written to the file while no other process listens; the heartbeat's group always
takes the file. Real processes, a real SQLite file."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import subprocess
import sys
import textwrap
import time

from core.live_bus import SQLiteBusLayer
from tests.live import ROOT

SENDER = textwrap.dedent("""
    import asyncio, sys, time
    from core.live_bus import SQLiteBusLayer
    layer = SQLiteBusLayer(path=sys.argv[1])
    async def main():
        for i in range(int(sys.argv[2])):
            await layer.group_send("run.r1", {"type": "run.changed", "run_id": "r1", "i": i,
                                              "sent": time.time()})
            await asyncio.sleep(0.1)
    asyncio.run(main())
    print("rows", layer._others_listening(), flush=True)
""")


def _rows(path) -> int:
    with sqlite3.connect(path) as conn:
        return conn.execute("SELECT count(*) FROM messages").fetchone()[0]


def test_a_group_send_in_another_process_reaches_a_member_here_within_a_second(tmp_path):
    path = str(tmp_path / "bus.sqlite3")
    layer = SQLiteBusLayer(path=path)

    async def scenario() -> list[float]:
        channel = await layer.new_channel()
        await layer.group_add("run.r1", channel)  # this process now listens
        await asyncio.sleep(0.2)
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", SENDER, path, "5", cwd=ROOT, stdout=subprocess.PIPE
        )
        latencies = []
        for i in range(5):
            message = await asyncio.wait_for(layer.receive(channel), timeout=15)
            assert message["type"] == "run.changed" and message["i"] == i  # in order, none lost
            latencies.append(time.time() - message["sent"])
        await proc.wait()
        return latencies

    latencies = asyncio.run(scenario())
    assert max(latencies) < 1.0, latencies
    assert _rows(path) == 5


def test_nothing_is_written_while_no_other_process_listens_and_members_here_still_hear(tmp_path):
    path = str(tmp_path / "bus.sqlite3")
    layer = SQLiteBusLayer(path=path)

    async def scenario() -> dict:
        channel = await layer.new_channel()
        await layer.group_add("run.r1", channel)
        await layer.group_send("run.r1", {"type": "run.changed", "run_id": "r1"})
        return await asyncio.wait_for(layer.receive(channel), timeout=5)

    assert asyncio.run(scenario())["run_id"] == "r1"
    assert _rows(path) == 0, "the only listener is this process: no row for anybody"
    # A process with no sockets (the worker) writes rows for the listener here...
    proc = subprocess.run(
        [sys.executable, "-c", SENDER, path, "2"], cwd=ROOT, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert "rows True" in proc.stdout and _rows(path) == 2
    # ...and none on a bus nobody reads
    lonely = str(tmp_path / "lonely.sqlite3")
    proc = subprocess.run(
        [sys.executable, "-c", SENDER, lonely, "2"], cwd=ROOT, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert "rows False" in proc.stdout and _rows(lonely) == 0


def test_the_heartbeat_group_always_travels_through_the_file_even_to_members_here(tmp_path):
    path = str(tmp_path / "bus.sqlite3")
    layer = SQLiteBusLayer(path=path, round_trip_groups=["live.beat"])

    async def scenario() -> dict:
        channel = await layer.new_channel()
        await layer.group_add("live.beat", channel)
        await layer.group_send("live.beat", {"type": "live.beat", "at": 1.0})
        return await asyncio.wait_for(layer.receive(channel), timeout=5)

    assert asyncio.run(scenario()) == {"type": "live.beat", "at": 1.0}
    with sqlite3.connect(path) as conn:
        (body,) = conn.execute("SELECT body FROM messages WHERE grp = 'live.beat'").fetchone()
    assert json.loads(body)["type"] == "live.beat"


def test_sends_from_other_threads_reach_the_members_on_their_own_loop(tmp_path):
    """core.live's sender thread runs its own event loop: the layer hands its sends to the loop the
    sockets live on (channels' in-memory queues are not thread-safe)."""
    import threading

    layer, threads = SQLiteBusLayer(path=str(tmp_path / "bus.sqlite3")), 4

    async def scenario() -> set:
        channel = await layer.new_channel()
        await layer.group_add("runs", channel)

        def send(n: int) -> None:
            asyncio.run(layer.group_send("runs", {"type": "runs.changed", "n": n}))

        workers = [threading.Thread(target=send, args=(n,)) for n in range(threads)]
        for w in workers:
            w.start()
        got = {(await asyncio.wait_for(layer.receive(channel), timeout=5))["n"] for _ in workers}
        for w in workers:
            await asyncio.to_thread(w.join)  # (each waits for this loop to take its send)
        return got

    assert asyncio.run(scenario()) == set(range(threads))
