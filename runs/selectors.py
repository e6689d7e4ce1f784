"""Read models: the JSON shapes of runs, attempts, leases and grants (selectors read, services write)."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from django.db import connection
from django.db.models import QuerySet
from django.utils import timezone

from core.actors import Actor
from core.errors import Forbidden, NotFound
from core.roles import may
from runs.models import Approval, Effect, ExecutionLease, HistoryEvent, Run, Timer
from runs.services.common import authority_envelope, checkpoint_summary, starting_checkpoint
from runs.services.effects import effect_dict
from runs.states import allowed_events, directive_for


def visible_runs(actor: Actor) -> QuerySet[Run]:
    qs = Run.objects.select_related("agent", "assignee", "decision_authority")
    if actor.is_worker:
        return qs.filter(agent__name__in=actor.agents) if actor.agents else qs
    if not may(actor.roles, "view"):
        raise Forbidden("no role grants viewing runs")
    return qs


def get_visible_run(actor: Actor, run_id: Any) -> Run:
    run = visible_runs(actor).filter(pk=run_id).first()
    if run is None:
        raise NotFound(f"run {run_id} does not exist", object="run")
    return run


def run_summary(run: Run, unresolved: int | None = None) -> dict[str, Any]:
    return {
        "id": str(run.pk),
        "agent": run.agent.name,
        "goal": run.goal,
        "state": run.state,
        "directive": directive_for(run.state),
        "parent_run_id": str(run.parent_id) if run.parent_id else None,
        "attempt": run.attempt_count,
        "fencing_token": run.fencing_token,
        "assignee": run.assignee.username if run.assignee else None,
        "decision_authority": run.decision_authority.username if run.decision_authority else None,
        "created_at": run.created_at.isoformat(),
        "state_changed_at": run.state_changed_at.isoformat(),
        "deadline": run.deadline.isoformat() if run.deadline else None,
        "unresolved_effects": unresolved,
    }


def run_detail(run: Run) -> dict[str, Any]:
    if run.new_grants is not None and run.history_seq == 1:  # as create_run left it
        return _new_run_detail(run, run.new_grants)
    leases = run.leases.order_by("-granted_at")
    return run_summary(run) | {
        "input": run.input,
        "versions": run.versions,
        "retry_policy": run.retry_policy,
        "allowed_events": [e.value for e in allowed_events(run.state)],
        "children": [
            {"id": str(c.pk), "state": c.state, "agent": c.agent.name}
            for c in run.children.select_related("agent")
        ],
        "attempts": [
            {
                "id": str(a.pk),
                "number": a.number,
                "worker": a.worker,
                "outcome": a.outcome,
                "failure_class": a.failure_class,
                "started_at": a.started_at.isoformat(),
                "ended_at": a.ended_at.isoformat() if a.ended_at else None,
                "started_from": a.started_from.seq if a.started_from else None,
            }
            for a in run.attempts.select_related("started_from")
        ],
        "leases": [
            {
                "id": str(le.pk),
                "worker": le.worker,
                "fencing_token": le.fencing_token,
                "status": le.status,
                "expires_at": le.expires_at.isoformat(),
                "end_reason": le.end_reason,
            }
            for le in leases[:10]
        ],
        "authority": authority_envelope(run),
        "checkpoint": checkpoint_summary(starting_checkpoint(run)),
        "approvals": [
            {
                "id": str(a.pk),
                "status": a.status,
                "tool": a.tool,
                "action": a.action,
                "digest": a.digest,
                "deadline": a.deadline.isoformat() if a.deadline else None,
            }
            for a in run.approvals.all()
        ],
        "unresolved_effects": Effect.objects.filter(run=run).unresolved().count(),
    }


def _new_run_detail(run: Run, grants: list) -> dict[str, Any]:
    """``run_detail`` of the run ``create_run`` just wrote, from memory: it has its grants and its
    first history link, nothing else yet (no children, attempts, leases, checkpoints, approvals or
    effects), so nothing is read back."""
    return run_summary(run) | {
        "input": run.input,
        "versions": run.versions,
        "retry_policy": run.retry_policy,
        "allowed_events": [e.value for e in allowed_events(run.state)],
        "children": [],
        "attempts": [],
        "leases": [],
        "authority": authority_envelope(run, grants),
        "checkpoint": None,
        "approvals": [],
        "unresolved_effects": 0,
    }


def ledger(run: Run) -> list[dict]:
    return [effect_dict(e) for e in run.effects.order_by("declared_at")]


def woken_directive(*, run_id: Any, lease_id: Any, fencing_token: int) -> dict[str, Any] | None:
    """What a woken heartbeat long-poll answers, read in one statement and written nowhere: the
    directive, its reason and the latest approval now, with the lease as its first beat left it
    (``expires_at`` at least ``LEASE_TTL_S - wait_s`` away). ``None`` when only a heartbeat can
    answer: the lease is no longer this caller's active, current lease (the beat says ``lease_lost``),
    or fired timers wait for delivery (the beat delivers them). Same shape as the beat's answer.
    Plain SQL: the ORM's compiler cost more CPU than the statement (it runs on every wake-up)."""
    with connection.cursor() as cursor:
        cursor.execute(_woken_sql(), [Timer.FIRED, str(lease_id), str(run_id)])
        row = cursor.fetchone()
    if row is None:
        return None
    status, expires_at, token, state, run_token, reason, approval, timers_waiting = row
    if (
        status != ExecutionLease.ACTIVE
        or not fencing_token == token == run_token
        or expires_at <= timezone.now()
        or timers_waiting
    ):
        return None
    return {
        "directive": directive_for(state),
        "reason": reason or "",
        "state": state,
        "expires_at": expires_at.isoformat(),
        "lease_status": status,
        "fencing_token": token,
        "timers_fired": [],
        "approval": approval,
    }


@lru_cache(maxsize=1)
def _woken_sql() -> str:
    lease, run = ExecutionLease._meta.db_table, Run._meta.db_table
    history, approval, timer = (
        HistoryEvent._meta.db_table,
        Approval._meta.db_table,
        Timer._meta.db_table,
    )
    return (
        f"SELECT l.status, l.expires_at, l.fencing_token, r.state, r.fencing_token, "
        f"(SELECT h.data ->> 'reason' FROM {history} h WHERE h.run_id = r.id "
        f"AND h.kind = 'state_changed' ORDER BY h.seq DESC LIMIT 1), "
        f"(SELECT json_build_object('id', a.id, 'status', a.status, 'tool', a.tool, "
        f"'action', a.action, 'digest', a.digest, 'decision_reason', a.decision_reason) "
        f"FROM {approval} a WHERE a.run_id = r.id ORDER BY a.requested_at DESC LIMIT 1), "
        f"EXISTS (SELECT 1 FROM {timer} t WHERE t.run_id = r.id AND t.status = %s) "
        f"FROM {lease} l JOIN {run} r ON r.id = l.run_id WHERE l.id = %s AND l.run_id = %s"
    )
