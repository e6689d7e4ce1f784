"""The world's commit latency (``--commit-delay`` / WORLD_COMMIT_SECONDS): what keeps a demo effect in
flight long enough for an operator to see it and pause around it. Only mutating calls wait; reads and
the admin routes answer at once, so reconciliation and the tests' control stay fast."""

from __future__ import annotations

import threading
import time

from world.client import WorldClient
from world.server import make_server


def test_a_mutating_call_takes_the_commit_delay_and_a_read_does_not(tmp_path):
    server = make_server("127.0.0.1", 0, str(tmp_path / "world.sqlite3"), commit_delay_s=0.6)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    host, port = server.socket.getsockname()[:2]
    try:
        with WorldClient(f"http://{host}:{port}", timeout=5) as world:
            started = time.monotonic()
            world.reserve("sku-1", 1, idempotency_key="order-1:reserve")
            mutated = time.monotonic() - started
            started = time.monotonic()
            world.list_items()
            world.set_price("sku-1", 11.0)
            read = time.monotonic() - started
    finally:
        server.shutdown()
        thread.join(5)
        server.server_close()
        server.world.close()
    assert mutated >= 0.6 * 0.5  # jittered 0.5-1.5x
    assert read < 0.25
