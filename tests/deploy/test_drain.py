"""Graceful drain of the API process (controlplane/serve.py, docs/operations/drain.md), on real
processes: SIGTERM stops new connections, refuses new requests on open ones with a resendable 503,
answers an open long-poll at once with the reconnect header, closes the console's socket with 1012,
lets the request in flight finish and exits 0 -- within DRAIN_TIMEOUT_S even when one does not."""

from __future__ import annotations

import os
import signal
import threading
import time

import httpx
import psycopg
import pytest

from controlplane_sdk import Client
from runs.models import Run
from tests.deploy.hosts import start_api, start_redis
from tests.e2e.test_socket_daphne import _close_code, _log_in, _open, _server_password
from tests.live import server_env, test_database_url, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

RUN_BODY = {
    "agent": "purchasing",
    "goal": "drain",
    "input": {},
    "versions": {"code": "1.0.0"},
    "authority": [{"scope": "payments:charge", "ttl_s": 3600}],
}


def _api(procs, tmp_path, **env):
    redis = start_redis(procs)
    return start_api(procs, server_env(tmp_path, REDIS_URL=f"redis://127.0.0.1:{redis}/0", **env))


class LockedRun:
    """Holds the run row's lock from outside the server, so a claim of it stays in flight."""

    def __init__(self, run_id: str) -> None:
        self.conn = psycopg.connect(test_database_url())
        self.conn.execute(f"SELECT 1 FROM {Run._meta.db_table} WHERE id = %s FOR UPDATE", [run_id])

    def release(self) -> None:
        if not self.conn.closed:
            self.conn.rollback()
            self.conn.close()


@pytest.fixture
def lock_run():
    """``lock_run(run_id)``; every lock is released before the test database is emptied."""
    held: list[LockedRun] = []

    def lock(run_id: str) -> LockedRun:
        held.append(LockedRun(run_id))
        return held[-1]

    yield lock
    for one in held:
        one.release()


def _in_thread(fn) -> dict:
    box: dict = {}

    def go():
        started = time.monotonic()
        try:
            box["value"] = fn()
        except Exception as exc:  # the assertion reads it
            box["error"] = exc
        box["s"] = time.monotonic() - started

    box["thread"] = threading.Thread(target=go, daemon=True)
    box["thread"].start()
    return box


def test_sigterm_answers_the_long_poll_closes_sockets_and_finishes_the_request_in_flight(
    procs, tmp_path, worker_token, cast, lock_run
):
    base, log = _api(procs, tmp_path, DRAIN_TIMEOUT_S="20")
    api = procs.get("api")
    sdk = Client(base, worker_token, timeout=30)
    polled = sdk.create_run(**RUN_BODY)
    claim = sdk.claim(polled["id"], "worker-1")
    held = sdk.create_run(**RUN_BODY)

    long_poll = _in_thread(
        lambda: httpx.post(
            f"{base}/api/v1/leases/{claim.lease.id}/heartbeat",
            json={"fencing_token": claim.lease.fencing_token, "wait_s": 20},
            headers={"Authorization": f"Bearer {worker_token}"},
            timeout=40,
        )
    )
    _server_password(cast["otto"][0], "pw-otto")
    socket = _open(base, _log_in(base, "otto"))
    lock = lock_run(held["id"])
    in_flight = _in_thread(lambda: sdk.claim(held["id"], "worker-2"))
    kept_open = httpx.Client(base_url=base, timeout=10)  # a keep-alive connection made before
    assert kept_open.get("/healthz").status_code == 200
    time.sleep(1.0)  # the long-poll waits on the bus, the claim on the row lock
    assert "value" not in long_poll and "value" not in in_flight

    sigterm_at = time.monotonic()
    os.kill(api.pid, signal.SIGTERM)

    long_poll["thread"].join(5)
    answer = long_poll["value"]
    assert answer.status_code == 200, answer.text
    assert answer.headers["x-controlplane-reconnect"] == "1"
    assert answer.headers["connection"] == "close"
    assert answer.json()["directive"] == "continue"
    assert time.monotonic() - sigterm_at < 3
    assert _close_code(socket, within=3) == 1012
    # new connections are refused; a request on an open one is refused unread, resendable
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{base}/healthz", timeout=2)
    refused = kept_open.post("/api/v1/runs", json=RUN_BODY, headers={"Authorization": "Bearer x"})
    assert refused.status_code == 503 and refused.headers["x-controlplane-draining"] == "1"
    assert refused.json()["error"] == "draining"

    time.sleep(1.0)
    assert api.poll() is None, "exited with a request still in flight"
    lock.release()
    in_flight["thread"].join(10)
    assert "error" not in in_flight, in_flight.get("error")
    assert in_flight["value"].lease.fencing_token >= 1
    assert api.wait(timeout=10) == 0
    took = time.monotonic() - sigterm_at
    assert took < 10, took
    assert Run.objects.get(pk=held["id"]).state == "running"  # the claim committed
    text = log.read_text()
    assert "draining" in text and "drained in" in text, text[-2000:]


def test_a_request_that_will_not_finish_is_cut_off_at_the_drain_bound(
    procs, tmp_path, worker_token, lock_run
):
    base, log = _api(procs, tmp_path, DRAIN_TIMEOUT_S="2")
    api = procs.get("api")
    sdk = Client(base, worker_token, timeout=30)
    held = sdk.create_run(**RUN_BODY)
    lock_run(held["id"])
    _in_thread(lambda: sdk.claim(held["id"], "worker-2"))
    time.sleep(0.5)
    sigterm_at = time.monotonic()
    os.kill(api.pid, signal.SIGTERM)
    wait_for("the process to exit", lambda: api.poll() is not None, 10, logs=(log,))
    took = time.monotonic() - sigterm_at
    assert 1.8 < took < 2 + 2 + 2, took  # the bound, the hard exit's grace, a loaded machine
    assert api.returncode == 1  # cut off: not a clean exit
    assert "requests cut off at the bound" in log.read_text()
