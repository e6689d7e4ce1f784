"""Worker-protocol facts about a run's life: start, claim, heartbeat, release, finish, lease expiry."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from audit.chain.append import appending
from audit.services import audit_event
from core.actors import Actor
from core.errors import (
    AuthorityNotAllowed,
    EffectsUnresolved,
    Forbidden,
    Invalid,
    LeaseHeld,
    LeaseLost,
    NotClaimable,
    NotFound,
)
from core.live import announce
from core.pg.rows import select_row, select_rows, write_rows
from core.telemetry import annotate
from core.times import iso, unreadable_note
from runs.models import (
    Agent,
    Approval,
    Attempt,
    AuthorityGrant,
    Checkpoint,
    ExecutionLease,
    HistoryEvent,
    Run,
    Timer,
)
from runs.selectors import checkpoint_summary, protocol_snapshot, run_snapshot
from runs.states import APPROVAL_LIVE_STATES, LEASED_STATES, Event, State, directive_for

from .decisions import (
    apply_transition,
    decision,
    drained_if,
    lock_run,
    notifying,
    supersede_pending_approvals,
    transition_rows,
)
from .delegation import check_tree_bounds, delegable_grant
from .facts import claim_facts, finish_facts
from .history import append_history, next_history
from .intake import held_message

DEFAULT_GRANT_TTL_S = 3600


def _scope_allowed(scope: str, allowed: list[str]) -> bool:
    tool = scope.split(":", 1)[0]
    return scope in allowed or f"{tool}:*" in allowed


def create_run(
    *,
    actor: Actor,
    agent: str,
    goal: str,
    input: dict | None = None,
    parent_run_id: Any = None,
    versions: dict | None = None,
    authority: list[dict] | None = None,
    deadline=None,
    retry_policy: dict | None = None,
) -> Run:
    with decision(actor, "run.create", "agent", agent):
        agent_row = Agent.objects.filter(name=agent).first()
        if agent_row is None or not actor.sees_team(agent_row.team_id):
            # Another team's agent is answered as one never registered (docs/operator/teams.md).
            raise Invalid(f"agent {agent!r} is not registered", field="agent")
        if actor.is_worker and not actor.may_act_for(agent):
            raise Forbidden(f"this worker token may not act for agent {agent!r}")
        parent = lock_run(parent_run_id) if parent_run_id else None
        if parent is not None and not actor.sees_team(parent.team_id):
            raise NotFound(f"run {parent_run_id} does not exist", object="run")
        if parent is not None and actor.is_worker and not actor.may_act_for(parent.agent.name):
            # A child inherits (delegated) authority and the parent's tree: attaching one is acting
            # on the parent run, so the token must be allowed to act for the parent's agent too.
            raise Forbidden(
                f"this worker token may not act for the parent run's agent {parent.agent.name!r}",
                parent_run_id=str(parent.pk),
            )
        if parent is not None:
            check_tree_bounds(parent)
        now = timezone.now()
        run = Run(
            agent=agent_row,
            goal=goal,
            input=input or {},
            parent=parent,
            root=(parent.root or parent) if parent else None,
            versions=versions or {},
            deadline=deadline,
            retry_policy=retry_policy or {},
            # A run belongs to its agent's team; a child to its parent's (one tree, one team).
            team_id=parent.team_id if parent is not None else agent_row.team_id,
            created_by=actor.label,
            created_at=now,
            updated_at=now,
        )
        annotate(run_id=run.pk)
        grants = [
            _grant(run, agent_row, parent, request, actor, now) for request in authority or []
        ]
        created = next_history(
            run,
            "run_created",
            {"goal": goal, "parent": str(parent.pk) if parent else None, "versions": run.versions},
            actor=actor,
        )
        run.updated_at = created.created_at  # the head the run row is inserted with
        audit = audit_event(
            actor=actor,
            action="run.create",
            object_type="run",
            object_id=run.pk,
            run_id=run.pk,
            context={
                "agent": agent,
                "parent": str(parent.pk) if parent else None,
                "after": run_snapshot(run, new_grants=grants),
                # Not yet in the table for the audit to look its team up (audit.services).
                **({"cross_team": True} if not actor.in_team(run.team_id) else {}),
            },
        )
        # The run, its grants, its first history link, the audit event and the NOTIFYs: one statement.
        write_rows([run, *grants, created], [], [appending(audit), notifying(run)])
        run.new_grants = grants  # what runs.selectors.run_detail needs not read back
        if parent is not None:  # the parent's open page redraws its tree and follows the child
            announce(parent.pk, "child_created", run.pk)
    return run


def _grant(
    run: Run, agent: Agent, parent: Run | None, request: dict, actor: Actor, now
) -> AuthorityGrant:
    scope = str(request.get("scope", ""))
    if ":" not in scope or scope.startswith(":") or scope.endswith(":"):
        raise Invalid(
            f"authority scope {scope!r} must look like 'tool:action' or 'tool:*'", field="authority"
        )
    if not _scope_allowed(scope, agent.allowed_scopes):
        raise AuthorityNotAllowed(f"agent {agent.name!r} may not hold {scope!r}", scope=scope)
    ttl = int(request.get("ttl_s") or DEFAULT_GRANT_TTL_S)
    expires = now + timedelta(seconds=ttl)
    source = None
    if parent is not None:
        # Delegation: never wider than the parent's live grant, never outliving it.
        source = delegable_grant(parent, scope, now)  # active, unfrozen, parent may act now
        expires = min(expires, source.expires_at)
    return AuthorityGrant(  # written by the caller, with the run
        run=run,
        scope=scope,
        issuer=actor.label,
        delegated_from=source,
        granted_at=now,
        expires_at=expires,
    )


@dataclass
class Claim:
    run: Run
    attempt: Attempt
    lease: ExecutionLease
    checkpoint: dict | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "run_id": str(self.run.pk),
            "state": self.run.state,
            "attempt": {"id": str(self.attempt.pk), "number": self.attempt.number},
            "lease": {
                "id": str(self.lease.pk),
                "fencing_token": self.lease.fencing_token,
                "expires_at": self.lease.expires_at.isoformat(),
                "ttl_s": self.lease.ttl_s,
            },
            "checkpoint": self.checkpoint,
            "directive": directive_for(self.run.state),
        }


def claim_run(*, actor: Actor, run_id: Any, worker: str, versions: dict | None = None) -> Claim:
    with decision(actor, "run.claim", "run", run_id, run_id):
        run = lock_run(run_id)
        facts = claim_facts(run)
        if actor.is_worker and not actor.may_act_for(facts.agent):
            raise Forbidden(f"this worker token may not act for agent {facts.agent!r}")
        now = timezone.now()
        live = facts.live_lease
        if live is not None and live.expires_at > now:
            raise LeaseHeld(
                f"worker {live.worker!r} holds the lease until {live.expires_at.isoformat()}",
                state=run.state,
            )
        if run.state != State.QUEUED:
            raise NotClaimable(
                f"run is {run.state}; only queued runs can be claimed", state=run.state
            )
        if facts.hold is not None:  # accepted and queued, not started: interventions/intake.py
            raise NotClaimable(held_message(facts.hold), state=run.state, intake_hold=facts.hold[0])
        if run.claimable_after and run.claimable_after > now:
            raise NotClaimable(
                f"retry backoff: claimable after {run.claimable_after.isoformat()}", state=run.state
            )
        if run.execution_pin and (
            run.execution_pin != worker or (actor.is_worker and actor.name != run.execution_pin)
        ):
            # The pin names an authenticated worker: the token's own name, not the claim's "worker"
            # field, which any token could fill in with the pinned name.
            raise NotClaimable(
                f"execution was transferred to worker {run.execution_pin!r}: only its token may claim",
                state=run.state,
            )
        if (
            live is not None
        ):  # defensive: a stale active row must never block the partial unique index
            end_lease(live, ExecutionLease.EXPIRED, "superseded", now)
        run.fencing_token += 1
        run.attempt_count += 1
        cp = facts.checkpoint
        attempt = Attempt(
            run=run,
            number=run.attempt_count,
            worker=worker,
            worker_versions=versions or {},
            started_from=cp,
            started_at=now,
        )
        annotate(attempt_id=attempt.pk)
        ttl = lease_ttl()
        lease = ExecutionLease(
            run=run,
            attempt=attempt,
            worker=worker,
            fencing_token=run.fencing_token,
            ttl_s=ttl,
            granted_at=now,
            expires_at=now + timedelta(seconds=ttl),
        )
        run.current_attempt, run.resume_checkpoint = attempt, None
        started = next_history(
            run,
            "attempt_started",
            {
                "attempt": attempt.number,
                "worker": worker,
                "fencing_token": run.fencing_token,
                "checkpoint": cp.seq if cp else None,
            },
            attempt=attempt,
            actor=actor,
        )
        move = transition_rows(
            run,
            Event.CLAIM,
            actor=actor,
            reason=f"claimed by {worker}",
            data={"fencing_token": run.fencing_token},
            snapshot=protocol_snapshot,
        )
        updates: list[tuple[type[Any], Any, dict[str, Any]]] = [
            (
                Run,
                run.pk,
                move.run_updates
                | {
                    "fencing_token": run.fencing_token,
                    "attempt_count": run.attempt_count,
                    "current_attempt": attempt,
                    "resume_checkpoint": None,
                },
            )
        ]
        if versions:  # what this agent's workers run now: compared by resume and recovery
            updates.append((Agent, run.agent_id, {"current_versions": versions}))
        # The attempt, the lease, both history links, the run's row, the audit event, the NOTIFY:
        # one statement.
        write_rows([attempt, lease, started, move.history], updates, move.extras(run))
        _supersede(run, actor, Event.CLAIM, facts.pending_approvals)
    return Claim(run, attempt, lease, checkpoint_summary(cp))


def _supersede(run: Run, actor: Actor, event: Event, pending: list[Any]) -> None:
    """``apply_transition``'s last step, with the pending approvals already read."""
    if pending and run.state not in APPROVAL_LIVE_STATES:
        why = f"run {event.value}: now {run.state}"
        supersede_pending_approvals(run, actor=actor, why=why, pending=pending)


