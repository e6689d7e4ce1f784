"""Read models: the JSON shapes of runs, attempts, leases, grants, checkpoints and effects, and the
snapshots decisions record in their audit context (selectors read, services write; a selector never
imports a service: pyproject.toml's import-linter contracts)."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from django.contrib.auth import get_user_model
from django.db import connection
from django.db.models import Q, QuerySet
from django.utils import timezone

from core.actors import Actor
from core.errors import Forbidden, NotFound
from core.roles import may
from runs.integrity import walk_history
from runs.models import (
    Agent,
    Approval,
    AuthorityGrant,
    Checkpoint,
    Effect,
    ExecutionLease,
    HistoryEvent,
    Run,
    Timer,
)
from runs.states import allowed_events, directive_for
from runs.team_scope import scoped, team_deciders


def visible_runs(actor: Actor) -> QuerySet[Run]:
    """The runs ``actor`` may know of: a worker token's agents' (if it names any), and only its own
    team's; a person's role must grant viewing, and only their teams' runs exist for them (every
    team's with cross_team: runs.team_scope)."""
    qs = Run.objects.select_related("agent", "assignee", "decision_authority")
    if actor.is_worker:
        qs = qs.filter(agent__name__in=actor.agents) if actor.agents else qs
        return scoped(qs, actor)
    if not may(actor.roles, "view"):
        raise Forbidden("no role grants viewing runs")
    return scoped(qs, actor)


def visible_run(actor: Actor, run_id: Any) -> Run | None:
    """The run, if the actor may see it; None for a run that does not exist or is not theirs."""
    return visible_runs(actor).filter(pk=run_id).first()


def get_visible_run(actor: Actor, run_id: Any) -> Run:
    run = visible_run(actor, run_id)
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
                "required_role": a.required_role,
                "progress": approval_progress(a) if a.steps else None,
            }
            for a in run.approvals.all()
        ],
        "unresolved_effects": unresolved_count(run),
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


def descendants(run: Run) -> list[Run]:
    """The delegation tree below ``run``, breadth first (parents before their children), in the
    order runs were created: the order a tree cascade lists and reaches them in."""
    out, frontier = [], [run.pk]
    while frontier:
        children = list(
            Run.objects.filter(parent_id__in=frontier)
            .select_related("agent")
            .order_by("created_at", "pk")
        )
        out.extend(children)
        frontier = [c.pk for c in children]
    return out


def ledger(run: Run, status: str = "") -> list[dict]:
    effects = run.effects.filter(status=status) if status else run.effects.all()
    return [effect_dict(e) for e in effects.order_by("declared_at")]


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


def verify_history(run: Run) -> dict[str, Any]:
    """Walk a run's history chain against its head; name the first broken link (runs.integrity)."""
    return walk_history(
        HistoryEvent.objects.filter(run=run).order_by("seq"), run.history_seq, run.history_head
    )


def latest_checkpoint(run: Run) -> Checkpoint | None:
    return Checkpoint.objects.filter(run=run).order_by("-seq").first()


def starting_checkpoint(run: Run) -> Checkpoint | None:
    """The checkpoint the next attempt starts from: the named one if set, else the latest."""
    return run.resume_checkpoint or latest_checkpoint(run)


def checkpoint_summary(cp: Checkpoint | None) -> dict[str, Any] | None:
    if cp is None:
        return None
    return {
        "id": cp.id,
        "seq": cp.seq,
        "step": cp.step,
        "state": cp.state,
        "hash": cp.hash,
        "created_at": cp.created_at.isoformat(),
    }


def authority_envelope(
    run: Run, grants: list[AuthorityGrant] | None = None
) -> list[dict[str, Any]]:
    """The run's grants as previews, receipts and snapshots show them; ``grants``: already in hand
    (a run being created), else read in grant order."""
    now = timezone.now()
    if grants is None:
        grants = list(AuthorityGrant.objects.filter(run=run).order_by("granted_at"))
    return [
        {
            "id": str(g.id),
            "scope": g.scope,
            "status": g.effective_status(now),
            "expires_at": g.expires_at.isoformat(),
        }
        for g in grants
    ]


def unresolved_effects(run: Run) -> list[dict[str, Any]]:
    """The run's unresolved effects (``Effect.objects.unresolved()``), as previews, receipts, audit
    context and guards name them."""
    rows = Effect.objects.filter(run=run).unresolved()
    return [
        {
            "id": str(e.id),
            "step": e.step,
            "tool": e.tool,
            "action": e.action,
            "idempotency_key": e.idempotency_key,
            "status": e.status,
        }
        for e in rows.order_by("declared_at")
    ]


