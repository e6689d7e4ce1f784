"""The run state machine in the database: a PostgreSQL trigger generated from runs/states.py refuses
every change of ``runs_run.state`` along no edge of the table, whoever writes it (raw SQL included),
and lets every edge of the table through."""

from __future__ import annotations

import re
from itertools import product

import pytest
from django.core.management import call_command
from django.db import DatabaseError, connection, transaction

from runs.models import Agent, Run
from runs.states import TRANSITIONS, State, state_edges

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("postgres_only")]

EDGES = state_edges()
FORBIDDEN = [
    (a.value, b.value)
    for a, b in product(State, State)
    if a != b and (a.value, b.value) not in EDGES
]


@pytest.fixture
def run(db) -> Run:
    agent = Agent.objects.create(name="trigger-test", allowed_scopes=[])
    return Run.objects.create(agent=agent, goal="exercise the state trigger")


def _force_state(run: Run, state: str) -> None:
    """Put the run in ``state`` past the trigger, as a test set-up (replica mode skips triggers)."""
    with connection.cursor() as cur:
        cur.execute("SET session_replication_role = replica")
        cur.execute("UPDATE runs_run SET state = %s WHERE id = %s", [state, run.pk])
        cur.execute("SET session_replication_role = DEFAULT")


def _sql_move(run: Run, state: str) -> None:
    with connection.cursor() as cur:
        cur.execute("UPDATE runs_run SET state = %s WHERE id = %s", [state, run.pk])


def test_edges_are_every_transition_of_the_table():
    from_table = {
        (s.value, t.target.value) for s, edges in TRANSITIONS.items() for t in edges.values()
    }
    assert set(EDGES) == from_table and len(EDGES) == len(set(EDGES))
    # worker-protocol facts and job outcomes are edges too, not only interventions
    assert ("queued", "running") in EDGES and ("running", "orphaned") in EDGES
    assert ("compensating", "compensation_failed") in EDGES


def test_a_forbidden_transition_written_with_raw_sql_is_refused(run):
    with pytest.raises(DatabaseError, match="Invalid transition"), transaction.atomic():
        _sql_move(run, "succeeded")  # queued -> succeeded skips the whole run
    run.refresh_from_db()
    assert run.state == "queued"


def test_a_forbidden_transition_through_the_orm_is_refused(run):
    _force_state(run, "closed")
    with pytest.raises(DatabaseError, match="Invalid transition"), transaction.atomic():
        Run.objects.filter(pk=run.pk).update(state="running")  # closed is terminal
    run.refresh_from_db()
    assert run.state == "closed"


@pytest.mark.parametrize(("source", "target"), EDGES)
def test_every_edge_of_the_table_is_allowed(run, source, target):
    _force_state(run, source)
    _sql_move(run, target)
    run.refresh_from_db()
    assert run.state == target


def test_every_pair_off_the_table_is_refused(run):
    refused = []
    for source, target in FORBIDDEN:
        _force_state(run, source)
        try:
            with transaction.atomic():
                _sql_move(run, target)
        except DatabaseError as err:
            assert "Invalid transition" in str(err)
            refused.append((source, target))
    assert refused == FORBIDDEN


def test_writes_that_keep_the_state_are_not_transitions(run):
    with connection.cursor() as cur:
        cur.execute("UPDATE runs_run SET goal = 'changed', state = state WHERE id = %s", [run.pk])
    run.refresh_from_db()
    assert run.goal == "changed" and run.state == "queued"


def test_the_installed_trigger_enforces_exactly_the_table():
    """The function PostgreSQL runs names the table's edges, no more, no fewer; and the migrations
    are in step with the models (a changed table would show up as a pending migration)."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT p.prosrc FROM pg_trigger t JOIN pg_proc p ON p.oid = t.tgfoid "
            "WHERE t.tgrelid = 'runs_run'::regclass AND t.tgname LIKE 'pgtrigger_run_state_%%'"
        )
        (source,) = cur.fetchone()
    pairs = re.search(r"ANY\('\{([^}]*)\}'", source).group(1).split(",")
    assert sorted(tuple(p.split(":")) for p in pairs) == EDGES
    call_command("makemigrations", "runs", "audit", check=True, dry_run=True, verbosity=0)