def _lease_by_token(run: Run, fencing_token: int) -> ExecutionLease | None:
    """``ExecutionLease.objects.filter(run=run, fencing_token=fencing_token).first()`` (at most one row:
    (run, fencing_token) is unique) through core.pg.rows: every worker write checks its fencing
    token here."""
    if fencing_token is None:  # the ORM would look for IS NULL; the column is NOT NULL, so: none
        return None
    return select_row(ExecutionLease, run=run.pk, fencing_token=int(fencing_token))


def _current_lease(run: Run, lease_id: Any, fencing_token: int, now) -> ExecutionLease:
    """The caller's lease, if it is still the run's current one; else LeaseLost (fencing)."""
    lease = (
        select_row(ExecutionLease, pk=lease_id, run=run.pk)
        if lease_id
        else _lease_by_token(run, fencing_token)
    )
    return judge_lease(run, lease, fencing_token, now)


def judge_lease(
    run: Run, lease: ExecutionLease | None, fencing_token: int | None, now
) -> ExecutionLease:
    """``lease`` (the run's lease with ``fencing_token``, read under the run lock) if it is still the
    run's current one; else LeaseLost (fencing)."""
    if lease is None:
        raise LeaseLost("no such lease for this run", state=run.state)
    if fencing_token != lease.fencing_token or lease.fencing_token != run.fencing_token:
        raise LeaseLost(
            f"fencing token {fencing_token} is stale; the run is at {run.fencing_token}",
            state=run.state,
        )
    if lease.status == ExecutionLease.EXPIRED or (
        lease.status == ExecutionLease.ACTIVE and lease.expires_at <= now
    ):
        raise LeaseLost("the lease expired", state=run.state)
    return lease


