"""runs/search.py: every filter of the run list (and of the API and fleet selections), id prefixes,
keyset pages that stay stable while runs are inserted, and bad parameters named in a 400."""

from __future__ import annotations

import uuid
from collections import Counter
from datetime import timedelta

import pytest
from django.http import QueryDict
from django.utils import timezone

from core.auth import actor_for_user
from core.filters import BadFilter, decode_cursor, encode_cursor, parse_when
from runs.models import Agent, Approval, Attempt, Effect, Run
from runs.search import RunFilter, page_runs, runs_by_prefix, state_counts

pytestmark = pytest.mark.django_db


@pytest.fixture
def viewer(cast):
    return actor_for_user(cast["vera"][0], None, component="console")


@pytest.fixture
def agents(db):
    return {
        "purchasing": Agent.objects.create(name="purchasing"),
        "refunds": Agent.objects.create(name="refunds"),
    }


def make_run(agent, *, id=None, state="queued", ago_s=0, goal="buy 2 of sku-1", **fields) -> Run:
    when = timezone.now() - timedelta(seconds=ago_s)
    return Run.objects.create(
        id=id or uuid.uuid4(),
        agent=agent,
        goal=goal,
        state=state,
        created_at=when,
        updated_at=fields.pop("updated_at", when),
        **fields,
    )


def effect(run: Run, tool: str, action: str, status: str = "committed", **fields) -> Effect:
    return Effect.objects.create(
        run=run,
        step=action,
        tool=tool,
        action=action,
        idempotency_key=f"{tool}-{action}-{uuid.uuid4().hex[:8]}",
        fingerprint="f",
        decision="denied" if status == "denied" else "authorized",
        status=status,
        **fields,
    )


def ids(qs) -> set[str]:
    return {str(r.pk) for r in qs}


def select(actor, **params) -> set[str]:
    query = QueryDict(mutable=True)
    for key, value in params.items():
        query.setlist(key, value if isinstance(value, list) else [value])
    return ids(RunFilter.from_query(query).queryset(actor))


def test_it_filters_by_agent_state_and_owner(viewer, agents, cast):
    otto, olga = cast["otto"][0], cast["olga"][0]
    a = make_run(agents["purchasing"], state="running", assignee=otto)
    b = make_run(agents["refunds"], state="paused", decision_authority=olga)
    c = make_run(agents["refunds"], state="failed")
    assert select(viewer, agent="refunds") == {str(b.pk), str(c.pk)}
    assert select(viewer, agent=["purchasing", "refunds"]) == {str(a.pk), str(b.pk), str(c.pk)}
    assert select(viewer, state=["running", "failed"]) == {str(a.pk), str(c.pk)}
    assert select(viewer, state="paused,failed") == {str(b.pk), str(c.pk)}
    assert select(viewer, owner="otto") == {str(a.pk)}
    assert select(viewer, owner="olga") == {str(b.pk)}  # decision authority counts as owner
    assert select(viewer, owner="nobody") == set()
    olga_actor = actor_for_user(olga, None, component="console")
    assert select(olga_actor, owner="me") == {str(b.pk)}


def test_it_filters_by_id_and_unique_prefix(viewer, agents):
    a = make_run(agents["purchasing"], id=uuid.UUID("3f9a2c1b-0000-4000-8000-000000000001"))
    b = make_run(agents["purchasing"], id=uuid.UUID("3f9a2c1b-0000-4000-8000-000000000002"))
    c = make_run(agents["purchasing"], id=uuid.UUID("3f9b0000-0000-4000-8000-000000000003"))
    assert select(viewer, id="3f9a2c1b") == {str(a.pk), str(b.pk)}
    assert select(viewer, id="3F9A2C1B-0000-4000-8000-000000000002") == {str(b.pk)}
    assert select(viewer, id="3f9") == {str(a.pk), str(b.pk), str(c.pk)}
    assert select(viewer, q="3f9b") == {str(c.pk)}  # the search box reads an id prefix too
    assert [r.pk for r in runs_by_prefix(viewer, "3f9b0000")] == [c.pk]
    assert {r.pk for r in runs_by_prefix(viewer, "3f9a2c1b")} == {a.pk, b.pk}
    with pytest.raises(BadFilter) as short:
        runs_by_prefix(viewer, "3f9")
    assert short.value.field == "id"


def test_the_search_box_matches_goal_text_and_agent_names(viewer, agents):
    a = make_run(agents["purchasing"], goal="Refund order 42 to Alice")
    b = make_run(agents["refunds"], goal="something else")
    assert select(viewer, q="order 42") == {str(a.pk)}
    assert select(viewer, q="refunds") == {str(b.pk)}
    assert select(viewer, q="refund") == {str(a.pk)}  # goal text; agent names match whole


