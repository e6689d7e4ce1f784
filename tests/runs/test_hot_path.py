"""The worker protocol's round trips (issue 11): each call's statements stay within its budget, what
a new run's answer says from memory is what the database says, and one write statement carries the
audit append and the NOTIFY with the rows."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from audit.services import verify_chain
from runs.models import Run
from tests.conftest import claim, committed_with_next, declare, start_run

pytestmark = pytest.mark.usefixtures("postgres_only")


def _statements(call) -> tuple[object, list[str]]:
    """What ``call`` sent, without the savepoints the test's own transaction turns decisions into
    (a server-binding cursor's statements are logged as ``QUERY = '…' PARAMS = …``)."""
    with CaptureQueriesContext(connection) as seen:
        result = call()
    sql = [q["sql"].removeprefix("QUERY = '") for q in seen.captured_queries]
    return result, [s for s in sql if not s.startswith(("SAVEPOINT", "RELEASE SAVEPOINT"))]


def test_each_protocol_call_stays_within_its_statement_budget(worker):
    # Budgets include the edge's token lookup (and the outcome's effect -> run lookup); the SQL
    # PostgreSQL runs is: lock, one read of what the decision needs, one write (rows, audit, NOTIFY).
    assert worker.get("/runs").status_code == 200  # the token's first use records itself once
    run, sql = _statements(lambda: start_run(worker))
    assert len(sql) <= 3, sql
    answer, sql = _statements(lambda: claim(worker, run["id"]))
    assert len(sql) <= 5, sql
    token = answer["lease"]["fencing_token"]
    effect, sql = _statements(lambda: declare(worker, run["id"], token, key="k-0").json())
    assert len(sql) <= 4, sql
    body = committed_with_next(token, "k-1")
    answer, sql = _statements(lambda: worker.post(f"/effects/{effect['id']}/outcome", body))
    assert answer.status_code == 200 and answer.json()["next"]["http_status"] == 201
    assert len(sql) <= 8, sql
    nxt = answer.json()["next"]
    done = {"fencing_token": token, "status": "committed"}
    assert worker.post(f"/effects/{nxt['id']}/outcome", done).status_code == 200
    finish = {"fencing_token": token, "outcome": "succeeded"}
    answer, sql = _statements(lambda: worker.post(f"/runs/{run['id']}/finish", finish))
    assert answer.status_code == 200 and answer.json()["state"] == "succeeded"
    assert len(sql) <= 4, sql
    assert verify_chain().ok


def test_a_new_runs_answer_from_memory_is_what_the_database_says(worker):
    created = start_run(worker)
    stored = worker.get(f"/runs/{created['id']}")
    assert stored.status_code == 200
    assert created == stored.json()
    assert len(created["authority"]) == 2 and created["unresolved_effects"] == 0


def test_a_claim_writes_attempt_lease_history_audit_and_notify_in_one_statement(worker):
    run = start_run(worker)
    answer, sql = _statements(lambda: claim(worker, run["id"]))
    writes = [s for s in sql if s.lstrip().upper().startswith("WITH")]
    assert len(writes) == 1
    for table in ("runs_attempt", "runs_executionlease", "runs_historyevent", "audit_auditevent"):
        assert f'INSERT INTO "{table}"' in writes[0]
    assert "pg_notify" in writes[0]
    stored = Run.objects.get(pk=run["id"])
    assert stored.state == "running" and stored.fencing_token == answer["lease"]["fencing_token"]
    assert stored.history_seq == 3  # run_created, attempt_started, state_changed
    assert verify_chain().ok