def check_fencing(run: Run, fencing_token: int, now=None) -> ExecutionLease:
    """For worker writes: the token must be the run's current one and its lease live."""
    now = now or timezone.now()
    return check_lease(run, _lease_by_token(run, fencing_token), fencing_token, now)


def check_lease(
    run: Run, lease: ExecutionLease | None, fencing_token: int | None, now
) -> ExecutionLease:
    """``check_fencing`` with the lease already read (under the run lock) by the caller."""
    lease = judge_lease(run, lease, fencing_token, now)
    if lease.status != ExecutionLease.ACTIVE:
        raise LeaseLost("the lease was released", state=run.state)
    return lease


@dataclass
class Beat:
    run: Run
    lease: ExecutionLease
    directive: str
    reason: str
    timers: list[dict]
    approval: dict | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "directive": self.directive,
            "reason": self.reason,
            "state": self.run.state,
            "expires_at": self.lease.expires_at.isoformat(),
            "lease_status": self.lease.status,
            "fencing_token": self.lease.fencing_token,
            "timers_fired": self.timers,
            "approval": self.approval,
        }


def lease_run_id(lease_id: Any) -> Any:
    """The run a lease belongs to (read before locking the run, which every lease decision does)."""
    try:
        return ExecutionLease.objects.values_list("run_id", flat=True).get(pk=lease_id)
    except (ExecutionLease.DoesNotExist, ValueError):
        raise NotFound(f"lease {lease_id} does not exist", object="lease") from None


