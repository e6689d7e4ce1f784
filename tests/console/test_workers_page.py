"""The Workers page (issue 18, item 9): which workers are alive, when each was last heard, the runs
and leases it holds, its versions, and the leases that ran out in the last hour; "view" role only,
linked from the nav."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from core import live
from interventions.recover import scan_expired_leases
from runs.models import ExecutionLease
from tests.conftest import declare, start_run
from tests.console.test_run_pages import IN_MEMORY_LAYER, _session_headers, browser

pytestmark = pytest.mark.django_db

VERSIONS = {"code": "agent 2.4.0", "tools": {"payments": "3.1"}}


def _claim(worker, run_id: str, name: str) -> dict:
    resp = worker.post(f"/runs/{run_id}/claim", {"worker": name, "versions": VERSIONS})
    assert resp.status_code == 200, resp.content
    return resp.json()


def _row(html: str, worker: str) -> str:
    """The worker's row (its versions cell holds a table of its own: cut at the next worker)."""
    m = re.search(
        rf'<tr data-worker="{worker}">(.*?)(?=<tr data-worker=|id="lease-expiries")', html, re.S
    )
    assert m, f"no row for {worker}"
    return m.group(1)


def test_alive_and_gone_workers_their_runs_versions_and_the_last_hours_expiries(cast, worker):
    held = start_run(worker)
    lost = start_run(worker, goal="the one whose worker died")
    claim = _claim(worker, held["id"], "worker-7")
    lease = claim["lease"]
    assert (
        worker.post(
            f"/leases/{lease['id']}/heartbeat", {"fencing_token": lease["fencing_token"]}
        ).status_code
        == 200
    )
    _claim(worker, lost["id"], "worker-9")
    # worker-9 went quiet 10 minutes ago: its lease ran out and the beat's scan ended it.
    ago = timezone.now() - timedelta(minutes=10)
    ExecutionLease.objects.filter(run_id=lost["id"]).update(
        granted_at=ago, last_heartbeat_at=None, expires_at=ago + timedelta(seconds=30)
    )
    assert scan_expired_leases(grace_s=0) == [lost["id"]]

    client = Client()
    client.force_login(cast["vera"][0])  # a viewer: reading is enough
    resp = client.get("/workers/")
    assert resp.status_code == 200
    html = resp.content.decode()

    alive = _row(html, "worker-7")
    assert "alive" in alive and held["id"] in alive  # it holds this run's lease
    assert f"lease #{lease['fencing_token']}" in alive
    assert "3.1" in alive and "agent 2.4.0" in alive  # the versions it reported at claim
    gone = _row(html, "worker-9")
    assert "not heard for a while" in gone and lost["id"] not in gone  # it holds nothing now
    assert re.search(r'<span class="flag bad">1</span>', gone)  # one lease expired this hour
    assert "1 alive · 2 heard from" in html

    expiries = html.split('id="lease-expiries"')[1]
    assert "worker-9" in expiries and lost["id"] in expiries and "worker-7" not in expiries
    assert "expired without release" in expiries
    # the nav links to it, marked current
    assert re.search(r'<a href="/workers/"\s+aria-current="page">Workers</a>', html)


def test_an_expiry_older_than_an_hour_and_its_worker_are_not_shown(cast, worker):
    run = start_run(worker)
    _claim(worker, run["id"], "worker-old")
    long_ago = timezone.now() - timedelta(hours=3)
    ExecutionLease.objects.filter(run_id=run["id"]).update(
        granted_at=long_ago,
        expires_at=long_ago,
        status=ExecutionLease.EXPIRED,
        ended_at=long_ago,
        end_reason="expired without release",
    )
    client = Client()
    client.force_login(cast["vera"][0])
    html = client.get("/workers/").content.decode()
    assert "worker-old" not in html
    assert "No worker has claimed a run in the last 60 minutes." in html
    assert "No lease ran out in the last hour." in html


def test_the_page_needs_a_login_and_a_role(cast):
    assert Client().get("/workers/")["Location"].startswith("/accounts/login/")
    nobody = User.objects.create_user("nobody", password="pw-nobody")
    client = Client()
    client.force_login(nobody)
    assert client.get("/workers/").status_code == 403
    # it refreshes itself as a fragment
    client.force_login(cast["otto"][0])
    part = client.get("/workers/", HTTP_HX_REQUEST="true")
    assert part.status_code == 200 and part.content.decode().lstrip().startswith(
        '<div id="workers"'
    )


@pytest.mark.django_db(transaction=True)
def test_its_socket_pushes_a_claim_and_a_leases_end_and_nothing_for_a_busy_runs_effects(
    cast, worker, settings
):
    """/ws/runs/?view=workers: the section on connect, redrawn by a claim (attempt_started) and a
    lease's end; a checkpoint or an effect of the run it holds costs the page nothing."""
    from controlplane.asgi import application

    settings.CHANNEL_LAYERS = IN_MEMORY_LAYER
    held = start_run(worker)
    later = start_run(worker, goal="claimed while the page is open")
    headers = _session_headers(browser(cast, "vera"))

    async def drain(page: WebsocketCommunicator) -> None:
        await database_sync_to_async(live.flush)(5)
        while not await page.receive_nothing(timeout=0.3):
            await page.receive_from(timeout=1)

    async def scenario() -> None:
        page = WebsocketCommunicator(application, "/ws/runs/?view=workers", headers=headers)
        assert (await page.connect(timeout=5))[0]
        first = await page.receive_from(timeout=5)
        assert 'id="workers"' in first and 'hx-swap-oob="true"' in first
        lease = (await database_sync_to_async(_claim)(worker, held["id"], "worker-7"))["lease"]
        await database_sync_to_async(live.flush)(5)
        assert "worker-7" in await page.receive_from(timeout=5)
        await drain(page)
        # The busy run's effects and checkpoints: not the page's business.
        token = lease["fencing_token"]
        await database_sync_to_async(declare)(worker, held["id"], token, key="busy-1")
        ok = await database_sync_to_async(worker.post)(
            f"/runs/{held['id']}/checkpoints",
            {"fencing_token": token, "step": "s-1", "state": {"i": 1}},
        )
        assert ok.status_code == 201, ok.content
        await database_sync_to_async(live.flush)(5)
        assert await page.receive_nothing(timeout=1.0)
        # Another worker starts claiming; then worker-7 lets its lease go.
        await database_sync_to_async(_claim)(worker, later["id"], "worker-8")
        await database_sync_to_async(live.flush)(5)
        assert 'data-worker="worker-8"' in await page.receive_from(timeout=5)
        await drain(page)
        gone = await database_sync_to_async(worker.post)(
            f"/leases/{lease['id']}/release", {"fencing_token": token, "reason": "done"}
        )
        assert gone.status_code == 200, gone.content
        await database_sync_to_async(live.flush)(5)
        assert "worker-7" in await page.receive_from(timeout=5)
        await page.disconnect()

    async_to_sync(scenario)()
