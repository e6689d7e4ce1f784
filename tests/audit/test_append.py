"""Appending to a chain: one statement, the hash PostgreSQL computes is the one Python verifies, a run's
events on the run's chain and everything else on the system chain."""

from __future__ import annotations

import uuid

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from audit.chain.append import chain_for, split_payload
from audit.chain.hashing import GENESIS, canonical, link_hash
from audit.models import SYSTEM, AuditChain, AuditEvent
from audit.services import record_audit, verify_chain
from core.actors import system_actor

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("postgres_only")]

ACTOR = system_actor("test")


@pytest.mark.parametrize(
    "fields",
    [
        {"seq": 7, "a": 1, "z": "x"},
        {"seq": 12, "chain": "run:1", "context": {"seq": 0, "note": "ünïcødé ✓", "n": [1, 2.5]}},
        {"seq": 1},
        {"seq": 3, "aa": None},
        {"seq": 3, "zz": {"seq": 9}},
    ],
)
def test_the_position_splits_the_canonical_bytes_exactly(fields):
    before, after = split_payload(fields)
    assert (before + str(fields["seq"]) + after).encode() == canonical(fields)


def test_postgres_computes_the_hash_python_verifies_with_every_kind_of_content():
    run_id = uuid.uuid4()
    first = record_audit(
        actor=ACTOR,
        action="test.event",
        object_type="run",
        object_id=run_id,
        run_id=run_id,
        reason='ünïcødé reason, quotes " and backslashes \\ and a newline\n',
        context={"amount": 10.5, "nested": {"seq": 1, "list": [None, True, "✓"]}, "emoji": "🚀"},
    )
    second = record_audit(
        actor=ACTOR, action="test.event", object_type="run", object_id=run_id, run_id=run_id
    )
    for event in (first, second):
        stored = AuditEvent.objects.get(pk=event.pk)
        assert stored.hash == event.hash == link_hash(stored.prev_hash, stored.hashed_fields())
    assert (first.chain, first.chain_seq, first.prev_hash) == (f"run:{run_id}", 1, GENESIS)
    assert (second.chain_seq, second.prev_hash) == (2, first.hash)
    head = AuditChain.objects.get(key=f"run:{run_id}")
    assert (head.seq, head.hash, head.prev_hash) == (2, second.hash, first.hash)
    assert second.seq > first.seq  # the global reading order
    assert verify_chain().ok


def test_an_append_is_one_statement_and_takes_no_global_lock():
    run_id = uuid.uuid4()
    with transaction.atomic(), CaptureQueriesContext(connection) as queries:
        record_audit(
            actor=ACTOR, action="test.event", object_type="run", object_id=1, run_id=run_id
        )
        record_audit(
            actor=ACTOR, action="test.event", object_type="run", object_id=1, run_id=run_id
        )
    statements = [q["sql"] for q in queries.captured_queries]
    assert len(statements) == 2  # one per event: the INSERT with its head's move folded in
    assert all("FOR UPDATE" not in sql for sql in statements)
    assert all("ON CONFLICT" in sql and "INSERT INTO" in sql for sql in statements)


def test_run_events_go_to_the_runs_chain_and_the_rest_to_the_system_chain():
    run_id = uuid.uuid4()
    assert chain_for(run_id) == f"run:{run_id}" and chain_for(None) == SYSTEM
    on_run = record_audit(actor=ACTOR, action="a", object_type="run", object_id=1, run_id=run_id)
    other = record_audit(actor=ACTOR, action="b", object_type="user", object_id=1)
    assert (on_run.chain, other.chain) == (f"run:{run_id}", SYSTEM)
    report = verify_chain()
    assert report.ok and report.chains == 2 and report.checked == 2
