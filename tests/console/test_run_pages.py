"""The operator console's run pages: login, roles, buttons from the state table, htmx partials, and
the live WebSocket (rejections and a push after a committed transition)."""

from __future__ import annotations

import re

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import User
from django.test import Client, override_settings

from core import live
from core.roles import may, roles_of
from interventions.plugins import REGISTRY
from runs.models import Run
from runs.states import State, allowed_events
from tests.conftest import claim, declare, start_run

pytestmark = pytest.mark.django_db

IN_MEMORY_LAYER = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}


def browser(cast, username: str) -> Client:
    client = Client()
    assert client.login(username=username, password=f"pw-{username}")
    return client


def offered(html: str) -> set[str]:
    return set(re.findall(r'data-kind="([a-z_]+)"', html))


def test_it_requires_login_for_every_console_page(cast, worker):
    run = start_run(worker)
    anonymous = Client()
    for path in [
        "/",
        f"/runs/{run['id']}/",
        "/approvals/",
        "/audit/",
        "/contracts/",
        "/audit/verify/",
        f"/runs/{run['id']}/interventions/new/?kind=pause",
    ]:
        resp = anonymous.get(path)
        assert resp.status_code == 302, path
        assert resp["Location"].startswith("/accounts/login/?next="), path


def test_it_sends_an_htmx_request_without_a_session_to_the_login_page(cast):
    resp = Client().get("/", HTTP_HX_REQUEST="true", HTTP_HX_CURRENT_URL="http://testserver/runs/")
    assert resp.status_code == 200
    assert resp["HX-Redirect"].startswith("/accounts/login/?next=")


def test_it_logs_in_through_the_login_page_and_out_by_post(cast):
    client = Client()
    page = client.get("/accounts/login/")
    assert page.status_code == 200 and b'name="password"' in page.content
    resp = client.post("/accounts/login/", {"username": "otto", "password": "pw-otto", "next": "/"})
    assert resp.status_code == 302 and resp["Location"] == "/"
    landing = Client()
    resp = landing.post("/accounts/login/", {"username": "otto", "password": "pw-otto"})
    assert resp["Location"] == "/?attention=1"  # without a next: the runs that need an operator
    assert b'aria-current="page">Needs attention' in landing.get(resp["Location"]).content
    assert client.get("/").status_code == 200
    assert client.get("/accounts/logout/").status_code == 405  # logout is a POST
    assert client.post("/accounts/logout/").status_code == 302
    assert client.get("/").status_code == 302


def test_it_refuses_a_user_without_a_role(cast):
    User.objects.create_user("nobody", password="pw-nobody")
    client = Client()
    client.login(username="nobody", password="pw-nobody")
    resp = client.get("/")
    assert resp.status_code == 403
    assert b"403" in resp.content and b"no role" in resp.content


def test_viewer_sees_runs_but_no_action_buttons(cast, worker):
    run = start_run(worker, goal="restock the warehouse")
    claim(worker, run["id"])
    vera = browser(cast, "vera")
    listing = vera.get("/")
    assert listing.status_code == 200
    assert run["id"][:8].encode() in listing.content and b"restock the warehouse" in listing.content
    assert b'class="badge s-running' in listing.content
    detail = vera.get(f"/runs/{run['id']}/")
    assert detail.status_code == 200
    assert offered(detail.content.decode()) == set()
    assert b"worker-7" in detail.content  # execution lease holder facet


@pytest.mark.parametrize("username", ["otto", "april", "ian", "sam", "ada"])
def test_buttons_are_the_state_tables_events_that_the_role_may_issue(cast, worker, username):
    run = start_run(worker)
    token = claim(worker, run["id"])["lease"]["fencing_token"]
    assert declare(worker, run["id"], token).status_code == 201  # in flight: reconcile is offered
    html = browser(cast, username).get(f"/runs/{run['id']}/").content.decode()
    roles = roles_of(cast[username][0])
    allowed = set(allowed_events(State.RUNNING))
    expected = {
        kind
        for kind, c in REGISTRY.items()
        if (c.event in allowed if c.event is not None else True)
        and may(roles, kind)
        and kind not in ("approve", "reject", "restore_authority")
    }  # nothing pending, nothing suspended
    assert offered(html) == expected
    if username == "otto":
        assert {"pause", "cancel", "transfer", "reconcile"} <= expected and "resume" not in expected


def test_list_filters_by_state_agent_and_owner(cast, worker, as_user):
    running = start_run(worker, goal="running one")
    claim(worker, running["id"])
    start_run(worker, goal="queued one")
    otto = browser(cast, "otto")
    only_running = otto.get("/?state=running").content
    assert b"running one" in only_running and b"queued one" not in only_running
    both = otto.get("/?state=running,queued&agent=purchasing").content
    assert b"running one" in both and b"queued one" in both
    assert b"No runs match" in otto.get("/?agent=nope").content
    as_user("otto").post(
        f"/runs/{running['id']}/interventions",
        {
            "kind": "transfer",
            "reason": "mine now",
            "options": {"facets": ["assignment"], "to": "olga"},
        },
    )
    by_owner = otto.get("/?owner=olga").content
    assert b"running one" in by_owner and b"queued one" not in by_owner


def test_an_htmx_request_gets_only_the_partial(cast, worker):
    run = start_run(worker)
    otto = browser(cast, "otto")
    full = otto.get("/").content
    assert b"<html" in full and b'id="run-table"' in full
    part = otto.get("/?state=queued", HTTP_HX_REQUEST="true").content
    assert (
        b"<html" not in part
        and part.lstrip().startswith(b'<div id="run-live"')
        and run["id"][:8].encode() in part
    )
    ledger = otto.get(f"/runs/{run['id']}/?part=ledger", HTTP_HX_REQUEST="true").content
    assert ledger.lstrip().startswith(b'<section id="run-ledger"') and b"<html" not in ledger
    assert b'id="run-header"' not in ledger


