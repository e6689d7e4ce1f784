"""The PostgreSQL fast paths, and the one switch between them and their portable twins.

The product runs on PostgreSQL; the demo (``make run`` without ``DATABASE_URL``) runs on SQLite. Where
the code says something only PostgreSQL can say (a data-modifying CTE, a prepared statement, a
snapshot, an advisory lock, LISTEN/NOTIFY, ``pg_trgm``), it asks :func:`enabled` and, when the answer
is no, runs its portable twin: the same rows written, the same result read, through the ORM. Nothing
else in the project looks at ``connection.vendor`` (``tests/core/pg/test_switch.py`` fails if
anything does), and every twin is held to its fast path on PostgreSQL by one test
(``tests/core/pg/``), run with :func:`portable`. Why the demo keeps SQLite rather than an embedded
PostgreSQL: docs/decisions/demo-database.md.

The fast paths, each with the measurement it rests on (docs/benchmarks.md has the figures and how to
rerun them):

- ``core/pg/rows.py``: equality lookups and a decision's whole write as cached hand-written SQL (one
  round trip per decision, prepared once per connection). The worker protocol spent ~12.6 ms of ~35 ms
  server CPU per effect in the ORM and psycopg driving ~32 statements, each its own round trip.
- ``core/pg/append.py``: a chain link's INSERT and its head's UPDATE as one statement (one round trip
  saved on every history append of the worker protocol).
- ``audit/chain/append.py``: an audit event and its chain head's move in one upsert statement, no
  global lock (chained appends through Django ran at 267–388/s against 779–805 plain rows/s with the
  single global chain).
- ``runs/services/effects.py``, ``runs/services/facts.py``: a declare's or an outcome's reads (lease,
  idempotency key, grants, approvals) as one statement returning ``row_to_json`` rows.
- ``runs/services/tally.py``, ``runs/search.py``: the run list's per-state counts from RunTally, which
  PostgreSQL triggers keep per agent and state (migration ``runs/0014``), instead of a ``COUNT(*) GROUP
  BY`` over every run on every render of the list; the twin counts with that GROUP BY.
- ``runs/directive_bus.py``, ``runs/services/decisions.py``: LISTEN/NOTIFY wake long-polling heartbeats;
  the twin polls.
- ``audit/services.py`` (one REPEATABLE READ snapshot for verification), ``audit/selectors.py`` (the
  settled horizon of the audit sequence), ``audit/anchors/`` (the anchor writers' advisory lock, the
  heads moved since a snapshot): correctness under concurrent writers, which SQLite's serialised
  writers give for free.

Migrations decide by ``schema_editor.connection.vendor`` themselves: a migration describes the schema
once and must not change with this module.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

_portable: ContextVar[bool] = ContextVar("core_pg_portable", default=False)


def enabled(connection: Any) -> bool:
    """Whether ``connection`` takes the PostgreSQL paths: it is PostgreSQL, and no test asked for the
    portable twins (:func:`portable`)."""
    return connection.vendor == "postgresql" and not _portable.get()


@contextmanager
def portable() -> Iterator[None]:
    """Inside: every branch takes its portable twin, even on PostgreSQL. For the tests that hold each
    fast path to its twin on the same database; not for production code."""
    token = _portable.set(True)
    try:
        yield
    finally:
        _portable.reset(token)
