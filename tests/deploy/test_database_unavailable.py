"""A request on a host that lost its database: "did nothing" (503 + ``X-Controlplane-Draining: 1``,
the SDK sends it again, through the balancer to another host) told apart from "unknown" (500): the
backend (core/pg/backend/base.py) records whether a COMMIT or a write outside a transaction was sent
since the request started. docs/operations/faults.md, fault (d)."""

from __future__ import annotations

import json
import threading
import time
from uuid import UUID

import httpx
import pytest
from django.core.signals import request_started
from django.db import OperationalError, connection, transaction
from django.test import RequestFactory

from api.app import database_unavailable
from controlplane_sdk import Client
from runs.models import Agent, Run
from tests.deploy.hosts import Forwarder, start_api, start_redis
from tests.live import Procs, server_env, test_database_url

pytestmark = [pytest.mark.django_db(transaction=True)]


def _new_request() -> None:
    request_started.send(sender=None)  # what the handler sends: the record starts empty


def test_the_backend_records_whether_a_request_may_have_written(postgres_only):
    _new_request()
    assert connection.maybe_applied is False
    list(Agent.objects.all())  # a read in autocommit
    assert connection.maybe_applied is False
    with transaction.atomic():
        Agent.objects.create(name="unavail-a")
        assert connection.maybe_applied is False  # inside a transaction: nothing committed yet
    assert connection.maybe_applied is True  # its COMMIT was sent
    _new_request()
    assert connection.maybe_applied is False
    Agent.objects.filter(name="unavail-a").update(description="x")  # autocommitting write
    assert connection.maybe_applied is True


def test_the_api_answers_503_resend_when_nothing_was_sent_and_500_unknown_otherwise(postgres_only):
    request = RequestFactory().post("/api/v1/runs")
    refused = OperationalError("the database is unreachable: a connection was refused")
    _new_request()
    got = database_unavailable(request, refused)
    assert got.status_code == 503 and got["X-Controlplane-Draining"] == "1"
    connection.maybe_applied = True  # e.g. cut during its COMMIT
    got = database_unavailable(request, refused)
    assert got.status_code == 500 and not got.has_header("X-Controlplane-Draining")
    assert b"unknown" in got.content


@pytest.mark.slow
def test_a_write_to_a_host_without_its_database_is_refused_fast_and_the_sdk_resends_it(
    postgres_only, tmp_path, worker_token
):
    db = connection.settings_dict
    link = Forwarder((db.get("HOST") or "127.0.0.1", int(db.get("PORT") or 5432)))
    url = test_database_url().replace(f":{db.get('PORT') or 5432}/", f":{link.port}/")
    procs = Procs(tmp_path)
    try:
        port = start_redis(procs)
        env = server_env(tmp_path, DATABASE_URL=url, REDIS_URL=f"redis://127.0.0.1:{port}/0")
        base, _ = start_api(procs, env)
        body = {"agent": "purchasing", "goal": "unavail-direct", "authority": []}
        headers = {"Authorization": f"Bearer {worker_token}"}
        assert (
            httpx.post(f"{base}/api/v1/runs", json=body, headers=headers, timeout=20).status_code
            == 201
        )
        link.cut()
        took = []
        for _ in range(3):  # the first finds its idle connection dead, the next ones the memory
            sent = time.monotonic()
            got = httpx.post(f"{base}/api/v1/runs", json=body, headers=headers, timeout=30)
            took.append(round(time.monotonic() - sent, 2))
            assert (got.status_code, got.json()["error"]) == (503, "database_unavailable"), got.text
            assert got.headers["X-Controlplane-Draining"] == "1"
        assert max(took) < 5, took  # the pool's checkout timeout alone is 10 s
        # the SDK resends a refused-unread call; the link heals during its retries: one run
        healer = threading.Timer(1.5, link.heal)
        healer.start()
        sdk = Client(base, worker_token, timeout=20, retries=8, backoff=0.5)
        run = sdk.create_run("purchasing", "unavail-resent", authority=[])
        sdk.close()
        healer.join()
        assert list(Run.objects.filter(goal="unavail-resent").values_list("id", flat=True)) == [
            UUID(run["id"])
        ]
        print(f"direct writes refused 503 in {took} s")
    finally:
        link.cut()
        procs.stop()


@pytest.mark.slow
def test_a_black_holed_database_link_is_refused_within_seconds(
    postgres_only, tmp_path, worker_token
):
    """Bytes to the database vanish (no refusal, no reset): once a readiness probe has timed out,
    a write is refused 503 within a few seconds, though the pool holds idle connections that look
    healthy (each would have waited for TCP to give up)."""
    db = connection.settings_dict
    link = Forwarder((db.get("HOST") or "127.0.0.1", int(db.get("PORT") or 5432)))
    url = test_database_url().replace(f":{db.get('PORT') or 5432}/", f":{link.port}/")
    procs = Procs(tmp_path)
    try:
        port = start_redis(procs)
        env = server_env(
            tmp_path, DATABASE_URL=url, REDIS_URL=f"redis://127.0.0.1:{port}/0", DB_POOL_MIN="6"
        )
        base, log = start_api(procs, env)
        body = {"agent": "purchasing", "goal": "unavail-hole", "authority": []}
        headers = {"Authorization": f"Bearer {worker_token}"}
        with httpx.Client(timeout=30) as client:
            for _ in range(6):  # the pool fills with idle connections
                assert (
                    client.post(f"{base}/api/v1/runs", json=body, headers=headers).status_code
                    == 201
                )
            link.frozen = True
            probe = client.get(f"{base}/readyz")
            assert probe.status_code == 503, probe.text
            took = []
            for _ in range(2):
                sent = time.monotonic()
                got = client.post(f"{base}/api/v1/runs", json=body, headers=headers)
                took.append(round(time.monotonic() - sent, 2))
                assert (got.status_code, got.json()["error"]) == (503, "database_unavailable")
        print(f"black hole: writes refused 503 in {took} s")
        assert max(took) < 4, (took, log.read_text()[-3000:])
    finally:
        link.frozen = False
        link.cut()
        procs.stop()