def run_snapshot(run: Run, new_grants: list[AuthorityGrant] | None = None) -> dict[str, Any]:
    """What was known at a decision: recorded in audit context for run-control events.
    ``new_grants``: the run is being created with these grants (nothing else to read yet: no
    checkpoint, no effects, no people)."""
    if new_grants is not None:
        return {
            "state": run.state,
            "attempt": None,
            "fencing_token": run.fencing_token,
            "checkpoint": None,
            "authority": authority_envelope(run, new_grants),
            "unresolved_effects": [],
            "assignee": None,
            "decision_authority": None,
        }
    cp = starting_checkpoint(run)
    return {
        "state": run.state,
        "attempt": {"id": str(run.current_attempt_id), "number": run.attempt_count}
        if run.current_attempt_id
        else None,
        "fencing_token": run.fencing_token,
        "checkpoint": {"seq": cp.seq, "step": cp.step} if cp else None,
        "authority": authority_envelope(run),
        "unresolved_effects": unresolved_effects(run),
        "assignee": run.assignee.username if run.assignee else None,
        "decision_authority": run.decision_authority.username if run.decision_authority else None,
    }


def protocol_snapshot(run: Run) -> dict[str, Any]:
    """What a worker-protocol transition (claim, finish) decided on, from the locked run row alone:
    the audit context of the worker's own moves, without ``run_snapshot``'s five queries inside the
    write. The operator's moves keep the full snapshot (authority, unresolved effects, assignee)."""
    return {
        "state": run.state,
        "attempt": {"id": str(run.current_attempt_id), "number": run.attempt_count}
        if run.current_attempt_id
        else None,
        "fencing_token": run.fencing_token,
        "checkpoint_seq": run.checkpoint_seq,
        "history_seq": run.history_seq,
    }


def effect_dict(e: Effect) -> dict[str, Any]:
    return {
        "id": str(e.id),
        "run_id": str(e.run_id),
        "attempt_id": str(e.attempt_id) if e.attempt_id else None,
        "kind": e.kind,
        "step": e.step,
        "tool": e.tool,
        "action": e.action,
        "idempotency_key": e.idempotency_key,
        "fingerprint": e.fingerprint,
        "args": e.args,
        "decision": e.decision,
        "reason": e.denial_reason or None,
        "status": e.status,
        "compensation": e.compensation,
        "irreversible": e.irreversible,
        "compensation_status": e.compensation_status or None,
        "external_ref": e.external_ref,
        "outcome_detail": e.outcome_detail,
        "declared_at": e.declared_at.isoformat(),
        "outcome_at": e.outcome_at.isoformat() if e.outcome_at else None,
        "late": e.late,
        "stale_lease": e.stale_lease,
        "reconciled": e.reconciled,
        "reconciliation": e.reconciliation,
        "discrepancy": e.discrepancy,
        "compensates": str(e.compensates_id) if e.compensates_id else None,
    }


def agent_with_policies(name: str) -> Agent | None:
    """An agent and its approval policies (prefetched), or None."""
    return Agent.objects.prefetch_related("approval_policies").filter(name=name).first()


def agent_names(actor: Actor | None = None) -> QuerySet:
    """Registered agents' names (of the actor's teams), for the run list's agent filter."""
    qs = Agent.objects.order_by("name")
    return (scoped(qs, actor) if actor is not None else qs).values_list("name", flat=True)


def active_usernames(actor: Actor | None = None) -> QuerySet:
    """Active people's usernames, for the run list's owner filter (of ``actor``'s teams)."""
    users = get_user_model().objects.filter(is_active=True)
    if actor is not None and actor.team_scoped:
        assert actor.teams is not None
        users = users.filter(
            Q(team_memberships__team_id__in=[t for t in actor.teams if t])
            | (Q(team_memberships__isnull=True) if 0 in actor.teams else Q(pk__in=[]))
        ).distinct()
    return users.order_by("username").values_list("username", flat=True)


def effect_with_run(effect_id: Any) -> Effect | None:
    """One effect with its run (the reconcile dialog), or None."""
    return Effect.objects.filter(pk=effect_id).select_related("run").first()


def effects_newest(run: Run, cursor: tuple[Any, Any] | None, limit: int) -> list[Effect]:
    """The run's newest ``limit`` effects, or those before ``cursor`` (declared_at, pk)."""
    qs = Effect.objects.filter(run=run)
    if cursor is not None:
        at, pk = cursor
        qs = qs.filter(Q(declared_at__lt=at) | Q(declared_at=at, pk__lt=pk))
    return list(qs.order_by("-declared_at", "-pk")[:limit])


def unresolved_count(run: Run) -> int:
    return Effect.objects.filter(run=run).unresolved().count()


def effects_by_ids(run: Run, ids: list[Any]) -> list[Effect]:
    return list(Effect.objects.filter(run=run, pk__in=ids))


def discrepancies(run: Run) -> list[Effect]:
    """The run's effects whose reported outcome contradicts the record, oldest first."""
    return list(Effect.objects.filter(run=run, status=Effect.DISCREPANCY).order_by("declared_at"))


def effect_count(run: Run) -> int:
    return Effect.objects.filter(run=run).count()


def run_grants(run: Run) -> list[AuthorityGrant]:
    return list(AuthorityGrant.objects.filter(run=run).order_by("granted_at"))


def recent_checkpoints(run: Run, limit: int) -> list[Checkpoint]:
    return list(run.checkpoints.order_by("-seq")[:limit])


