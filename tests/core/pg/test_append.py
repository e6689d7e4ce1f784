"""core/pg/append.py: a history link's INSERT and its head's UPDATE in one statement write what
``save(force_insert=True)`` and ``filter(pk=…).update(…)`` write (PostgreSQL)."""

from __future__ import annotations

import pytest

from core import pg
from core.actors import system_actor
from runs.models import HistoryEvent, Run
from runs.selectors import verify_history
from runs.services.history import append_history
from tests.conftest import start_run

pytestmark = pytest.mark.usefixtures("postgres_only")

SKIP = {"id", "run_id", "created_at", "at", "prev_hash", "hash"}


def _appended(worker) -> tuple[dict, tuple]:
    run = Run.objects.get(pk=start_run(worker)["id"])
    event = append_history(run, "note", {"said": "hello"}, actor=system_actor("test"))
    stored = HistoryEvent.objects.get(pk=event.pk)
    fields = {
        f.attname: getattr(stored, f.attname)
        for f in HistoryEvent._meta.concrete_fields
        if f.attname not in SKIP
    }
    run.refresh_from_db()
    assert run.history_head == stored.hash and verify_history(run)["ok"]
    return fields, (run.history_seq,)


def test_one_statement_writes_the_link_and_the_head_the_orm_would(worker):
    fast = _appended(worker)
    with pg.portable():
        twin = _appended(worker)
    assert fast == twin
