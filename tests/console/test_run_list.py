"""The run list: filters in the URL, chips with counts, keyset pages at a constant number of queries
whatever the depth, sortable columns, id prefixes as URLs, 400 pages naming a bad parameter."""

from __future__ import annotations

import re
import uuid
from datetime import timedelta

import pytest
from django.db import connection, reset_queries
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from runs.models import Agent, Run

pytestmark = pytest.mark.django_db


def browser(cast, username: str = "vera") -> Client:
    client = Client()
    client.force_login(cast[username][0])
    return client


@pytest.fixture
def many_runs(cast):
    agent = Agent.objects.create(name="purchasing")
    now = timezone.now()
    Run.objects.bulk_create(
        Run(
            agent=agent,
            goal=f"run {i}",
            state=["running", "paused", "failed"][i % 3],
            created_at=now - timedelta(seconds=i),
            updated_at=now - timedelta(seconds=i),
        )
        for i in range(130)
    )
    return agent


def row_ids(html: str) -> list[str]:
    return re.findall(r'<tr id="run-row-([0-9a-f-]{36})"', html)


def next_link(html: str) -> str | None:
    found = re.search(r'rel="next" href="\?([^"]+)"', html)
    return found.group(1).replace("&amp;", "&") if found else None


def test_pages_walk_every_run_at_the_same_number_of_queries(cast, many_runs):
    client = browser(cast)
    client.get("/")  # warm the session and the template cache
    seen: list[str] = []
    counts: list[int] = []
    query: str | None = ""
    while query is not None:
        reset_queries()  # the request_started signal empties the log under the capture's feet
        with CaptureQueriesContext(connection) as ctx:
            resp = client.get(f"/?{query}")
        assert resp.status_code == 200
        html = resp.content.decode()
        seen += row_ids(html)
        counts.append(len(ctx.captured_queries))
        query = next_link(html)
    assert len(seen) == 130 and len(set(seen)) == 130
    assert len(counts) == 3 and len(set(counts)) == 1, counts  # page 1, 2 and 3 cost the same
    assert 3 <= counts[0] <= 12, counts  # session, user, page, state counts, attention count


def test_a_deep_filtered_page_costs_no_more_than_the_first(
    cast, many_runs, django_assert_max_num_queries
):
    client = browser(cast)
    client.get("/")
    reset_queries()
    with CaptureQueriesContext(connection) as ctx:
        first = client.get("/?state=running&state=paused&sort=-updated")
    assert len(ctx.captured_queries) >= 3
    deep = next_link(first.content.decode())
    assert deep and "state=running" in deep and "sort=-updated" in deep
    with django_assert_max_num_queries(len(ctx.captured_queries)):
        resp = client.get(f"/?{deep}")
    rows = row_ids(resp.content.decode())
    assert len(rows) == 87 - 50
    assert set(Run.objects.filter(pk__in=rows).values_list("state", flat=True)) == {
        "running",
        "paused",
    }


def test_the_list_shows_counts_per_state_as_chips_and_keeps_the_filter_in_links(cast, many_runs):
    html = browser(cast).get("/?state=paused&agent=purchasing").content.decode()
    assert re.search(r'value="paused" checked>.*?<span class="n">43</span>', html, re.S)
    assert re.search(r'value="running" >.*?<span class="n">44</span>', html, re.S)
    assert "43 runs match" in html
    assert 'ws-connect="/ws/runs/?agent=purchasing&amp;state=paused"' in html
    assert 'name="state" multiple' not in html  # chips, not a ctrl-click listbox


def test_sorting_by_a_column_orders_the_rows(cast, many_runs):
    client = browser(cast)
    oldest_first = row_ids(client.get("/?sort=created").content.decode())
    expected = [
        str(pk) for pk in Run.objects.order_by("created_at", "id").values_list("pk", flat=True)[:50]
    ]
    assert oldest_first == expected
    by_state = row_ids(client.get("/?sort=state").content.decode())
    states = [Run.objects.get(pk=i).state for i in by_state]
    assert states == sorted(states)


def test_the_htmx_swap_is_the_live_region_only(cast, many_runs):
    resp = browser(cast).get("/?state=failed", HTTP_HX_REQUEST="true")
    html = resp.content.decode()
    assert html.lstrip().startswith('<div id="run-live"') and "<html" not in html
    assert len(row_ids(html)) == 43


