"""What a claim or a finish decides on, read in ONE statement once the run is locked.

The run lock is taken first (``lock_run``): in READ COMMITTED the next statement takes a new snapshot,
so everything committed before the lock was granted is seen (the same reasoning as the declaration's
facts in ``effects.py``). On PostgreSQL the reads are scalar subqueries of one SELECT, each row as
``row_to_json`` (``core.pg.rows.from_json`` turns it back into an instance); elsewhere (the SQLite demo)
the same reads run one by one through the ORM.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import connection

from core import pg
from core.pg.rows import from_json, hot_cursor, select_row
from runs.models import Agent, Approval, Attempt, Checkpoint, Effect, ExecutionLease, Run
from runs.services.intake import HOLD_SQL, covering_hold

_SQL: dict[str, str] = {}


def _fetch(name: str, sql: str, params: dict[str, Any]) -> tuple:
    with hot_cursor(connection) as cursor:
        cursor.execute(_SQL.setdefault(name, sql), params)
        return cursor.fetchone()


def _pending_sql() -> str:
    return (
        f"(SELECT json_agg(a.id ORDER BY a.requested_at DESC) FROM {Approval._meta.db_table} a"
        f" WHERE a.run_id = %(run)s AND a.status = '{Approval.PENDING}')"
    )


def _pending_orm(run: Run) -> list[Any]:
    return list(
        Approval.objects.filter(run=run, status=Approval.PENDING).values_list("pk", flat=True)
    )


@dataclass
class ClaimFacts:
    agent: str  # the run's agent's name (for the token's scope)
    live_lease: ExecutionLease | None  # an active lease, if one is left
    checkpoint: (
        Checkpoint | None
    )  # where the attempt starts: the named resume point, else the latest
    pending_approvals: list[Any]  # ids, newest first
    # A live intake hold covering the run: [id, scope, target, reason, held_by] (runs/models/intake.py)
    hold: list[Any] | None = None


def claim_facts(run: Run) -> ClaimFacts:
    if not pg.enabled(connection):
        from runs.selectors import starting_checkpoint

        return ClaimFacts(
            run.agent.name,
            select_row(ExecutionLease, run=run.pk, status=ExecutionLease.ACTIVE),
            starting_checkpoint(run),
            _pending_orm(run),
            covering_hold(run),
        )
    leases, checkpoints = ExecutionLease._meta.db_table, Checkpoint._meta.db_table
    sql = (
        f"SELECT (SELECT name FROM {Agent._meta.db_table} WHERE id = %(agent)s),"
        f" (SELECT row_to_json(l) FROM {leases} l WHERE l.run_id = %(run)s"
        f"   AND l.status = '{ExecutionLease.ACTIVE}' LIMIT 1),"
        f" COALESCE((SELECT row_to_json(c) FROM {checkpoints} c WHERE c.id = %(resume)s),"
        f"   (SELECT row_to_json(c) FROM {checkpoints} c WHERE c.run_id = %(run)s"
        f"    ORDER BY c.seq DESC LIMIT 1)),"
        f" {_pending_sql()},"
        f" {HOLD_SQL}"
    )
    params = {"run": run.pk, "agent": run.agent_id, "resume": run.resume_checkpoint_id}
    agent, lease, checkpoint, pending, hold = _fetch("claim", sql, params)
    return ClaimFacts(
        agent,
        from_json(ExecutionLease, lease),
        from_json(Checkpoint, checkpoint),
        [Approval._meta.pk.to_python(pk) for pk in pending or ()],
        hold,
    )


@dataclass
class FinishFacts:
    lease: ExecutionLease | None  # the run's lease with the caller's fencing token
    unresolved: list[str]  # ids of the run's unresolved effects, in declaration order
    attempt_running: bool  # the current attempt has no outcome yet
    pending_approvals: list[Any]  # ids, newest first


def finish_facts(run: Run, fencing_token: Any) -> FinishFacts:
    token = None if fencing_token is None else int(fencing_token)
    if not pg.enabled(connection):
        lease = None
        if token is not None:
            lease = select_row(ExecutionLease, run=run.pk, fencing_token=token)
        unresolved = Effect.objects.filter(run=run).unresolved().values_list("pk", flat=True)
        attempt = run.current_attempt_id
        running = Attempt.objects.filter(pk=attempt, outcome=Attempt.RUNNING) if attempt else None
        return FinishFacts(
            lease,
            [str(pk) for pk in unresolved],
            running is not None and running.exists(),
            _pending_orm(run),
        )
    unresolved_statuses = ", ".join(f"'{status}'" for status in Effect.UNRESOLVED)
    sql = (
        f"SELECT (SELECT row_to_json(l) FROM {ExecutionLease._meta.db_table} l"
        f"   WHERE l.run_id = %(run)s AND l.fencing_token = %(token)s),"
        f" (SELECT json_agg(e.id ORDER BY e.declared_at) FROM {Effect._meta.db_table} e"
        f"   WHERE e.run_id = %(run)s AND e.decision = '{Effect.AUTHORIZED}'"
        f"   AND e.status IN ({unresolved_statuses})),"
        f" EXISTS (SELECT 1 FROM {Attempt._meta.db_table} a WHERE a.id = %(attempt)s"
        f"   AND a.outcome = '{Attempt.RUNNING}'),"
        f" {_pending_sql()}"
    )
    params = {"run": run.pk, "token": token, "attempt": run.current_attempt_id}
    lease, unresolved, running, pending = _fetch("finish", sql, params)
    return FinishFacts(
        from_json(ExecutionLease, lease),
        [str(pk) for pk in unresolved or ()],
        bool(running),
        [Approval._meta.pk.to_python(pk) for pk in pending or ()],
    )