def heartbeat(*, actor: Actor, lease_id: Any, fencing_token: int, run_id: Any = None) -> Beat:
    """``run_id``: the lease's run if the caller already looked it up with ``lease_run_id`` (the API
    edge does, for the token's scope check); a lease never moves to another run."""
    run_id = run_id if run_id is not None else lease_run_id(lease_id)
    with decision(actor, "lease.heartbeat", "lease", lease_id, run_id):
        run = lock_run(run_id)
        now = timezone.now()
        lease = _current_lease(run, lease_id, fencing_token, now)
        if lease.status == ExecutionLease.ACTIVE:
            lease.expires_at, lease.last_heartbeat_at = now + timedelta(seconds=lease.ttl_s), now
            lease.heartbeats += 1
            ExecutionLease.objects.filter(pk=lease.pk).update(
                expires_at=lease.expires_at, last_heartbeat_at=now, heartbeats=lease.heartbeats
            )
        timers = _deliver_timers(run, now) if run.state == State.RUNNING else []
        approval = _latest_approval(run)
        reason = _last_reason(run)
    return Beat(run, lease, directive_for(run.state), reason, timers, approval)


def _deliver_timers(run: Run, now) -> list[dict]:
    fired = select_rows(Timer, run=run.pk, status=Timer.FIRED)
    if fired:
        Timer.objects.filter(pk__in=[t.pk for t in fired]).update(
            status=Timer.DELIVERED, delivered_at=now
        )
        append_history(run, "timers_delivered", {"timers": [t.name for t in fired]})
    return [
        {
            "name": t.name,
            "fire_at": iso(t.fire_at),
            "fired_at": iso(t.fired_at),
            "fired_while": t.fired_while,
            **unreadable_note(t.fire_at),
        }
        for t in fired
    ]


def _latest_approval(run: Run) -> dict | None:
    approval = select_row(Approval, run=run.pk, order_by=("-requested_at",))
    if approval is None:
        return None
    return {
        "id": str(approval.pk),
        "status": approval.status,
        "tool": approval.tool,
        "action": approval.action,
        "digest": approval.digest,
        "decision_reason": approval.decision_reason,
    }


def _last_reason(run: Run) -> str:
    last = select_row(HistoryEvent, run=run.pk, kind="state_changed", order_by=("-seq",))
    return (last.data or {}).get("reason", "") if last else ""


def release_lease(*, actor: Actor, lease_id: Any, fencing_token: int, reason: str = "") -> Run:
    """The worker acknowledges a pause or cancel at a step boundary and lets go of the lease."""
    run_id = lease_run_id(lease_id)
    with decision(actor, "lease.release", "lease", lease_id, run_id):
        run = lock_run(run_id)
        now = timezone.now()
        lease = _current_lease(run, lease_id, fencing_token, now)
        if lease.status == ExecutionLease.ACTIVE:
            end_lease(lease, ExecutionLease.RELEASED, reason or "released by worker", now)
            _end_attempt(run, Attempt.STOPPED, now)
        if run.state in (State.PAUSING, State.CANCELLING):
            apply_transition(
                run,
                Event.WORKER_STOPPED,
                actor=actor,
                reason=reason or "worker stopped at a boundary",
            )
    return run


def _end_attempt(run: Run, outcome: str, now, failure_class: str = "", error: str = "") -> None:
    if run.current_attempt_id:
        Attempt.objects.filter(pk=run.current_attempt_id, outcome=Attempt.RUNNING).update(
            outcome=outcome, ended_at=now, failure_class=failure_class, error=error
        )