def pending_approvals(run: Run) -> QuerySet[Approval]:
    """The run's pending approvals, oldest first."""
    return run.approvals.filter(status=Approval.PENDING).order_by("requested_at")


def pending_approval(run: Run, approval_id: Any) -> Approval | None:
    """One of the run's pending approvals, or None when it is not pending (or not the run's)."""
    return pending_approvals(run).filter(pk=approval_id).first()


def grants_in(run: Run, status: str | None = None) -> QuerySet[AuthorityGrant]:
    """The run's grants in grant order (``status``: only those with that stored status)."""
    grants = run.grants.order_by("granted_at")
    return grants if status is None else grants.filter(status=status)


def checkpoint_choices(run: Run) -> QuerySet:
    """The run's checkpoints as (seq, step), newest first: what a resume may name."""
    return run.checkpoints.order_by("-seq").values("seq", "step")


def people_with_roles(roles: Any) -> QuerySet:
    """Active people holding any of ``roles`` (who a run can be handed to)."""
    return (
        get_user_model()
        .objects.filter(is_active=True, groups__name__in=roles)
        .distinct()
        .order_by("username")
    )


def run_with_people(run_id: Any) -> Run:
    """One run with its agent, assignee and decision authority loaded."""
    return Run.objects.select_related("agent", "assignee", "decision_authority").get(pk=run_id)


def approvals_to_decide(actor: Actor, required_roles: list[str]) -> QuerySet[Approval]:
    """Pending approvals of the runs ``actor`` sees that ``required_roles`` may decide, soonest
    deadline first (the approvals inbox)."""
    return (
        Approval.objects.filter(
            status=Approval.PENDING, required_role__in=required_roles, run__in=visible_runs(actor)
        )
        .select_related("run__agent")
        .order_by("deadline", "requested_at")
    )


def drain_after(run: Run, since: Any) -> dict[str, Any] | None:
    """The run's latest drain (runs/services/drain.py) recorded at or after ``since``, or None."""
    event = (
        HistoryEvent.objects.filter(run=run, kind="drained", created_at__gte=since)
        .order_by("-seq")
        .first()
    )
    return None if event is None else {**(event.data or {}), "at": event.created_at.isoformat()}


def role_holders() -> dict[str, list[str]]:
    """Who holds each role now: active people by group, superusers counted as admins (core.roles)."""
    out: dict[str, list[str]] = {}
    people = get_user_model().objects.filter(is_active=True)
    for username, role in people.filter(groups__name__isnull=False).values_list(
        "username", "groups__name"
    ):
        out.setdefault(role, []).append(username)
    for username in people.filter(is_superuser=True).values_list("username", flat=True):
        if username not in out.setdefault("admin", []):
            out["admin"].append(username)
    return {role: sorted(names) for role, names in out.items()}


def approval_progress(approval: Approval, decisions: Any = None) -> dict[str, Any]:
    """Who has approved, who is still needed, for which step: the API's and the console's view.
    ``decisions``: the approval's ApprovalDecision rows if the caller already read them.

    A team step (``team`` set, ``role`` empty) also names who may still decide it (``may_decide``:
    the team's members who may approve and see the run, less whoever asked, started the run or
    already decided); a role step has ``may_decide`` None (the inbox names a role's holders)."""
    if decisions is None:
        decisions = list(approval.decisions.select_related("decided_by")) if approval.steps else []
    steps = approval.steps or [{"stage": 0, "role": approval.required_role, "count": 1}]
    decided = {d.decided_by.username for d in decisions}
    rows = []
    for i, s in enumerate(steps):
        approved = [
            d.decided_by.username for d in decisions if d.step == i and d.decision == "approved"
        ]
        count, team = s.get("count", 1), s.get("team") or ""
        still_needed = max(0, count - len(approved))
        may_decide = None
        if team:
            may_decide = (
                _may_still_decide(approval, team, decided)
                if still_needed and approval.status == Approval.PENDING
                else []
            )
        rows.append(
            {
                "step": i,
                "stage": s["stage"],
                "role": s["role"],
                "team": team,
                "count": count,
                "condition": s.get("condition") or "",
                "approved_by": approved,
                "still_needed": still_needed,
                "open": approval.status == Approval.PENDING and s["stage"] == approval.stage,
                "deadline": s.get("deadline"),
                # "1 of 2 from team payments" / "1 of 2 approver"
                "summary": f"{len(approved)} of {count} "
                + (f"from team {team}" if team else s["role"]),
                "may_decide": may_decide,
            }
        )
    return {
        "ordered": len({s["stage"] for s in steps}) > 1,
        "stage": approval.stage,
        "steps": rows,
        "rejected_by": [d.decided_by.username for d in decisions if d.decision == "rejected"],
    }


def _may_still_decide(approval: Approval, team: str, decided: set[str]) -> list[str]:
    """Members of ``team`` who may decide this approval's team step now: not whoever asked or
    started the run (four eyes), not who already decided (a person counts once)."""
    run = approval.run
    asked = {approval.requested_by, run.created_by}
    return [
        name
        for name in team_deciders(team, run.team_id)
        if name not in decided and f"user:{name}" not in asked
    ]
