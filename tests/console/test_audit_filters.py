"""The audit page pages by keyset on seq (older and newer, the same queries at any depth) and filters
like the run list: actor, action, run id or prefix, outcome, time range; a bad value is a 400 naming it."""

from __future__ import annotations

import re
import uuid
from datetime import timedelta

import pytest
from django.db import connection, reset_queries
from django.test import Client
from django.test.utils import CaptureQueriesContext

from audit.models import AuditEvent
from audit.services import record_audit
from core.actors import Actor
from tests.conftest import triggers_off

pytestmark = pytest.mark.django_db

RUN = uuid.UUID("3f9a2c1b-0000-4000-8000-000000000001")


@pytest.fixture
def trail(cast):
    otto = Actor(kind="user", name="otto", component="console")
    seqs = []
    for i in range(230):
        seqs.append(
            record_audit(
                actor=otto,
                action="intervention.pause" if i % 2 else "run.claim",
                object_type="run",
                object_id=str(i),
                run_id=RUN if i % 5 == 0 else None,
                outcome=AuditEvent.DENIED if i % 7 == 0 else AuditEvent.ALLOWED,
            ).seq
        )
    return seqs


def browser(cast) -> Client:
    client = Client()
    client.force_login(cast["sam"][0])  # the trail mixes run and run-less events: sam reads both
    return client


def seqs_of(html: str) -> list[int]:
    return [int(s) for s in re.findall(r'<tr><td class="num">(\d+)</td>', html)]


def link(html: str, rel: str) -> str | None:
    found = re.search(rf'rel="{rel}" href="([^"]+)"', html)
    return found.group(1).replace("&amp;", "&") if found else None


def test_older_and_newer_pages_walk_the_trail_at_the_same_cost(cast, trail):
    client = browser(cast)
    client.get("/audit/")
    url, seen, counts = "/audit/?action=intervention", [], []
    while url:
        reset_queries()
        with CaptureQueriesContext(connection) as ctx:
            html = client.get(url).content.decode()
        counts.append(len(ctx.captured_queries))
        seen += seqs_of(html)
        url = link(html, "next")
    expected = sorted(
        AuditEvent.objects.filter(action="intervention.pause").values_list("seq", flat=True),
        reverse=True,
    )
    assert seen == expected and len(counts) == 2
    # the newest page also reads the settled horizon (audit.selectors.settled_seq: two statements,
    # three inside this test's transaction), the older one does not need it
    assert counts[1] >= 3 and counts[0] == counts[1] + 3, counts
    back = link(
        client.get(f"/audit/?action=intervention&before={seen[100]}").content.decode(), "prev"
    )
    assert back and "after=" in back
    # the page that started after seen[100] goes back to the 100 events just newer than its first
    assert seqs_of(client.get(back).content.decode()) == seen[1:101]


def test_it_filters_by_run_prefix_outcome_and_actor(cast, trail):
    client = browser(cast)
    html = client.get("/audit/", {"run": "3f9a2c1b", "outcome": "denied"}).content.decode()
    rows = seqs_of(html)
    expected = AuditEvent.objects.filter(run_id=RUN, outcome="denied").values_list("seq", flat=True)
    assert sorted(rows) == sorted(expected) and rows
    assert seqs_of(client.get("/audit/", {"actor": "nobody"}).content.decode()) == []


def test_it_filters_by_time_range(cast, trail):
    last = AuditEvent.objects.order_by("-seq").first()
    with triggers_off(["default"]):  # backdate part of the append-only trail, for the test only
        AuditEvent.objects.filter(seq__lte=trail[99]).update(
            created_at=last.created_at - timedelta(days=3)
        )
    client = browser(cast)
    recent = seqs_of(client.get("/audit/", {"since": "1d"}).content.decode())
    assert recent and min(recent) > trail[99]
    old = seqs_of(client.get("/audit/", {"until": "2d"}).content.decode())
    assert old and max(old) <= trail[99]


@pytest.mark.parametrize(
    "params, field",
    [
        ({"run": "not-an-id"}, "run"),
        ({"outcome": "maybe"}, "outcome"),
        ({"since": "last week"}, "since"),
        ({"before": "-1"}, "before"),
        ({"after": "x"}, "after"),
        ({"actor": "a" * 151}, "actor"),
    ],
)
def test_a_bad_filter_is_a_400_page_naming_it(cast, params, field):
    resp = browser(cast).get("/audit/", params)
    assert resp.status_code == 400 and field in resp.content.decode()
