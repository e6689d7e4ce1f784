"""Every PostgreSQL fast path against its portable twin, on the same PostgreSQL database.

``core.pg.portable()`` makes every branch take the twin the SQLite demo runs, so each test here runs
one piece of work both ways and asserts the same rows were written, or the same answer read
(core/pg/__init__.py lists the fast paths and why each exists).
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.http import QueryDict
from django.test.utils import CaptureQueriesContext

from audit.anchors.heads import read_heads
from audit.models import AuditEvent
from audit.services import record_audit, verify_chain
from core import pg
from core.actors import Actor, system_actor
from runs.models import Effect, HistoryEvent, Run, StandingFreeze
from runs.search import RunFilter, state_counts
from runs.selectors import verify_history
from runs.services.effects import declaration_facts
from runs.services.facts import claim_facts, finish_facts
from tests.conftest import claim, committed_with_next, declare, start_run

pytestmark = pytest.mark.usefixtures("postgres_only")


def _protocol(worker) -> dict[str, Any]:
    """A run through the worker protocol: start, claim, an authorized and a refused declaration, an
    outcome carrying a checkpoint and the next declaration, its outcome, finish. Returns the answers
    and every row written, without what differs between two runs (ids, times, hashes)."""
    run = start_run(worker)
    token = claim(worker, run["id"])["lease"]["fencing_token"]
    first = declare(worker, run["id"], token, key="k-0")
    refused = declare(worker, run["id"], token, key="k-x", tool="shipping", action="ship")
    body = committed_with_next(token, "k-1")
    outcome = worker.post(f"/effects/{first.json()['id']}/outcome", body)
    nxt = outcome.json()["next"]
    done = worker.post(
        f"/effects/{nxt['id']}/outcome", {"fencing_token": token, "status": "committed"}
    )
    finish = worker.post(
        f"/runs/{run['id']}/finish", {"fencing_token": token, "outcome": "succeeded"}
    )
    stored = Run.objects.get(pk=run["id"])
    return {
        "answers": [r.status_code for r in (first, refused, outcome, done, finish)],
        "run": (stored.state, stored.attempt_count, stored.history_seq, stored.checkpoint_seq),
        "history": list(
            HistoryEvent.objects.filter(run=stored).order_by("seq").values_list("seq", "kind")
        ),
        "effects": sorted(
            Effect.objects.filter(run=stored).values_list("idempotency_key", "decision", "status")
        ),
        "audit": list(
            AuditEvent.objects.filter(run_id=stored.pk)
            .order_by("chain_seq")
            .values_list("chain_seq", "action", "outcome")
        ),
        "history_ok": verify_history(stored)["ok"],
    }


def test_the_protocols_one_statement_writes_and_reads_write_what_the_orm_writes(worker):
    """core/pg/rows.py (select_rows, write_rows), core/pg/append.py (history append),
    audit/chain/append.py (audit append), runs/services/effects.py and facts.py (one-statement
    reads): one protocol run each way writes the same rows and gets the same answers."""
    with CaptureQueriesContext(connection) as fast_sql:
        fast = _protocol(worker)
    with pg.portable(), CaptureQueriesContext(connection) as twin_sql:
        twin = _protocol(worker)
    assert fast == twin
    assert fast["history_ok"] and fast["answers"] == [201, 409, 200, 200, 200]
    assert verify_chain().ok  # the chains hold across both paths' links
    # Really two paths: the twin sent no data-modifying CTE, and more statements.
    assert any(
        q["sql"].removeprefix("QUERY = '").startswith("WITH") for q in fast_sql.captured_queries
    )
    assert not any(q["sql"].startswith("WITH") for q in twin_sql.captured_queries)
    assert len(twin_sql.captured_queries) > len(fast_sql.captured_queries)


def test_an_audit_append_links_the_same_way_on_both_paths(db):
    """audit/chain/append.py: the hash computed in SQL is the one Python computes for the twin."""
    actor = system_actor("test")
    fast = record_audit(actor=actor, action="t.fast", object_type="x", object_id=1)
    with pg.portable():
        twin = record_audit(actor=actor, action="t.twin", object_type="x", object_id=2)
    assert (fast.chain, fast.chain_seq + 1, fast.hash) == (
        twin.chain,
        twin.chain_seq,
        twin.prev_hash,
    )
    assert verify_chain().ok


def test_a_declarations_facts_read_the_same_rows_on_both_paths(worker):
    """runs/services/effects.py: one SELECT of row_to_json rows against the reads one by one."""
    run_id = start_run(worker)["id"]
    token = claim(worker, run_id)["lease"]["fencing_token"]
    assert declare(worker, run_id, token, key="k-0").status_code == 201
    run = Run.objects.get(pk=run_id)
    for over, agent, text in (
        ("everything", None, ""),
        ("agent", run.agent, ""),
        ("filter", None, "q=x"),
    ):
        StandingFreeze.objects.create(
            capability="payments:*",
            over=over,
            agent=agent,
            run_filter=text,
            reason="r",
            frozen_by="t",
        )
    for key, tool, action in (("k-0", "payments", "charge"), ("k-9", "shipping", "ship")):
        fast = declaration_facts(run, token, key, tool, action)
        with pg.portable():
            twin = declaration_facts(run, token, key, tool, action)
        assert _pks(fast) == _pks(twin), key
        assert len(fast.standing) == (3 if tool == "payments" else 0)


def test_a_claims_and_a_finishs_facts_read_the_same_rows_on_both_paths(worker):
    """runs/services/facts.py."""
    run_id = start_run(worker)["id"]
    run = Run.objects.get(pk=run_id)
    fast = claim_facts(run)
    with pg.portable():
        twin = claim_facts(run)
    assert _pks(fast) == _pks(twin)
    token = claim(worker, run_id)["lease"]["fencing_token"]
    assert declare(worker, run_id, token, key="k-0").status_code == 201
    run.refresh_from_db()
    fast = finish_facts(run, token)
    with pg.portable():
        twin = finish_facts(run, token)
    assert _pks(fast) == _pks(twin) and fast.lease is not None and len(fast.unresolved) == 1


def test_the_run_lists_counts_from_the_tally_equal_a_count_of_the_runs(worker, agent):
    """runs/search.py + runs/services/tally.py: RunTally (kept by triggers) against GROUP BY."""
    for state in ("queued", "running", "running", "paused"):
        Run.objects.create(agent=agent, goal="g", state=state)
    viewer = Actor(kind="worker", name="w", roles=frozenset(), agents=("purchasing",))
    for query in ("", "agent=purchasing"):
        flt = RunFilter.from_query(QueryDict(query))
        fast = state_counts(viewer, flt)
        with pg.portable():
            twin = state_counts(viewer, flt)
        assert fast.by_state == twin.by_state == {"queued": 1, "running": 2, "paused": 1}, query


def test_the_anchor_reads_the_same_heads_on_both_paths(db):
    """audit/anchors/heads.py: without a previous snapshot every head counts as moved, both ways."""
    record_audit(actor=system_actor("test"), action="t", object_type="x", object_id=1)
    every, moved, snapshot = read_heads(None)
    with pg.portable():
        every_twin, moved_twin, snapshot_twin = read_heads(None)
    assert every == moved == every_twin == moved_twin and every
    assert snapshot and snapshot_twin is None


def _pks(facts: Any) -> dict[str, Any]:
    """A facts dataclass with every instance replaced by its primary key (lists element-wise)."""

    def key(value: Any) -> Any:
        if isinstance(value, list):
            return [key(v) for v in value]
        return getattr(value, "pk", value)

    return {name: key(value) for name, value in vars(facts).items()}
