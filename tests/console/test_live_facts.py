"""Live to the fact: a committed fact becomes one small hint per run (core.live), the run page gets
only the fragments that fact changed (console/run_page.py), pushes are coalesced, a list page gets
only the changed rows, the effects ledger is paginated, and the timeline interleaves, filters, pages
and folds routine refusals."""

from __future__ import annotations

import re
import threading
import time

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.db import transaction
from django.test import Client, override_settings
from django.utils import timezone

from console import timeline as tl
from console.consumers import note_facts
from console.run_page import EFFECTS_PAGE, RunPagePush, effects_page, sections_for
from core import live
from runs.models import Effect, Run
from tests.conftest import claim, declare, start_run

pytestmark = pytest.mark.django_db

IN_MEMORY_LAYER = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}


@pytest.fixture
def sent(monkeypatch):
    """Every hint core.live would send, in order: [{run_id: [(kind, object_id), ...]}]."""
    out: list[dict] = []
    monkeypatch.setattr(
        live, "send_hints", lambda facts: out.append({k: v and list(v) for k, v in facts.items()})
    )
    return out


def browser(cast, username: str = "otto") -> Client:
    client = Client()
    assert client.login(username=username, password=f"pw-{username}")
    return client


# --- core.live: one hint per run per transaction, after commit ------------------------------------


def test_a_declared_effect_is_announced_after_commit_with_its_id(
    worker, sent, django_capture_on_commit_callbacks
):
    run = start_run(worker)
    token = claim(worker, run["id"])["lease"]["fencing_token"]
    sent.clear()
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        effect = declare(worker, run["id"], token).json()
    assert sent == [], "nothing is sent inside the transaction"
    for cb in callbacks:
        cb()
    assert sent == [{run["id"]: [("effect_intent", effect["id"])]}]


def test_the_facts_of_one_transaction_go_out_in_one_hint_per_run(
    worker, sent, django_capture_on_commit_callbacks
):
    run = start_run(worker)
    sent.clear()
    with django_capture_on_commit_callbacks(execute=True):
        claim(worker, run["id"])  # attempt started + state changed + run: one transaction
    assert len(sent) == 1 and list(sent[0]) == [run["id"]]
    kinds = [kind for kind, _ in sent[0][run["id"]]]
    assert kinds[:2] == ["attempt_started", "state_changed"] and "run" in kinds


@pytest.mark.django_db(transaction=True)
def test_a_rolled_back_transaction_announces_nothing_and_the_next_one_does(sent):
    with pytest.raises(RuntimeError), transaction.atomic():
        live.announce("r-1", "checkpoint", 3)
        raise RuntimeError("rolled back")
    assert sent == []
    with transaction.atomic():
        live.announce("r-1", "checkpoint", 4)
        live.announce("r-1", "checkpoint", 4)  # the same fact twice is one fact
        live.announce("r-2", "lease", "l-1")
    assert sent == [{"r-1": [("checkpoint", "4")], "r-2": [("lease", "l-1")]}]
    live.announce("r-3", "job", "j-1")  # outside a transaction: at once
    assert sent[-1] == {"r-3": [("job", "j-1")]}


@pytest.mark.django_db(transaction=True)
def test_a_cascade_of_facts_becomes_everything(sent):
    with transaction.atomic():
        for i in range(live.MAX_FACTS + 5):
            live.announce("r-1", "effect_outcome", i)
    assert sent == [{"r-1": None}]


