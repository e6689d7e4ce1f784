"""Housekeeping of RunTally (runs/models/run.py): the database appends a signed count per run
change; this folds them into one row per agent and state, so the run list's sum stays a few rows."""

from __future__ import annotations

from django.db import connection, transaction

from core import pg

COMPACT_SQL = """
WITH gone AS (DELETE FROM runs_runtally RETURNING agent_id, state, n)
INSERT INTO runs_runtally (agent_id, state, n)
SELECT agent_id, state, SUM(n) FROM gone GROUP BY agent_id, state HAVING SUM(n) <> 0
"""


COMPACT_LEDGER_SQL = """
WITH gone AS (DELETE FROM runs_ledgertally RETURNING series, key, n)
INSERT INTO runs_ledgertally (series, key, n)
SELECT series, key, SUM(n) FROM gone GROUP BY series, key HAVING SUM(n) <> 0
"""


def compact_tally() -> int:
    """One statement: the rows it deletes are summed back in, so every reader sees the same totals
    before and after, and rows the triggers add meanwhile are not in its snapshot and stay. Returns
    the rows left (0 on SQLite, where there is no tally)."""
    if not pg.enabled(connection):
        return 0
    with transaction.atomic(durable=True), connection.cursor() as cursor:
        cursor.execute(COMPACT_SQL)
        left = cursor.rowcount
        # the ledger's tallies (effects, lease expiries: /metrics) in the same beat
        cursor.execute(COMPACT_LEDGER_SQL)
        return left + cursor.rowcount
