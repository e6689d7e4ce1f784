"""The server heartbeats every console socket (core.live, through the sender thread and the channel
layer; on the embedded bus, through its file), so a page can tell "live" from "silent"
(static/console/liveness.js). The browser side is tests/demo/test_live_across_processes.py."""

from __future__ import annotations

import sqlite3
import time

import pytest
from asgiref.sync import async_to_sync
from django.conf import settings
from django.test import Client

from console.consumers import BEAT_FRAME
from core import live
from core.live_bus import SQLiteBusLayer
from tests.conftest import start_run

pytestmark = pytest.mark.django_db(transaction=True)


def test_an_open_run_page_hears_a_heartbeat_every_interval_through_the_bus(
    cast, worker, tmp_path, monkeypatch
):
    from channels.layers import channel_layers
    from channels.testing import WebsocketCommunicator

    from controlplane.asgi import application

    run = start_run(worker)
    assert live.flush()
    bus = tmp_path / "bus.sqlite3"
    # Not override_settings: Django's is per context, and core.live's sender thread (started before
    # this test) would still see the suite's layer. The manager's cache is shared by every thread.
    monkeypatch.setitem(
        channel_layers.backends,
        "default",
        SQLiteBusLayer(path=str(bus), round_trip_groups=[live.BEAT_GROUP]),
    )
    monkeypatch.setattr(settings, "LIVE_HEARTBEAT_S", 0.3)
    monkeypatch.setattr(live._sender, "beats", 0.0)  # restored after: no beats for other tests
    client = Client()
    client.force_login(cast["otto"][0])
    headers = [
        (b"origin", b"http://testserver"),
        (b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode()),
        (b"host", b"testserver"),
    ]

    async def scenario() -> list[float]:
        page = WebsocketCommunicator(application, f"/ws/runs/{run['id']}/", headers=headers)
        assert (await page.connect(timeout=5))[0]
        assert 'id="run-header"' in await page.receive_from(timeout=5)  # the connect's render
        beats: list[float] = []
        start = time.monotonic()
        while time.monotonic() - start < 1.8:
            # (no short timeout: a communicator's timeout cancels the consumer)
            frame = await page.receive_from(timeout=3)
            if frame == BEAT_FRAME:
                beats.append(round(time.monotonic() - start, 2))
        await page.disconnect()
        return beats

    beats = async_to_sync(scenario)()
    # one every 0.3 s: about six in 1.8 s (a busy machine may bunch or delay a few)
    assert 3 <= len(beats) <= 10, beats
    assert beats[-1] > 1.0, beats  # still coming at the end, not a burst at the start
    with sqlite3.connect(bus) as conn:
        rows = conn.execute("SELECT count(*) FROM messages WHERE grp = ?", (live.BEAT_GROUP,))
        assert rows.fetchone()[0] >= 3  # each took the file, not a shortcut in memory
