"""Verification reads the chain while writers keep appending: it must judge one snapshot."""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from audit.services import record_audit, verify_chain
from core.actors import system_actor

pytestmark = pytest.mark.django_db(transaction=True)


def test_verify_chain_is_not_fooled_by_rows_committed_during_the_walk(postgres_only):
    stop = threading.Event()
    actor = system_actor("test")

    def write():
        try:
            while not stop.is_set():
                record_audit(actor=actor, action="test.append", object_type="test", object_id="x")
        finally:
            connection.close()

    writers = [threading.Thread(target=write) for _ in range(3)]
    for w in writers:
        w.start()
    try:
        reports = [verify_chain(batch=7) for _ in range(30)]  # small batches: many reads per walk
    finally:
        stop.set()
        for w in writers:
            w.join(30)
    bad = [r.as_dict() for r in reports if not r.ok]
    assert not bad, bad
    assert reports[-1].checked > reports[0].checked  # the writers really were appending meanwhile