def test_detail_shows_ledger_facets_timeline_leases_and_audit(cast, worker):
    run = start_run(worker)
    token = claim(worker, run["id"])["lease"]["fencing_token"]
    effect = declare(worker, run["id"], token, key="order-7-charge").json()
    worker.post(f"/effects/{effect['id']}/outcome", {"fencing_token": token, "status": "unknown"})
    html = browser(cast, "otto").get(f"/runs/{run['id']}/").content.decode()
    assert "order-7-charge" in html and "st st-unknown" in html
    assert "1 unresolved effect" in html
    assert "payments:charge" in html and "inventory:*" in html  # grants
    assert "attempt 1 claimed" in html and "effect declared" in html  # the timeline
    assert f"/audit/?run={run['id']}" in html  # this run's audit events, a click away
    assert f'ws-connect="/ws/runs/{run["id"]}/"' in html
    assert f"/effects/{effect['id']}/reconcile/" in html


def test_an_unknown_run_is_404(cast):
    assert (
        browser(cast, "otto").get("/runs/00000000-0000-0000-0000-000000000000/").status_code == 404
    )


# --- WebSocket ------------------------------------------------------------------------------------


def _session_headers(
    client: Client, origin: str = "http://testserver"
) -> list[tuple[bytes, bytes]]:
    return [
        (b"origin", origin.encode()),
        (b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode()),
        (b"host", b"testserver"),
    ]


def _connect(path: str, headers: list[tuple[bytes, bytes]]):
    from controlplane.asgi import application

    async def go():
        communicator = WebsocketCommunicator(application, path, headers=headers)
        connected, code = await communicator.connect(timeout=5)
        await communicator.disconnect()
        return connected, code

    return async_to_sync(go)()


@pytest.mark.django_db(transaction=True)
@override_settings(CHANNEL_LAYERS=IN_MEMORY_LAYER)
def test_websocket_rejects_anonymous_bad_origin_and_roleless_users(cast, worker):
    run = start_run(worker)
    anonymous = [(b"origin", b"http://testserver"), (b"host", b"testserver")]
    assert _connect(f"/ws/runs/{run['id']}/", anonymous) == (False, 4401)
    otto = browser(cast, "otto")
    connected, _ = _connect("/ws/runs/", _session_headers(otto, origin="http://evil.example"))
    assert connected is False
    User.objects.create_user("nobody", password="pw-nobody")
    nobody = Client()
    nobody.login(username="nobody", password="pw-nobody")
    assert _connect("/ws/runs/", _session_headers(nobody)) == (False, 4403)
    assert _connect("/ws/runs/00000000-0000-0000-0000-000000000000/", _session_headers(otto)) == (
        False,
        4404,
    )


@pytest.mark.django_db(transaction=True)
@override_settings(CHANNEL_LAYERS=IN_MEMORY_LAYER)
def test_websocket_pushes_fresh_partials_on_connect_and_after_a_transition(cast, worker):
    from controlplane.asgi import application

    run = start_run(worker)
    headers = _session_headers(browser(cast, "otto"))

    async def scenario():
        page = WebsocketCommunicator(application, f"/ws/runs/{run['id']}/", headers=headers)
        listing = WebsocketCommunicator(application, "/ws/runs/?state=running", headers=headers)
        assert (await page.connect(timeout=5))[0] and (await listing.connect(timeout=5))[0]
        first = await page.receive_from(
            timeout=5
        )  # (re)connect: rendered from the database at once
        assert (
            'id="run-header" class="panel" hx-swap-oob="true"' in first
            and 'data-state="queued"' in first
        )
        assert "No runs match" in await listing.receive_from(timeout=5)
        # The run's creation hint leaves by the sender thread and may land after the connect
        # render: let it out and drain what it pushed, so the next push is the claim's.
        await database_sync_to_async(live.flush)(5)
        for communicator in (page, listing):
            while not await communicator.receive_nothing(timeout=0.3):
                await communicator.receive_from(timeout=1)
        await database_sync_to_async(claim)(
            worker, run["id"]
        )  # committed transition -> run.changed
        pushed = await page.receive_from(timeout=5)
        assert (  # the facts of the claim: header, leases, attempts, timeline; not the ledger
            'data-state="running"' in pushed
            and 'id="run-attempts"' in pushed
            and 'id="run-ledger"' not in pushed
            and "hx-swap-oob" in pushed
        )
        # the run entered the filter: its row is placed (the "no runs" line goes), not the table
        assert 'id="run-rows-empty" hx-swap-oob="delete"' in await listing.receive_from(timeout=5)
        row = await listing.receive_from(timeout=5)
        assert f'<tbody hx-swap-oob="beforeend:#run-rows"><tr id="run-row-{run["id"]}"' in row
        assert 'id="run-table"' not in row
        assert await page.receive_nothing(timeout=0.5)  # coalesced: one render per burst
        inbox = WebsocketCommunicator(application, "/ws/runs/?view=approvals", headers=headers)
        assert (await inbox.connect(timeout=5))[0]
        assert 'id="inbox" class="panel" hx-swap-oob="true"' in await inbox.receive_from(timeout=5)
        for communicator in (page, listing, inbox):
            await communicator.disconnect()

    async_to_sync(scenario)()
    assert Run.objects.get(pk=run["id"]).state == State.RUNNING
