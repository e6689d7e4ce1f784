"""The run list at scale, on PostgreSQL: the search box's goal text goes through the trigram index
(migration 0013), and the counts per state come from RunTally, which the database keeps exact as
runs are created, change state or agent, and are deleted (triggers), folded by compact_tally."""

from __future__ import annotations

import uuid

import pytest
from django.conf import settings
from django.db import connection, transaction
from django.db.models import Count
from django.http import QueryDict
from django.test.utils import CaptureQueriesContext

from core.actors import Actor
from core.auth import actor_for_user
from runs.models import Agent, Run, RunTally
from runs.search import RunFilter, state_counts
from runs.services.tally import compact_tally

pytestmark = pytest.mark.django_db


@pytest.fixture
def viewer(cast):
    return actor_for_user(cast["vera"][0], None, component="console")


@pytest.fixture
def agents(db):
    return [Agent.objects.create(name=n) for n in ("purchasing", "refunds")]


def tallied() -> dict[tuple[int, str], int]:
    out: dict[tuple[int, str], int] = {}
    for t in RunTally.objects.all():
        out[(t.agent_id, t.state)] = out.get((t.agent_id, t.state), 0) + t.n
    return {k: n for k, n in out.items() if n}


def counted() -> dict[tuple[int, str], int]:
    rows = Run.objects.order_by().values_list("agent_id", "state").annotate(n=Count("*"))
    return {(a, s): n for a, s, n in rows}


def plan(sql: str, params) -> str:
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN " + sql, params)
        return "\n".join(row[0] for row in cursor.fetchall())


def test_the_goal_search_uses_the_trigram_index(viewer, agents):
    with connection.cursor() as cursor:
        cursor.execute("SELECT indexdef FROM pg_indexes WHERE indexname = 'run_goal_trgm'")
        (indexdef,) = cursor.fetchone()
    assert "gin" in indexdef and "gin_trgm_ops" in indexdef and "upper(goal)" in indexdef
    Run.objects.bulk_create(Run(agent=agents[i % 2], goal=f"buy {i} of sku-{i}") for i in range(30))
    qs = RunFilter.from_query(QueryDict("q=SKU-17")).queryset(viewer).order_by("-created_at")
    assert [r.goal for r in qs] == ["buy 17 of sku-17"]
    sql, params = qs.query.sql_with_params()
    # A table this small is scanned whatever the indexes; without scans of a whole table or index,
    # the plan left is the one the query's shape allows: a bitmap read of the trigram index.
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL enable_seqscan = off")
            cursor.execute("SET LOCAL enable_indexscan = off")
        explained = plan(sql, params)
    assert "run_goal_trgm" in explained, explained


def test_a_search_naming_an_agent_matches_its_runs_by_id_not_a_join(viewer, agents):
    mine = Run.objects.create(agent=agents[1], goal="anything")
    Run.objects.create(agent=agents[0], goal="other")
    qs = RunFilter.from_query(QueryDict("q=refunds")).queryset(viewer)
    assert [r.pk for r in qs] == [mine.pk]
    sql, _ = qs.query.sql_with_params()
    assert "runs_agent" not in sql.split("WHERE", 1)[1]  # the agent's id was looked up first


def test_the_tally_follows_every_insert_state_change_move_and_delete(agents):
    purchasing, refunds = agents
    runs = Run.objects.bulk_create(
        Run(agent=purchasing if i % 3 else refunds, goal=f"run {i}", state="queued")
        for i in range(12)
    )
    assert tallied() == counted() == {(purchasing.pk, "queued"): 8, (refunds.pk, "queued"): 4}
    Run.objects.filter(pk__in=[r.pk for r in runs[:5]]).update(state="running")
    Run.objects.filter(pk=runs[0].pk).update(state="succeeded")
    Run.objects.filter(pk=runs[1].pk).update(agent=refunds)  # a move between agents
    Run.objects.filter(pk=runs[2].pk).update(goal="renamed")  # no state change: no row
    assert tallied() == counted()
    Run.objects.filter(pk__in=[r.pk for r in runs[-2:]]).delete()
    assert tallied() == counted()
    rows_before = RunTally.objects.count()
    left = compact_tally()
    assert tallied() == counted()
    assert left == RunTally.objects.count() == len(counted()) < rows_before


def test_counts_per_state_read_the_tally_and_match_a_count_of_the_runs(viewer, agents):
    purchasing, refunds = agents
    for i, state in enumerate(["queued", "running", "running", "paused", "failed"]):
        Run.objects.create(agent=purchasing if i % 2 else refunds, goal="g", state=state)
    for query, expected in [
        ("", {"queued": 1, "running": 2, "paused": 1, "failed": 1}),
        ("state=running&sort=-updated", {"queued": 1, "running": 2, "paused": 1, "failed": 1}),
        ("agent=purchasing", {"running": 1, "paused": 1}),
        ("agent=refunds&agent=purchasing", {"queued": 1, "running": 2, "paused": 1, "failed": 1}),
        ("agent=nobody", {}),
    ]:
        with CaptureQueriesContext(connection) as ctx:
            counts = state_counts(viewer, RunFilter.from_query(QueryDict(query)))
        assert counts.by_state == expected and counts.complete, query
        assert len(ctx.captured_queries) == 1, query
        assert "runs_runtally" in ctx.captured_queries[0]["sql"], query
        assert '"runs_run"' not in ctx.captured_queries[0]["sql"], query
    # any other filter counts the runs it selects
    with CaptureQueriesContext(connection) as ctx:
        since = state_counts(viewer, RunFilter.from_query(QueryDict("since=1h")))
    assert since.by_state == {"queued": 1, "running": 2, "paused": 1, "failed": 1}
    assert "runs_runtally" not in " ".join(q["sql"] for q in ctx.captured_queries)


def test_a_worker_token_counts_only_its_agents_runs(agents):
    purchasing, refunds = agents
    Run.objects.create(agent=purchasing, goal="g", state="running")
    Run.objects.create(agent=refunds, goal="g", state="running")
    worker = Actor(kind="worker", name="w", roles=frozenset(), agents=("refunds",))
    assert state_counts(worker, RunFilter()).by_state == {"running": 1}
    only_other = RunFilter.from_query(QueryDict("agent=purchasing"))
    assert state_counts(worker, only_other).by_state == {}


def test_compaction_folds_to_one_row_per_agent_and_state_again_and_again(agents):
    Run.objects.create(agent=agents[0], goal="g", state="queued", id=uuid.uuid4())
    compact_tally()
    Run.objects.create(agent=agents[0], goal="g", state="queued")
    compact_tally()
    compact_tally()
    assert tallied() == counted() == {(agents[0].pk, "queued"): 2}
    assert RunTally.objects.count() == 1
    assert (
        settings.CELERY_BEAT_SCHEDULE["compact-run-tally"]["task"] == "runs.tasks.compact_run_tally"
    )
