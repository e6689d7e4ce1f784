"""Durable boundaries and facts a worker reports: checkpoints, history events, approvals, timers."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from audit.chain.hashing import canonical
from audit.services import record_audit
from core.actors import Actor
from core.errors import Invalid
from core.pg.rows import write_rows
from core.times import parse_worker_time, unreadable_note
from runs.models import Approval, Assumption, Checkpoint, HistoryEvent, Run, Timer
from runs.states import Event

from .approvals import approval_digest, plan_steps, required_policy
from .decisions import apply_transition, decision, lock_run, notify_run_changed
from .history import append_history, history_head, next_history
from .lifecycle import check_fencing

MAX_TIMER_S = 10 * 366 * 24 * 3600  # a timer further out than ten years is a bug, not a plan
MAX_AGE_S = 2**31 - 1  # Assumption.max_age_s is a PositiveIntegerField


log = logging.getLogger(__name__)


def _whole_seconds(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_AGE_S


WORKER_EVENT_KINDS = {
    "step_started",
    "step_completed",
    "assumption",
    "timer_set",
    "timer_cancelled",
    "message",
    "signal",
    "log",
}


def write_checkpoint(
    *, actor: Actor, run_id: Any, fencing_token: int, step: str, state: dict | None = None
) -> Checkpoint:
    with decision(actor, "run.checkpoint", "run", run_id, run_id):
        run = lock_run(run_id)
        check_fencing(run, fencing_token)
        cp, event = new_checkpoint(run, actor, step, state)
        # The checkpoint, its history link and the run's new head: one statement.
        write_rows([cp, event], [(Run, run.pk, checkpoint_head(run, event))])
    return cp


def new_checkpoint(
    run: Run, actor: Actor, step: str, state: dict | None
) -> tuple[Checkpoint, HistoryEvent]:
    """The run's next checkpoint and its history link, not yet written (the caller writes both with
    ``checkpoint_head(run, event)`` in the run's UPDATE). Caller holds the run lock and has checked
    the fencing token."""
    seq = run.checkpoint_seq + 1
    snapshot = state or {}
    digest = hashlib.sha256(
        canonical(
            {
                "run": str(run.pk),
                "seq": seq,
                "step": step,
                "state": snapshot,
                "versions": run.versions,
            }
        )
    ).hexdigest()
    cp = Checkpoint(
        run=run,
        attempt_id=run.current_attempt_id,
        seq=seq,
        step=step,
        state=snapshot,
        versions=run.versions,
        history_seq=run.history_seq + 1,
        hash=digest,
    )
    run.checkpoint_seq = seq
    event = next_history(
        run,
        "checkpoint",
        {"seq": seq, "step": step, "hash": digest},
        attempt=run.current_attempt_id,
        actor=actor,
    )
    return cp, event


def checkpoint_head(run: Run, event: HistoryEvent) -> dict[str, Any]:
    return {**history_head(run, event), "checkpoint_seq": run.checkpoint_seq}


def append_events(
    *, actor: Actor, run_id: Any, fencing_token: int, events: list[dict]
) -> list[int]:
    """Worker-reported history: steps, assumptions, timers, messages. All or nothing."""
    for i, ev in enumerate(events):
        if ev.get("kind") not in WORKER_EVENT_KINDS:
            raise Invalid(
                f"events[{i}].kind must be one of {sorted(WORKER_EVENT_KINDS)}",
                field=f"events[{i}].kind",
            )
        if not isinstance(ev.get("data", {}), dict):
            raise Invalid(f"events[{i}].data must be an object", field=f"events[{i}].data")
    seqs = []
    with decision(actor, "run.events", "run", run_id, run_id):
        run = lock_run(run_id)
        check_fencing(run, fencing_token)
        for i, ev in enumerate(events):
            data = ev.get("data") or {}
            _materialise(run, ev["kind"], data, i)
            seqs.append(
                append_history(
                    run, ev["kind"], data, attempt=run.current_attempt_id, actor=actor
                ).seq
            )
    return seqs


def _materialise(run: Run, kind: str, data: dict, i: int) -> None:
    if kind == "assumption":
        if not data.get("key"):
            raise Invalid(
                f"events[{i}].data.key is required for an assumption", field=f"events[{i}].data.key"
            )
        observed = (
            parse_worker_time(data["observed_at"], f"events[{i}].data.observed_at")
            if data.get("observed_at")
            else timezone.now()
        )
        max_age = data.get("max_age_s")
        if max_age is not None and not _whole_seconds(max_age):
            raise Invalid(
                f"events[{i}].data.max_age_s must be a whole number of seconds",
                field=f"events[{i}].data.max_age_s",
            )
        Assumption.objects.create(
            run=run,
            key=str(data["key"])[:200],
            value=data.get("value"),
            step=str(data.get("step", ""))[:100],
            observed_at=observed,
            max_age_s=max_age,
            checker=str(data.get("checker") or "")[:100],
            meta=data.get("meta") or {},
        )
    elif kind == "timer_set":
        if not data.get("name"):
            raise Invalid(
                f"events[{i}].data.name is required for a timer", field=f"events[{i}].data.name"
            )
        if data.get("fire_at"):
            fire_at = parse_worker_time(data["fire_at"], f"events[{i}].data.fire_at")
        elif isinstance(data.get("in_s"), (int, float)) and not isinstance(data["in_s"], bool):
            if (
                not 0 <= data["in_s"] <= MAX_TIMER_S
            ):  # timedelta overflows long before a bad value is caught
                raise Invalid(
                    f"events[{i}].data.in_s must be between 0 and {MAX_TIMER_S}",
                    field=f"events[{i}].data.in_s",
                )
            fire_at = timezone.now() + timedelta(seconds=data["in_s"])
        else:
            raise Invalid(
                f"events[{i}].data needs fire_at or in_s", field=f"events[{i}].data.fire_at"
            )
        Timer.objects.create(run=run, name=str(data["name"])[:100], fire_at=fire_at)
    elif kind == "timer_cancelled":
        Timer.objects.filter(run=run, name=data.get("name", ""), status=Timer.PENDING).update(
            status=Timer.CANCELLED
        )


# Follow-up work on a new approval request, registered by the apps above (notifications adds its
# outbox job row): called inside the request's transaction, so it commits with the approval or not at
# all, and never does network I/O.
APPROVAL_REQUESTED: list[Callable[[Approval], None]] = []


def request_approval(
    *,
    actor: Actor,
    run_id: Any,
    fencing_token: int,
    tool: str,
    action: str,
    args: dict | None = None,
    reason: str = "",
    deadline_s: int | None = None,
    required_role: str = "approver",
) -> Approval:
    """The worker asks for a decision on one exact action. If the agent's policy requires approval of
    that action, the policy's approver role wins over ``required_role``. A second request while one is
    open is refused by the state table (awaiting_approval has no request_approval edge), and a run
    that moves on supersedes its open requests: one open request per decision."""
    args = args or {}
    with decision(actor, "approval.request", "run", run_id, run_id):
        run = lock_run(run_id)
        lease = check_fencing(run, fencing_token)
        digest = approval_digest(
            run_id=run.pk, attempt_id=lease.attempt_id, tool=tool, action=action, args=args
        )
        policy = required_policy(run.agent_id, tool, action, args)
        now = timezone.now()
        overall = now + timedelta(seconds=deadline_s) if deadline_s else None
        steps, due = plan_steps(policy, args, now, overall)
        approval = Approval.objects.create(
            run=run,
            attempt_id=lease.attempt_id,  # the fenced lease's attempt: the current one
            requested_by=actor.label,
            tool=tool,
            action=action,
            args=args,
            digest=digest,
            reason=reason,
            required_role=policy.approver_role if policy else required_role,
            policy=policy,
            requested_at=now,
            deadline=due,
            overall_deadline=overall,
            steps=steps,
        )
        append_history(
            run,
            "approval_requested",
            {
                "approval": str(approval.pk),
                "tool": tool,
                "action": action,
                "digest": approval.digest,
                "required_role": approval.required_role,
                "policy": policy.spec if policy else None,
                "worker_asked_role": required_role,
                "steps": steps,
            },
            attempt=run.current_attempt_id,
            actor=actor,
        )
        apply_transition(
            run,
            Event.REQUEST_APPROVAL,
            actor=actor,
            reason=reason or f"approval for {tool}:{action}",
            data={"approval": str(approval.pk)},
        )
        for hook in APPROVAL_REQUESTED:
            hook(approval)
    return approval


def fire_due_timers(*, actor: Actor, now=None) -> int:
    """Timers keep running whatever the run's state: a timer due during a pause is recorded as fired
    now and delivered to the worker on its next heartbeat while running."""
    now = now or timezone.now()
    fired = 0
    for timer_id, run_id in Timer.objects.filter(
        status=Timer.PENDING, fire_at__lte=now
    ).values_list("pk", "run_id"):
        try:
            fired += _fire_timer(actor, timer_id, run_id, now)
        except Exception:  # one run's bad row never holds back the other runs' timers
            log.exception("timer %s of run %s could not fire; the others go on", timer_id, run_id)
    return fired


def _fire_timer(actor: Actor, timer_id: Any, run_id: Any, now) -> int:
    with transaction.atomic(durable=True):
        run = lock_run(run_id)
        timer = Timer.objects.select_for_update().filter(pk=timer_id, status=Timer.PENDING).first()
        if timer is None:
            return 0
        timer.status, timer.fired_at, timer.fired_while = Timer.FIRED, now, run.state
        timer.save(update_fields=["status", "fired_at", "fired_while"])
        facts = {"name": timer.name, "fire_at": timer.fire_at, "run_state": run.state}
        if note := unreadable_note(timer.fire_at):  # say so; never the window's edge as fact
            facts |= {"fire_at": None, "fire_at_unreadable": note["unreadable"]}
        append_history(run, "timer_fired", facts, actor=actor)
        record_audit(
            actor=actor,
            action="timer.fire",
            object_type="timer",
            object_id=timer.pk,
            run_id=run.pk,
            context={"name": timer.name, "run_state": run.state},
        )
        notify_run_changed(run)
    return 1