def _post_in_thread(client: httpx.Client, url: str, body: dict, headers: dict) -> dict:
    """A write sent on its own thread; the dict gets its answer (status, headers, json, seconds)."""
    got: dict = {}

    def send() -> None:
        sent = time.monotonic()
        try:
            answer = client.post(url, json=body, headers=headers)
            got.update(status=answer.status_code, headers=answer.headers, text=answer.text)
        except httpx.HTTPError as err:
            got.update(status=None, text=repr(err))
        got["s"] = round(time.monotonic() - sent, 2)

    got["thread"] = threading.Thread(target=send, daemon=True)
    got["thread"].start()
    return got


@pytest.mark.slow
def test_requests_behind_a_gate_held_by_a_black_hole_are_refused_when_it_is_known(
    postgres_only, tmp_path, worker_token
):
    """Both sync-view slots (SYNC_VIEW_CONCURRENCY=2) are held by writes stuck on idle connections
    whose link went silent. A write already waiting for a slot is refused 503 (did nothing) the
    moment a refusal is noted (the readiness probe's connect times out), and a write that would
    have to wait is refused at once, while the refusal is fresh; /healthz still answers. Before
    the gate knew of the refusal memory, both waited as long as the stuck writes did (in the faults
    test, until TCP gave up on them: 6-7 s; here, whose link never resets, forever)."""
    db = connection.settings_dict
    link = Forwarder((db.get("HOST") or "127.0.0.1", int(db.get("PORT") or 5432)))
    url = test_database_url().replace(f":{db.get('PORT') or 5432}/", f":{link.port}/")
    procs = Procs(tmp_path)
    stuck: list[dict] = []
    try:
        port = start_redis(procs)
        env = server_env(
            tmp_path,
            DATABASE_URL=url,
            REDIS_URL=f"redis://127.0.0.1:{port}/0",
            DB_POOL_MIN="4",
            SYNC_VIEW_CONCURRENCY="2",
        )
        base, log = start_api(procs, env)
        body = {"agent": "purchasing", "goal": "unavail-gate", "authority": []}
        headers = {"Authorization": f"Bearer {worker_token}"}
        writes = f"{base}/api/v1/runs"
        with httpx.Client(timeout=60, limits=httpx.Limits(max_connections=8)) as client:
            for _ in range(4):
                assert client.post(writes, json=body, headers=headers).status_code == 201
            link.frozen = True
            # no refusal noted yet: each takes an idle connection that looks healthy, and hangs
            stuck = [_post_in_thread(client, writes, body, headers) for _ in range(2)]
            time.sleep(1.5)
            assert [s.get("status", "pending") for s in stuck] == ["pending"] * 2, stuck
            waiting = _post_in_thread(client, writes, body, headers)  # queued behind them
            time.sleep(1.0)
            assert "s" not in waiting, waiting  # still in the gate: nothing refused yet
            probe = client.get(f"{base}/readyz")  # its connect times out: a refusal is noted
            probed_at = time.monotonic()
            assert probe.status_code == 503, probe.text
            waiting["thread"].join(10)
            released_after = round(time.monotonic() - probed_at, 2)
            late = _post_in_thread(client, writes, body, headers)  # would have to wait
            late["thread"].join(10)
            sent = time.monotonic()
            alive = client.get(f"{base}/healthz")
            alive_s = round(time.monotonic() - sent, 2)
        print(f"gate: the waiting write answered {released_after} s after the probe; a later "
              f"write in {late.get('s', 'over 10')} s; /healthz in {alive_s} s")  # fmt: skip
        tail = log.read_text()[-3000:]
        assert waiting.get("status") == 503, (waiting, tail)
        assert waiting["headers"]["X-Controlplane-Draining"] == "1", waiting
        assert json.loads(waiting["text"])["error"] == "database_unavailable", waiting
        assert released_after < 2.0, (released_after, tail)  # by the refusal, not by a slot freed
        assert late.get("status") == 503, (late, tail)
        assert json.loads(late["text"])["error"] == "database_unavailable", late
        assert late["headers"]["X-Controlplane-Draining"] == "1", late
        assert late["s"] < 2.0, (late, tail)
        assert alive.status_code == 200 and alive_s < 1.0, (alive.status_code, alive_s)
        assert [s.get("status", "pending") for s in stuck] == ["pending"] * 2, stuck
    finally:
        link.frozen = False
        link.cut()  # the stuck writes' connections break: they end
        for s in stuck:
            s["thread"].join(20)
        procs.stop()
