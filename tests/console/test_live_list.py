"""The live run list (console/list_live.py): row-level updates, counts patched out of band, runs that
join or leave the view, one render per view for every socket of a process, and the user's roles
and name in what each socket is sent."""

from __future__ import annotations

import re

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import Client, override_settings

from console import list_live
from console.list_live import ListHub, ListPage, ListUpdate, View
from core import live
from runs.models import Run
from tests.conftest import claim, start_run

IN_MEMORY_LAYER = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}


@pytest.fixture
def quick_hub(monkeypatch):
    """Pushes in one short window, counts with every push."""
    monkeypatch.setattr(ListHub, "coalesce_s", 0.2)
    monkeypatch.setattr(ListHub, "counts_every_s", 0.0)


def headers_of(cast, username: str) -> list[tuple[bytes, bytes]]:
    client = Client()
    assert client.login(username=username, password=f"pw-{username}")
    return [
        (b"origin", b"http://testserver"),
        (b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode()),
        (b"host", b"testserver"),
    ]


async def open_list(path: str, headers) -> WebsocketCommunicator:
    from controlplane.asgi import application

    sock = WebsocketCommunicator(application, path, headers=headers)
    assert (await sock.connect(timeout=5))[0]
    assert 'id="run-table"' in await sock.receive_from(timeout=5)  # connect: the whole table
    return sock


async def pushed(sock: WebsocketCommunicator, quiet: float = 0.5) -> str:
    """Every frame of the next push (frames until the socket goes quiet)."""
    frames = [await sock.receive_from(timeout=5)]
    while not await sock.receive_nothing(timeout=quiet):
        frames.append(await sock.receive_from(timeout=1))
    return "\n".join(frames)


def row(html: str, run_id: str) -> str:
    found = re.search(rf'<tr id="run-row-{run_id}"[^>]*>.*?</tr>', html, re.S)
    return found.group(0) if found else ""


@pytest.mark.django_db(transaction=True)
@override_settings(CHANNEL_LAYERS=IN_MEMORY_LAYER)
def test_a_state_change_redraws_one_row_and_patches_the_counts(cast, worker, quick_hub):
    first = start_run(worker)
    other = start_run(worker, goal="another")
    headers = headers_of(cast, "vera")
    assert live.flush()

    async def scenario():
        everything = await open_list("/ws/runs/", headers)
        queued = await open_list("/ws/runs/?state=queued", headers)
        await database_sync_to_async(claim)(worker, first["id"])  # queued -> running

        html = await pushed(everything)
        assert 'id="run-table"' not in html, "no table redraw"
        assert 'hx-swap-oob="true"' in row(html, first["id"])
        assert 'data-state="running"' in row(html, first["id"])
        assert other["id"] not in html, "only the changed run's row"
        assert re.search(r'<div id="run-counts" hx-swap-oob="true">', html)
        assert re.search(r"running <span class=\"n\">1</span>", html)

        html = await pushed(queued)  # the run left the filter: its row goes, the counts follow
        assert f'<tr id="run-row-{first["id"]}" hx-swap-oob="delete"></tr>' in html
        assert 'id="run-table"' not in html and "run-counts" in html

        new = await database_sync_to_async(start_run)(worker, goal="a new one")
        for sock, first_row in ((everything, other), (queued, other)):  # newest first: the top
            html = await pushed(sock)
            assert f'<tbody hx-swap-oob="beforebegin:#run-row-{first_row["id"]}">' in html
            assert row(html, new["id"]) and 'id="run-table"' not in html
        for sock in (everything, queued):
            await sock.disconnect()

    async_to_sync(scenario)()


@pytest.mark.django_db(transaction=True)
@override_settings(CHANNEL_LAYERS=IN_MEMORY_LAYER)
def test_runs_joining_a_view_land_in_their_place(cast, worker, quick_hub):
    older = start_run(worker, goal="older")
    newer = start_run(worker, goal="newer")
    claim(worker, newer["id"])
    headers = headers_of(cast, "vera")
    assert live.flush()

    async def scenario():
        running = await open_list("/ws/runs/?state=running", headers)
        oldest = await open_list("/ws/runs/?sort=created", headers)
        await database_sync_to_async(claim)(worker, older["id"])  # joins "running", older
        html = await pushed(running)
        assert f'<tbody hx-swap-oob="beforeend:#run-rows"><tr id="run-row-{older["id"]}"' in html
        assert 'id="run-table"' not in html and "run-new" not in html
        assert 'hx-swap-oob="true"' in row(await pushed(oldest), older["id"])  # in place
        new = await database_sync_to_async(start_run)(worker, goal="later")
        html = await pushed(oldest)  # oldest first, all on one page: the new run goes last
        assert f'<tbody hx-swap-oob="beforeend:#run-rows"><tr id="run-row-{new["id"]}"' in html
        for sock in (running, oldest):
            await sock.disconnect()

    async_to_sync(scenario)()