def test_a_bad_parameter_is_a_400_page_naming_it(cast, many_runs):
    client = browser(cast)
    for query, field in [
        ("state=bogus", "state"),
        ("since=last+tuesday", "since"),
        ("sort=goal", "sort"),
        ("after=not-a-cursor", "after"),
        ("id=zz", "id"),
    ]:
        resp = client.get(f"/?{query}")
        assert resp.status_code == 400, query
        assert field in resp.content.decode(), query
    assert client.get("/?q=a%00b").status_code == 400


def test_an_eight_character_prefix_redirects_to_the_run(cast, many_runs):
    run = Run.objects.first()
    resp = browser(cast).get(f"/runs/{str(run.pk)[:8]}/")
    assert resp.status_code == 302 and resp["Location"] == f"/runs/{run.pk}/"
    upper = browser(cast).get(f"/runs/{str(run.pk).upper()}/")
    assert upper.status_code == 302 and upper["Location"] == f"/runs/{run.pk}/"


def test_an_ambiguous_prefix_lists_the_matches_and_a_missing_one_is_404(cast, many_runs):
    a = Run.objects.create(
        agent=many_runs, goal="a", id=uuid.UUID("abcdef01-0000-4000-8000-000000000001")
    )
    b = Run.objects.create(
        agent=many_runs, goal="b", id=uuid.UUID("abcdef01-0000-4000-8000-000000000002")
    )
    client = browser(cast)
    resp = client.get("/runs/abcdef01/")
    assert resp.status_code == 200
    html = resp.content.decode()
    assert set(row_ids(html)) == {str(a.pk), str(b.pk)} and "start with" in html
    assert client.get("/runs/abcdef02/").status_code == 404
    assert client.get("/runs/abc/").status_code == 400  # too short to name a run
    assert client.get("/runs/nothex00/").status_code == 400


def test_every_id_is_copyable(cast, many_runs):
    html = browser(cast).get("/").content.decode()
    run = Run.objects.order_by("-created_at", "-id").first()
    assert f'data-copy="{run.pk}"' in html


def test_the_page_has_dark_mode_and_shortcuts(cast, many_runs):
    html = browser(cast).get("/").content.decode()
    assert "console/theme.js" in html and "console/console.js" in html
    assert "data-theme-toggle" in html and 'id="shortcuts"' in html and "data-search" in html


def test_the_needs_attention_chip_counts_what_the_view_lists(cast, many_runs):
    orphaned = [Run.objects.create(agent=many_runs, goal="o", state="orphaned") for _ in range(3)]
    paused = Run.objects.create(agent=many_runs, goal="u", state="paused")
    paused.effects.create(
        step="s", tool="payments", action="charge", idempotency_key="k", fingerprint="f",
        decision="authorized", status="unknown",
    )  # fmt: skip
    client = browser(cast)
    html = client.get("/").content.decode()
    assert re.search(
        r'name="attention" value="1" > needs attention\s*<span class="n">4</span>', html
    )
    listed = row_ids(client.get("/?attention=1").content.decode())
    assert set(listed) == {str(r.pk) for r in [*orphaned, paused]}


@pytest.mark.parametrize(
    "query", ["q=run", "agent=purchasing", "since=1h&sort=state", "owner=vera"]
)
def test_every_page_of_a_filter_costs_the_same_queries(cast, many_runs, query):
    if "owner" in query:  # 70 runs: 35 assigned to vera, 35 she holds the decision authority of
        pks = list(Run.objects.values_list("pk", flat=True)[:70])
        Run.objects.filter(pk__in=pks[:35]).update(assignee=cast["vera"][0])
        Run.objects.filter(pk__in=pks[35:]).update(decision_authority=cast["vera"][0])
    client = browser(cast)
    client.get(f"/?{query}")
    counts, pages = [], 0
    link: str | None = query
    while link is not None:
        reset_queries()
        with CaptureQueriesContext(connection) as ctx:
            html = client.get(f"/?{link}").content.decode()
        counts.append(len(ctx.captured_queries))
        pages += 1
        link = next_link(html)
    assert pages >= 2, (query, counts)
    assert len(set(counts)) == 1, (query, counts)


def test_the_attention_chip_says_cap_plus_past_its_cap(cast, monkeypatch):
    """Counted to ATTENTION_CAP + 1 (a cheap count at any size), shown as "cap+", never "cap+1+"."""
    from console import run_list

    monkeypatch.setattr(run_list, "ATTENTION_CAP", 2)
    agent = Agent.objects.create(name="purchasing")
    for i in range(4):
        Run.objects.create(agent=agent, goal=f"stuck {i}", state="needs_attention")
    html = browser(cast).get("/").content.decode()
    chip = re.search(r'needs attention.{0,300}?class="n">([^<]*)<', html, re.S)
    assert chip and chip.group(1) == "2+"