def test_it_filters_by_tool_and_action_touched(viewer, agents):
    charged = make_run(agents["purchasing"])
    refunded = make_run(agents["purchasing"])
    untouched = make_run(agents["purchasing"])
    effect(charged, "payments", "charge")
    effect(refunded, "payments", "refund")
    effect(untouched, "inventory", "reserve")
    assert select(viewer, touched="payments:charge") == {str(charged.pk)}
    assert select(viewer, touched="payments") == {str(charged.pk), str(refunded.pk)}
    assert select(viewer, touched="payments:*") == {str(charged.pk), str(refunded.pk)}
    both = select(viewer, touched=["payments", "inventory"])
    assert both == set()  # every touched value must hold


def test_it_filters_by_created_and_updated_time(viewer, agents):
    now = timezone.now()
    old = make_run(agents["purchasing"], ago_s=3 * 86400, updated_at=now - timedelta(minutes=5))
    new = make_run(agents["purchasing"], ago_s=60)
    assert select(viewer, since="2h") == {str(new.pk)}
    assert select(viewer, until="1d") == {str(old.pk)}
    assert select(viewer, updated_since="30m") == {str(old.pk), str(new.pk)}
    assert select(viewer, updated_until="2m") == {str(old.pk)}
    iso = (now - timedelta(days=1)).strftime("%Y-%m-%dT%H:%M:%S")  # no offset: read as UTC
    assert select(viewer, since=iso) == {str(new.pk)}
    assert select(viewer, since=(now - timedelta(days=4)).date().isoformat()) == {
        str(old.pk),
        str(new.pk),
    }


def test_needs_attention_finds_every_kind_of_trouble(viewer, agents, cast):
    calm = make_run(agents["purchasing"], state="running")
    effect(calm, "payments", "charge", status="committed")
    effect(calm, "payments", "charge", status="in_flight")  # in flight is not trouble yet
    unknown = make_run(agents["purchasing"], state="paused")
    effect(unknown, "payments", "charge", status="unknown")
    discrepancy = make_run(agents["purchasing"], state="succeeded")
    effect(discrepancy, "payments", "charge", status="discrepancy")
    orphaned = make_run(agents["purchasing"], state="orphaned")
    recovering = make_run(agents["purchasing"], state="recovering")
    handed_over = make_run(agents["purchasing"], state="needs_attention")
    comp_failed = make_run(agents["purchasing"], state="compensation_failed")
    waiting = make_run(agents["purchasing"], state="awaiting_approval")
    attempt = Attempt.objects.create(run=waiting, number=1, worker="w")
    Approval.objects.create(
        run=waiting, attempt=attempt, requested_by="w", tool="payments", action="charge"
    )
    stuck = make_run(agents["purchasing"], state="revalidating")
    stuck.jobs.create(
        kind="revalidation",
        target_id="x",
        timeout_s=120,
        status="running",
        due_at=timezone.now() - timedelta(minutes=10),
    )
    on_time = make_run(agents["purchasing"], state="revalidating")
    on_time.jobs.create(
        kind="revalidation",
        target_id="y",
        timeout_s=120,
        status="running",
        due_at=timezone.now() + timedelta(minutes=1),
    )
    trouble = {unknown, discrepancy, orphaned, recovering, handed_over, comp_failed, waiting, stuck}
    assert select(viewer, attention="1") == {str(r.pk) for r in trouble}
    assert select(viewer, attention="1", state="orphaned") == {str(orphaned.pk)}
    assert select(viewer, attention="0") == ids(Run.objects.all())
    # the chips of the view: runs in an attention state plus those holding trouble, each once
    effect(orphaned, "payments", "charge", status="unknown")
    counts = state_counts(viewer, RunFilter.from_query(QueryDict("attention=1")))
    assert counts.by_state == dict(Counter(r.state for r in trouble)) and counts.complete


def test_to_query_round_trips_and_keeps_relative_times(agents):
    query = QueryDict(
        "q=refund&agent=refunds&agent=purchasing&touched=payments:charge&owner=otto"
        "&state=running&state=paused&attention=1&since=2h&updated_until=2030-01-01&sort=state"
    )
    flt = RunFilter.from_query(query)
    again = RunFilter.from_query(QueryDict(flt.to_query()))
    assert again == flt
    assert "since=2h" in flt.to_query()
    assert RunFilter.from_query(QueryDict("")).to_query() == ""
    assert RunFilter.from_query({"state": ["running"], "agent": "refunds"}).states == ("running",)


@pytest.mark.parametrize(
    "params, field",
    [
        ({"state": "runing"}, "state"),
        ({"id": "xyz"}, "id"),
        ({"id": "0" * 33}, "id"),
        ({"since": "yesterday"}, "since"),
        ({"until": "1800-01-01"}, "until"),
        ({"updated_since": "99999999h"}, "updated_since"),
        ({"sort": "goal"}, "sort"),
        ({"attention": "maybe"}, "attention"),
        ({"touched": ":charge"}, "touched"),
        ({"owner": "a" * 151}, "owner"),
        ({"q": "a\x00b"}, "q"),
        ({"agent": "x\ufffe"}, "agent"),
        ({"q": ["a", "b"]}, "q"),
        ({"state": ["running"] * 21}, "state"),
    ],
)
def test_a_bad_parameter_is_refused_naming_it(params, field):
    query = QueryDict(mutable=True)
    for key, value in params.items():
        query.setlist(key, value if isinstance(value, list) else [value])
    with pytest.raises(BadFilter) as refused:
        RunFilter.from_query(query)
    assert refused.value.field == field and refused.value.status == 400
    assert refused.value.payload()["field"] == field