def finish_attempt(
    *,
    actor: Actor,
    run_id: Any,
    fencing_token: int,
    outcome: str,
    failure_class: str = "",
    error: str = "",
) -> Run:
    if outcome not in ("succeeded", "failed"):
        raise Invalid("outcome must be 'succeeded' or 'failed'", field="outcome")
    with decision(actor, "run.finish", "run", run_id, run_id):
        run = lock_run(run_id)
        now = timezone.now()
        facts = finish_facts(run, fencing_token)
        lease = check_lease(run, facts.lease, fencing_token, now)
        event = Event.FINISH_SUCCEEDED if outcome == "succeeded" else Event.FINISH_FAILED
        if event == Event.FINISH_SUCCEEDED and run.state in (State.RUNNING, State.PAUSING):
            if facts.unresolved:
                raise EffectsUnresolved(
                    "cannot succeed with effects in flight or unknown",
                    effects=facts.unresolved,
                    state=run.state,
                )
        updates: list[tuple[type[Any], Any, dict[str, Any]]] = [
            (
                ExecutionLease,
                lease.pk,
                lease_end(lease, ExecutionLease.RELEASED, f"finished: {outcome}", now),
            )
        ]
        if facts.attempt_running:  # _end_attempt's compare-and-swap, decided under the run lock
            ended = Attempt.SUCCEEDED if outcome == "succeeded" else Attempt.FAILED
            values = {"outcome": ended, "ended_at": now, "failure_class": failure_class}
            updates.append((Attempt, run.current_attempt_id, values | {"error": error}))
        previous, asked_at = run.state, run.state_changed_at
        move = transition_rows(
            run,
            event,
            actor=actor,
            reason=error or f"attempt {outcome}",
            data={"failure_class": failure_class, "error": error},
            snapshot=protocol_snapshot,
        )
        updates.append((Run, run.pk, move.run_updates))
        # The lease's end, the attempt's, the run's row, its history link, the audit event, the
        # NOTIFY: one statement.
        write_rows([move.history], updates, move.extras(run))
        drained_if(run, previous, asked_at, event, actor)  # a cancelling run's worker finished
        _supersede(run, actor, event, facts.pending_approvals)
    return run


def expire_leases(*, actor: Actor, now=None) -> list[str]:
    """Leases past their expiry without release: the worker disappeared. One transaction per run."""
    now = now or timezone.now()
    touched = []
    for lease_id, run_id in ExecutionLease.objects.filter(
        status=ExecutionLease.ACTIVE, expires_at__lte=now
    ).values_list("pk", "run_id"):
        with transaction.atomic(durable=True):
            run = lock_run(run_id)
            lease = ExecutionLease.objects.filter(
                pk=lease_id, status=ExecutionLease.ACTIVE, expires_at__lte=now
            ).first()
            if lease is None:  # heartbeat won the race
                continue
            end_lease(lease, ExecutionLease.EXPIRED, "expired without release", now)
            _end_attempt(run, Attempt.ABANDONED, now, "worker_lost")
            if run.state in LEASED_STATES and lease.fencing_token == run.fencing_token:
                apply_transition(
                    run,
                    Event.LEASE_EXPIRED,
                    actor=actor,
                    reason=f"lease of {lease.worker} expired at {lease.expires_at.isoformat()}",
                    data={"lease": str(lease.pk), "worker": lease.worker},
                )
                touched.append(str(run.pk))
    return touched


def end_live_leases(run: Run, why: str, *, now=None) -> list[str]:
    """Inside the caller's transaction, run locked: an operator stopped waiting for the worker (a
    forced cancel). Its lease ends now instead of at expiry; its later writes are fenced out."""
    now = now or timezone.now()
    ended = []
    for lease in ExecutionLease.objects.filter(run=run, status=ExecutionLease.ACTIVE):
        end_lease(lease, ExecutionLease.EXPIRED, why, now)
        ended.append(str(lease.pk))
    if ended:
        _end_attempt(run, Attempt.STOPPED, now, "cancelled", why)
    return ended


def lease_ttl() -> int:
    return settings.LEASE_TTL_S


def end_lease(lease: ExecutionLease, status: str, why: str, now) -> None:
    """Release or expire an execution lease: the one writer of a lease's end (claim superseding a
    stale one, release, finish, expiry, a pause with nothing in flight); caller holds the run lock."""
    ExecutionLease.objects.filter(pk=lease.pk).update(**lease_end(lease, status, why, now))


def lease_end(lease: ExecutionLease, status: str, why: str, now) -> dict[str, Any]:
    """``end_lease`` in memory (and announced): the columns to write, for a caller that writes them
    with its other rows (``core.pg.rows.write_rows``)."""
    lease.status, lease.ended_at, lease.end_reason = status, now, why
    announce(lease.run_id, "lease", lease.pk)
    return {"status": status, "ended_at": now, "end_reason": why}


def set_resume_point(run: Run, checkpoint: Checkpoint | None, *, claimable_after) -> None:
    """Where the next attempt starts, and from when it may be claimed (retry backoff; None = now).
    The one writer of both (retry, resume and recovery call it; a claim consumes them); caller holds
    the run lock."""
    run.resume_checkpoint, run.claimable_after = checkpoint, claimable_after
    Run.objects.filter(pk=run.pk).update(
        resume_checkpoint=checkpoint, claimable_after=claimable_after
    )
