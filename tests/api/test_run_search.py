"""GET /api/v1/runs reads the run list's filter (runs/search.py): prefixes, chips, time ranges,
keyset cursors, and a 400 JSON naming a bad parameter."""

from __future__ import annotations

import uuid

import pytest

from runs.models import Agent, Run
from tests.conftest import claim, declare, start_run

pytestmark = pytest.mark.django_db


def test_it_filters_and_pages_runs_with_cursors(as_user, worker, agent):
    started = [start_run(worker, goal=f"buy {i}") for i in range(5)]
    vera = as_user("vera")
    first = vera.get("/runs", limit=2)
    assert first.status_code == 200
    body = first.json()
    assert [r["id"] for r in body["runs"]] == [r["id"] for r in reversed(started)][:2]
    assert body["prev_cursor"] is None and body["next_cursor"]
    seen = [r["id"] for r in body["runs"]]
    cursor = body["next_cursor"]
    while cursor:
        page = vera.get("/runs", limit=2, after=cursor).json()
        seen += [r["id"] for r in page["runs"]]
        cursor = page["next_cursor"]
    assert seen == [r["id"] for r in reversed(started)]


def test_it_finds_a_run_by_id_prefix_and_by_effect_touched(as_user, worker, agent):
    charged = start_run(worker)
    other = start_run(worker)
    token = claim(worker, charged["id"])["lease"]["fencing_token"]
    assert declare(worker, charged["id"], token).status_code == 201
    vera = as_user("vera")
    by_prefix = vera.get("/runs", id=charged["id"][:8]).json()["runs"]
    assert [r["id"] for r in by_prefix] == [charged["id"]]
    touched = vera.get("/runs", touched="payments:charge").json()["runs"]
    assert [r["id"] for r in touched] == [charged["id"]]
    assert touched[0]["unresolved_effects"] == 1
    running = vera.get("/runs", state="running,paused").json()["runs"]
    assert [r["id"] for r in running] == [charged["id"]]
    assert {r["id"] for r in vera.get("/runs", q=other["id"][:8]).json()["runs"]} == {other["id"]}


def test_repeated_parameters_all_count(as_user, worker, agent):
    start_run(worker)
    refund = Run.objects.create(agent=Agent.objects.create(name="refunds"), goal="refund")
    vera = as_user("vera")
    resp = vera.client.get("/api/v1/runs?agent=purchasing&agent=refunds", **vera.headers)
    assert resp.status_code == 200
    assert str(refund.pk) in {r["id"] for r in resp.json()["runs"]}
    assert len(resp.json()["runs"]) == 2


@pytest.mark.parametrize(
    "params, field",
    [
        ({"state": "runnning"}, "state"),
        ({"id": "not-hex"}, "id"),
        ({"since": "soon"}, "since"),
        ({"sort": "goal"}, "sort"),
        ({"after": "garbage"}, "after"),
        ({"attention": "maybe"}, "attention"),
    ],
)
def test_a_bad_filter_is_a_400_json_naming_the_field(as_user, params, field):
    resp = as_user("vera").get("/runs", **params)
    assert resp.status_code == 400, resp.content
    body = resp.json()
    assert body["error"] == "bad_filter" and body["field"] == field and field in body["detail"]


def test_a_nul_byte_is_refused_naming_the_field(as_user):
    resp = as_user("vera").get("/runs", q="a\x00b")
    assert resp.status_code in (400, 422) and resp.json()["field"] == "q"


def test_a_worker_token_lists_only_its_agents_runs(worker, agent):
    mine = start_run(worker)
    Run.objects.create(agent=Agent.objects.create(name="refunds"), goal="not mine", id=uuid.uuid4())
    assert [r["id"] for r in worker.get("/runs").json()["runs"]] == [mine["id"]]