def test_a_forged_cursor_is_refused_naming_it(viewer, agents):
    flt = RunFilter.from_query(QueryDict(""))
    for bad in ["%%%", "bm90IGpzb24", encode_cursor(["a"]), encode_cursor(["not-a-time", "x"])]:
        with pytest.raises(BadFilter) as refused:
            page_runs(viewer, flt, after=bad)
        assert refused.value.field == "after"
    with pytest.raises(BadFilter):
        decode_cursor("before", encode_cursor([{"a": 1}, "x"]), size=2)


def _walk(viewer, flt, limit):
    seen, after = [], ""
    while True:
        page = page_runs(viewer, flt, after=after, limit=limit)
        seen.extend(page.runs)
        if not page.next_cursor:
            return seen
        after = page.next_cursor


@pytest.mark.parametrize("sort", ["-created", "created", "-updated", "state", "-agent", "agent"])
def test_keyset_pages_cover_every_run_once_in_order(viewer, agents, sort):
    same_time = timezone.now() - timedelta(hours=1)
    runs = [
        make_run(agents["purchasing" if i % 3 else "refunds"], state=["queued", "running"][i % 2])
        for i in range(9)
    ]
    # ties on the sort key: the id breaks them, so no run is skipped or repeated across pages
    Run.objects.filter(pk__in=[r.pk for r in runs[:5]]).update(created_at=same_time)
    flt = RunFilter.from_query(QueryDict(f"sort={sort}"))
    seen = _walk(viewer, flt, limit=2)
    assert [r.pk for r in seen] == [r.pk for r in Run.objects.order_by(*_order(flt))]
    assert len({r.pk for r in seen}) == 9


def _order(flt: RunFilter) -> list[str]:
    return [f"-{k}" if flt.descending else k for k in flt.sort_key]


def test_keyset_pages_stay_stable_while_runs_are_inserted(viewer, agents):
    for i in range(6):
        make_run(agents["purchasing"], ago_s=100 - i)
    flt = RunFilter.from_query(QueryDict(""))
    first = page_runs(viewer, flt, limit=3)
    newer = [make_run(agents["purchasing"]) for _ in range(4)]  # arrive while reading page one
    second = page_runs(viewer, flt, after=first.next_cursor, limit=3)
    older_six = list(Run.objects.exclude(pk__in=[r.pk for r in newer]).order_by("-created_at"))
    assert [r.pk for r in first.runs + second.runs] == [r.pk for r in older_six]
    assert second.next_cursor is None  # nothing repeated, nothing skipped
    back = page_runs(viewer, flt, before=second.prev_cursor, limit=3)
    assert [r.pk for r in back.runs] == [r.pk for r in first.runs]
    assert back.prev_cursor is not None  # the newer runs are now before page one
    newest = page_runs(viewer, flt, before=back.prev_cursor, limit=3)
    assert {r.pk for r in newest.runs} <= {r.pk for r in newer}


def test_state_counts_ignore_the_state_chips_but_keep_the_rest(viewer, agents):
    for state in ["running", "running", "paused"]:
        make_run(agents["purchasing"], state=state)
    make_run(agents["refunds"], state="running")
    flt = RunFilter.from_query(QueryDict("agent=purchasing&state=paused"))
    counted = state_counts(viewer, flt)
    assert counted.by_state == {"running": 2, "paused": 1} and counted.complete


def test_counts_through_effects_are_capped_and_say_so(viewer, agents, monkeypatch):
    for _ in range(3):
        effect(make_run(agents["purchasing"], state="running"), "payments", "charge")
    flt = RunFilter.from_query(QueryDict("touched=payments:charge"))
    assert state_counts(viewer, flt).by_state == {"running": 3}
    monkeypatch.setattr("runs.search.COUNT_CAP", 2)
    capped = state_counts(viewer, flt)
    assert capped.total == 2 and not capped.complete


def test_a_worker_token_sees_only_its_agents_runs(agents):
    from core.actors import Actor

    mine = make_run(agents["purchasing"])
    make_run(agents["refunds"])
    worker = Actor(kind="worker", name="w", agents=("purchasing",))
    assert ids(RunFilter().queryset(worker)) == {str(mine.pk)}


def test_parse_when_reads_durations_and_iso_times():
    now = timezone.now()
    assert parse_when("since", "90m", now=now) == now - timedelta(minutes=90)
    assert parse_when("since", "2w", now=now) == now - timedelta(days=14)
    assert parse_when("since", "2030-01-01T12:00:00+02:00").hour == 12