@pytest.mark.django_db(transaction=True)
@override_settings(CHANNEL_LAYERS=IN_MEMORY_LAYER)
def test_pages_showing_the_same_view_share_one_render(cast, worker, quick_hub, monkeypatch):
    run = start_run(worker)
    assert live.flush()
    updates, tables = [], []
    real_update = list_live.list_update
    monkeypatch.setattr(
        list_live, "list_update", lambda *a: updates.append(a[1].query) or real_update(*a)
    )
    from console import run_list

    real_context = run_list.list_context
    monkeypatch.setattr(
        run_list, "list_context", lambda *a, **k: tables.append(1) or real_context(*a, **k)
    )
    sessions = [headers_of(cast, "vera"), headers_of(cast, "vera")]

    async def scenario():
        same = [await open_list("/ws/runs/", sessions[i % 2]) for i in range(8)]
        filtered = await open_list("/ws/runs/?agent=purchasing", sessions[0])
        assert len(tables) == 2, "connecting together, one view costs one whole render"
        await database_sync_to_async(claim)(worker, run["id"])
        frames = [await pushed(sock) for sock in same]
        assert len(set(frames)) == 1 and 'data-state="running"' in row(frames[0], run["id"])
        assert 'data-state="running"' in row(await pushed(filtered), run["id"])
        assert sorted(updates) == ["", "agent=purchasing"], "one read per view, not per socket"
        for sock in [*same, filtered]:
            await sock.disconnect()

    async_to_sync(scenario)()


@pytest.mark.django_db(transaction=True)
@override_settings(CHANNEL_LAYERS=IN_MEMORY_LAYER)
def test_each_socket_gets_what_its_user_and_roles_render(cast, worker, quick_hub, monkeypatch):
    run = start_run(worker)
    Run.objects.filter(pk=run["id"]).update(assignee=cast["otto"][0])
    assert live.flush()
    keys = []
    real_update = list_live.list_update
    monkeypatch.setattr(
        list_live, "list_update", lambda *a: keys.append(a[0].username) or real_update(*a)
    )

    people = {name: headers_of(cast, name) for name in ("otto", "vera", "olga")}

    async def scenario():
        otto = await open_list("/ws/runs/?owner=me", people["otto"])
        vera = await open_list("/ws/runs/?owner=me", people["vera"])
        olga = await open_list("/ws/runs/", people["olga"])  # operator
        viewer = await open_list("/ws/runs/", people["vera"])
        await database_sync_to_async(live.announce)(run["id"], "run")
        assert 'hx-swap-oob="true"' in row(await pushed(otto), run["id"])
        assert await vera.receive_nothing(timeout=0.5), "not her run: nothing for her"
        assert row(await pushed(olga), run["id"]) and row(await pushed(viewer), run["id"])
        for sock in (otto, vera, olga, viewer):
            await sock.disconnect()

    async_to_sync(scenario)()
    # "me" is each user; the same filter under other roles is another view
    assert sorted(keys) == ["olga", "otto", "vera", "vera"]


def _update(**kw) -> ListUpdate:
    base = dict(rows={}, keys={}, order=[], gone=set(), joined=set(), counts="")
    return ListUpdate(**(base | kw))


def _row(run_id: str) -> str:
    return f'<tr id="run-row-{run_id}"><td>{run_id}</td></tr>'


def test_a_page_sorted_by_last_change_moves_changed_rows_to_their_place():
    keys = {"a": (30,), "b": (20,), "c": (10,)}
    page = ListPage(View.parse("sort=-updated"), ["a", "b", "c"], keys, limit=3, more=False)
    # c changed last (now first), d is new and sits between a and b; a is redrawn where it is
    up = _update(
        rows={r: _row(r) for r in "acd"},
        keys={"c": (40,), "d": (25,), "a": (30,)},
        order=["c", "a", "d"],
    )
    frames = page.frames(up)
    assert frames[0] == (
        '<tr id="run-row-c" hx-swap-oob="delete"></tr>'
        '<tr id="run-row-a" hx-swap-oob="true"><td>a</td></tr>'
        '<tr id="run-rows-empty" hx-swap-oob="delete"></tr>'
    )
    assert frames[1] == (  # last first: each anchor is on the page when its insert lands
        f'<tbody hx-swap-oob="beforebegin:#run-row-b">{_row("d")}</tbody>'
        f'<tbody hx-swap-oob="beforebegin:#run-row-a">{_row("c")}</tbody>'
    )
    assert page.shown == ["c", "a", "d", "b"]
    # patched past twice its size, a page is redrawn whole
    more = {r: _row(r) for r in "efg"}
    up = _update(rows=more, keys={"e": (1,), "f": (2,), "g": (3,)}, order=["g", "f", "e"])
    assert page.frames(up) is None


def test_a_full_page_leaves_later_runs_to_their_page_and_appends_to_a_last_one():
    keys = {"a": (1,), "b": (2,)}
    full = ListPage(View.parse("sort=created"), ["a", "b"], dict(keys), limit=2, more=True)
    assert full.frames(_update(rows={"n": _row("n")}, keys={"n": (3,)}, order=["n"])) == []
    last = ListPage(View.parse("sort=created"), ["a", "b"], dict(keys), limit=50, more=False)
    frames = last.frames(_update(rows={"n": _row("n")}, keys={"n": (3,)}, order=["n"]))
    assert frames[-1] == f'<tbody hx-swap-oob="beforeend:#run-rows">{_row("n")}</tbody>'


def test_a_deep_page_leaves_new_runs_to_the_banner_and_drops_leavers():
    keys = {"a": (20,), "b": (10,)}
    page = ListPage(View.parse("after=abc"), ["a", "b"], keys, limit=50, more=True)
    up = _update(
        rows={"n": _row("n")}, keys={"n": (99,)}, order=["n"], joined={"n"}, gone={"b", "x"}
    )
    frames = page.frames(up)
    assert frames[0] == '<tr id="run-row-b" hx-swap-oob="delete"></tr>'
    assert "1 new run in this view" in frames[-1] and page.shown == ["a"]
    assert 'hx-get="?"' in frames[-1]  # the first page of the same view