class GatedLayer:
    """A channel layer whose sends wait for its gate: a request that touched it would hang."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.sent: list[tuple[str, dict]] = []

    async def group_send(self, group: str, message: dict) -> None:
        if not self.gate.wait(10):
            raise TimeoutError("gate never opened")
        self.sent.append((group, message))


@pytest.fixture
def layer(monkeypatch):
    gated = GatedLayer()
    monkeypatch.setattr(live, "_layer", lambda: gated)
    yield gated
    gated.gate.set()
    live.flush(10)


@pytest.mark.django_db(transaction=True)
def test_a_protocol_call_answers_while_the_channel_layer_is_stuck_and_the_hint_follows(
    worker, layer
):
    run = start_run(worker)
    token = claim(worker, run["id"])["lease"]["fencing_token"]
    started = time.monotonic()
    response = declare(worker, run["id"], token)
    assert response.status_code == 201, response.content
    assert time.monotonic() - started < 5 and layer.sent == [], "the call did not wait for a send"
    layer.gate.set()
    assert live.flush(10)
    facts = [f for group, m in layer.sent if group == f"run.{run['id']}" for f in m["facts"] or []]
    assert ["effect_intent", response.json()["id"]] in facts
    assert {group for group, _ in layer.sent} == {f"run.{run['id']}", "runs"}


@pytest.mark.django_db(transaction=True)
def test_a_rolled_back_decision_sends_nothing_to_the_layer(layer):
    layer.gate.set()
    with pytest.raises(RuntimeError), transaction.atomic():
        live.announce("r-1", "checkpoint", 3)
        raise RuntimeError("rolled back")
    assert live.flush(10) and layer.sent == []
    with transaction.atomic():
        live.announce("r-1", "checkpoint", 4)
    assert live.flush(10)
    assert layer.sent == [
        ("run.r-1", {"type": "run.changed", "run_id": "r-1", "facts": [["checkpoint", "4"]]}),
        ("runs", {"type": "runs.changed", "runs": [["r-1", [["checkpoint", "4"]]]]}),
    ]


@pytest.mark.django_db(transaction=True)
def test_hints_committed_while_a_send_is_under_way_go_out_coalesced_per_run(layer):
    live.announce(
        "r-0", "run"
    )  # outside a transaction: queued at once, and the sender blocks on it
    deadline = time.monotonic() + 5
    while not live._sender.busy and time.monotonic() < deadline:
        time.sleep(0.01)
    for step in (1, 2, 2, 3):
        with transaction.atomic():
            live.announce("r-1", "checkpoint", step)
    layer.gate.set()
    assert live.flush(10)
    # r-0 may still be gathering when r-1's hints arrive: one batch or two, the same messages.
    assert [(group, m["facts"]) for group, m in layer.sent if group != "runs"] == [
        ("run.r-0", [["run", ""]]),
        ("run.r-1", [["checkpoint", "1"], ["checkpoint", "2"], ["checkpoint", "3"]]),
    ]
    assert [item for group, m in layer.sent if group == "runs" for item in m["runs"]] == [
        ["r-0", [["run", ""]]],
        ["r-1", [["checkpoint", "1"], ["checkpoint", "2"], ["checkpoint", "3"]]],
    ]


@pytest.mark.django_db(transaction=True)
def test_the_list_group_gets_one_message_per_batch_in_bounded_chunks(layer, monkeypatch):
    """Every console process's list hub receives each "runs" message: a batch of hints for many
    runs is one message (chunked), not one per run."""
    monkeypatch.setattr(live, "RUNS_PER_MESSAGE", 2)
    layer.gate.set()
    live.deliver({f"r-{i}": [("run", "")] for i in range(5)}, None)
    to_list = [m for group, m in layer.sent if group == "runs"]
    assert [m["type"] for m in to_list] == ["runs.changed"] * 3
    assert [[run_id for run_id, _ in m["runs"]] for m in to_list] == [
        ["r-0", "r-1"],
        ["r-2", "r-3"],
        ["r-4"],
    ]
    assert len([g for g, _ in layer.sent if g.startswith("run.")]) == 5


@pytest.mark.django_db(transaction=True)
def test_the_list_share_goes_out_at_most_every_window_while_run_groups_hear_at_once(layer):
    """Every console process's list hub hears each "runs" message: under a stream of commits it gets
    one message per LIST_EVERY_S window (the runs of the window gathered), while each run's own group
    still hears its hint at once; the first hint after a quiet spell is not held back."""
    layer.gate.set()
    assert live.flush(10)
    started = time.monotonic()
    for i in range(12):  # 12 commits over about 0.6 s: 2-4 windows
        with transaction.atomic():
            live.announce(f"w-{i}", "checkpoint", i)
        time.sleep(0.05)
    assert live.flush(10)
    to_list = [m for group, m in layer.sent if group == "runs"]
    to_runs = [g for g, _ in layer.sent if g.startswith("run.w-")]
    assert sorted(to_runs) == sorted(f"run.w-{i}" for i in range(12))
    assert [r for m in to_list for r, _ in m["runs"]] == [f"w-{i}" for i in range(12)]
    elapsed = time.monotonic() - started
    assert 2 <= len(to_list) <= elapsed / live.LIST_EVERY_S + 2, (len(to_list), elapsed)


def test_the_consumer_merges_hints_per_run_and_kind():
    pending: dict = {}
    note_facts(pending, "a", [["effect_intent", "e1"], ["run", ""]])
    note_facts(pending, "a", [["effect_outcome", "e1"], ["effect_intent", "e2"]])
    note_facts(pending, "b", None)
    note_facts(pending, "b", [["checkpoint", "1"]])  # everything stays everything
    note_facts(pending, "c", [["bad"], "x", ["lease", None]])
    assert pending == {
        "a": {"effect_intent": {"e1", "e2"}, "run": {""}, "effect_outcome": {"e1"}},
        "b": None,
        "c": {"lease": {""}},
    }


# --- the run page's fragments --------------------------------------------------------------------


def test_a_new_effect_is_prepended_then_redrawn_in_place(cast, worker):
    run = start_run(worker)
    token = claim(worker, run["id"])["lease"]["fencing_token"]
    page = RunPagePush(cast["otto"][0], run["id"])
    first = page.resync()
    assert 'id="run-header" class="panel" hx-swap-oob="true"' in first
    assert "No effect declared yet." in first and 'id="effects-body"' in first

    effect = declare(worker, run["id"], token).json()
    frames = page.facts({"effect_intent": {effect["id"]}}, tree_changed=False)
    # Rows travel in a frame of their own, starting with a table element (or a parser drops them).
    assert frames[1].startswith('<tbody hx-swap-oob="afterbegin:#effects-body">')
    pushed = "".join(frames)
    assert 'hx-swap-oob="afterbegin:#effects-body"' in pushed
    assert f'<tr id="effect-{effect["id"]}"' in pushed and "in flight 0 s" in pushed
    assert 'id="effects-empty" hx-swap-oob="delete"' in pushed
    assert 'id="run-header"' in pushed and 'id="run-ledger"' not in pushed  # a row, not the table
    assert 'hx-swap-oob="afterbegin:#timeline-list"' in pushed and "effect declared" in pushed
    assert "run-audit" not in pushed and "run-interventions" not in pushed

    worker.post(f"/effects/{effect['id']}/outcome", {"fencing_token": token, "status": "committed"})
    frames = page.facts({"effect_outcome": {effect["id"]}}, tree_changed=False)
    assert frames[-1].startswith(f'<tr id="effect-{effect["id"]}"')
    pushed = "".join(frames)
    assert re.search(rf'<tr id="effect-{effect["id"]}"[^>]*hx-swap-oob="true"', pushed)
    assert "st st-committed" in pushed and "afterbegin:#effects-body" not in pushed
    assert pushed.count('id="tl-h-') == 1, "only the new timeline entry is sent"
    assert "effect outcome" in pushed


def test_a_row_sent_in_flight_is_redrawn_when_it_settles_whatever_the_next_fact(cast, worker):
    """A finished run must not go on showing "in flight 62 s": rows sent in flight are re-read."""
    run = start_run(worker)
    token = claim(worker, run["id"])["lease"]["fencing_token"]
    effect = declare(worker, run["id"], token).json()
    page = RunPagePush(cast["otto"][0], run["id"])
    assert "in flight" in page.resync()
    worker.post(f"/effects/{effect['id']}/outcome", {"fencing_token": token, "status": "committed"})
    # the next push names another fact only (as a reconcile or a cancel's would)
    pushed = "".join(page.facts({"checkpoint": {"1"}}, tree_changed=False))
    assert re.search(rf'<tr id="effect-{effect["id"]}"[^>]*hx-swap-oob="true"', pushed)
    assert "st st-committed" in pushed and 'class="age"' not in pushed
    again = "".join(page.facts({"checkpoint": {"2"}}, tree_changed=False))
    assert f'id="effect-{effect["id"]}"' not in again  # settled: no longer re-read


def test_a_child_is_announced_on_its_parent(worker, sent, django_capture_on_commit_callbacks):
    """The parent's open page redraws its tree and joins the child's group (console/consumers.py)."""
    parent = start_run(worker)
    with django_capture_on_commit_callbacks(execute=True):
        child = start_run(worker, parent_run_id=parent["id"], authority=[])
    facts = [f for hint in sent for f in hint.get(parent["id"]) or []]
    assert ("child_created", child["id"]) in facts
    assert "tree" in sections_for(["child_created"])


def test_each_fact_redraws_its_sections(cast, worker):
    run = start_run(worker)
    claim(worker, run["id"])
    page = RunPagePush(cast["otto"][0], run["id"])
    page.resync()
    pushed = "".join(page.facts({"checkpoint": {"1"}}, tree_changed=False))
    assert 'id="run-checkpoints"' in pushed and 'id="run-authority"' not in pushed
    pushed = "".join(page.facts({"lease": {"x"}}, tree_changed=False))
    assert 'id="run-authority"' in pushed and 'id="run-attempts"' in pushed
    pushed = "".join(page.facts({"job": {"x"}}, tree_changed=False))
    assert 'id="run-interventions"' in pushed and 'id="run-recovery"' in pushed
    pushed = "".join(page.facts({"approval_requested": {"x"}}, tree_changed=False))
    assert 'id="run-approvals"' in pushed
    pushed = "".join(page.facts({}, tree_changed=True))  # a child changed: the tree only
    assert 'id="run-tree"' in pushed and 'id="run-header"' not in pushed


def test_the_ledger_is_paginated_newest_first_with_a_keyset(cast, worker):
    run = start_run(worker)
    token = claim(worker, run["id"])["lease"]["fencing_token"]
    total = EFFECTS_PAGE + 12
    for i in range(total):
        assert declare(worker, run["id"], token, key=f"k-{i:03d}").status_code == 201
        worker.post(
            f"/effects/{Effect.objects.get(idempotency_key=f'k-{i:03d}').pk}/outcome",
            {"fencing_token": token, "status": "committed"},
        )
    first = effects_page(Run.objects.get(pk=run["id"]))
    assert [e["idempotency_key"] for e in first["effects"]][:2] == ["k-061", "k-060"]
    assert len(first["effects"]) == EFFECTS_PAGE and first["effects_next"]
    otto = browser(cast)
    html = otto.get(f"/runs/{run['id']}/").content.decode()
    assert html.count('<tr id="effect-') == EFFECTS_PAGE and f"({total};" in html
    assert "Older effects" in html
    older = otto.get(
        f"/runs/{run['id']}/",
        {"part": "ledger", "effects_before": first["effects_next"]},
        HTTP_HX_REQUEST="true",
    ).content.decode()
    keys = re.findall(r"k-\d{3}", older)
    assert sorted(set(keys)) == [f"k-{i:03d}" for i in range(12)]
    assert "Older effects" not in older and "<section" not in older


# --- the timeline ----------------------------------------------------------------------------------


def test_the_timeline_interleaves_filters_and_folds_claim_races(cast, worker):
    run = start_run(worker)
    token = claim(worker, run["id"])["lease"]["fencing_token"]
    declare(worker, run["id"], token)
    for _ in range(12):  # another worker keeps trying: routine refusals
        assert worker.post(f"/runs/{run['id']}/claim", {"worker": "worker-8"}).status_code == 409
    worker.post(f"/runs/{run['id']}/checkpoints", {"fencing_token": token, "step": "charged"})
    r = Run.objects.get(pk=run["id"])

    page = tl.timeline(r)
    titles = [e.title for e in page["entries"]]
    assert "12 claim races" in titles and titles.count("claim race") == 0
    race = next(e for e in page["entries"] if e.title == "12 claim races")
    assert race.since is not None and race.since <= race.at and race.kind == "denial"
    assert "outcome=denied" in race.audit and "action=run.claim" in race.audit
    assert titles[0] == "checkpoint 1", "newest first, in commit order"
    assert {"effect declared", "attempt 1 claimed", "state"} <= set(titles)

    only = tl.timeline(r, kinds=["effect"])
    assert {e.kind for e in only["entries"]} == {"effect"}
    html = browser(cast).get(f"/runs/{run['id']}/?kind=effect").content.decode()
    assert 'class="chip on" data-chip="effect"' in html and "claim races" not in html
    assert f'ws-connect="/ws/runs/{run["id"]}/?kind=effect"' in html


def test_the_timeline_pages_with_a_time_cursor(worker):
    run = start_run(worker)
    token = claim(worker, run["id"])["lease"]["fencing_token"]
    for i in range(30):
        declare(worker, run["id"], token, key=f"p-{i}")
    r = Run.objects.get(pk=run["id"])
    first = tl.timeline(r, limit=20)
    assert len(first["entries"]) == 20 and first["next_before"]
    second = tl.timeline(r, limit=20, before=tl.parse_time(first["next_before"]))
    refs = [e.ref for e in first["entries"]] + [e.ref for e in second["entries"]]
    assert len(refs) == len(set(refs)), "no entry on two pages"
    everything = tl.timeline(r, limit=500)
    assert len(refs) == len(everything["entries"]) and second["next_before"] is None


def test_fold_keeps_single_refusals_as_they_are():
    now = timezone.now()
    one = tl.Entry(at=now, kind="denial", ref="a-1", title="claim race", fold_key=("d", "x"))
    other = tl.Entry(at=now, kind="state", ref="h-1", title="state")
    assert [e.title for e in tl.fold([other, one])] == ["state", "claim race"]
    assert one.since is None and one.count == 1


def test_the_audit_trail_is_a_click_away(cast, worker):
    run = start_run(worker)
    claim(worker, run["id"])
    otto = browser(cast)
    html = otto.get(f"/runs/{run['id']}/").content.decode()
    assert f"/audit/?run={run['id']}" in html and "run.claim" not in html
    part = otto.get(f"/runs/{run['id']}/?part=audit", HTTP_HX_REQUEST="true").content.decode()
    assert "run.claim" in part and part.lstrip().startswith('<section id="run-audit"')


# --- the sockets: coalesced fragments, rows of a list ------------------------------------------------


def _session_headers(client: Client) -> list[tuple[bytes, bytes]]:
    return [
        (b"origin", b"http://testserver"),
        (b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode()),
        (b"host", b"testserver"),
    ]


@pytest.mark.django_db(transaction=True)
@override_settings(CHANNEL_LAYERS=IN_MEMORY_LAYER)
def test_a_burst_of_facts_is_one_push_of_fragments_and_a_list_gets_rows(cast, worker, monkeypatch):
    from console.consumers import LiveConsumer
    from controlplane.asgi import application

    monkeypatch.setattr(LiveConsumer, "coalesce_s", 1.0)  # the whole burst lands in one window
    # ... and in one batch of core.live's sender (hints reach the sockets a little after the commit)
    monkeypatch.setattr(live, "GATHER_S", 1.0)

    run = start_run(worker)
    other = start_run(worker, goal="someone else's")
    token = claim(worker, run["id"])["lease"]["fencing_token"]
    headers = _session_headers(browser(cast))
    assert live.flush(), "the hints of the run's start are out before the sockets connect"

    async def scenario():
        page = WebsocketCommunicator(application, f"/ws/runs/{run['id']}/", headers=headers)
        listing = WebsocketCommunicator(application, "/ws/runs/", headers=headers)
        assert (await page.connect(timeout=5))[0] and (await listing.connect(timeout=5))[0]
        assert 'id="run-ledger"' in await page.receive_from(timeout=5)  # connect: everything
        assert 'id="run-table"' in await listing.receive_from(timeout=5)

        def burst():
            ids = [declare(worker, run["id"], token, key=f"b-{i}").json()["id"] for i in range(3)]
            worker.post(f"/runs/{run['id']}/checkpoints", {"fencing_token": token, "step": "s"})
            return ids

        ids = await database_sync_to_async(burst)()
        pushed = await page.receive_from(timeout=5)
        assert 'id="run-checkpoints"' in pushed and 'id="run-ledger"' not in pushed
        rows = await page.receive_from(timeout=5)  # the new rows: a frame of their own
        assert rows.startswith("<tbody") and all(f'<tr id="effect-{i}"' in rows for i in ids)
        assert await page.receive_nothing(timeout=0.4), "coalesced: one push for the burst"
        rows = await listing.receive_from(timeout=5)
        assert re.search(rf'<tr id="run-row-{run["id"]}"[^>]*hx-swap-oob="true"', rows)
        assert 'id="run-table"' not in rows and other["id"] not in rows
        for communicator in (page, listing):
            await communicator.disconnect()

    async_to_sync(scenario)()
