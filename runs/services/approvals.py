"""Approval policy: the agent's registration decides which declarations need a human, not the worker.

``required_policy`` is read inside the declaration's transaction (runs.services.effects): a
declaration that matches a policy is denied ``approval_required`` unless an approval for exactly that
action (its digest: run, attempt, tool, action, args) is approved, unconsumed and was decided under a
role at least as strong as the policy's. The approval is consumed by the effect it authorises.
"""

from __future__ import annotations

import hashlib
from datetime import timedelta
from typing import Any

from django.utils import timezone

from audit.chain.hashing import canonical
from core.pg.rows import select_row, select_rows
from core.roles import approver_rank
from runs.conditions import ConditionError, as_number, parse_condition
from runs.models import Approval, ApprovalPolicy, Effect, Run

_UNREAD: Any = object()  # "not read by the caller yet": look it up here


def required_policy(
    agent_id: Any,
    tool: str,
    action: str,
    args: dict,
    policies: Any = _UNREAD,
    run_id: Any = None,
) -> ApprovalPolicy | None:
    """The strongest policy of the agent that this call matches, or None. ``policies``: the agent's
    policies for ``tool`` if the caller already read them. ``run_id``: whose earlier calls a windowed
    sum (``sum(amount)>200 per 1h``) adds up; without it such a policy always applies."""
    found = None
    if policies is _UNREAD:
        policies = select_rows(ApprovalPolicy, agent=agent_id, tool=tool)
    for policy in policies:
        if policy.action not in (action, "*"):
            continue
        try:
            condition = parse_condition(policy.condition)
        except ConditionError:
            condition = (
                None  # stored before validation tightened: an unreadable rule always applies
            )
        if condition is not None and condition.window_s is not None:
            if run_id is not None and not condition.matches(
                args, window_sum(run_id, tool, action, condition.field, condition.window_s)
            ):
                continue
        elif condition is not None and not condition.matches(args):
            continue
        if found is None or approver_rank(policy.approver_role) > approver_rank(
            found.approver_role
        ):
            found = policy
    return found


def window_sum(run_id: Any, tool: str, action: str, field: str, window_s: int) -> float:
    """What the run's authorised tool:action calls declared in the last ``window_s`` add up to in
    ``field`` (numbers and numeric strings; anything else counts 0). Read under the run's row lock
    (the declaration holds it), so two declarations cannot both fit under the bound."""
    since = timezone.now() - timedelta(seconds=window_s)
    total = 0.0
    for args in Effect.objects.filter(
        run_id=run_id,
        tool=tool,
        action=action,
        kind=Effect.ACTION,
        decision=Effect.AUTHORIZED,
        declared_at__gte=since,
    ).values_list("args", flat=True):
        value = args
        for part in field.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        number = as_number(value)
        total += number if number is not None and number > 0 else 0.0
    return total


def policy_denial(
    run: Run, policy: ApprovalPolicy, approval_id: Any, digest: str
) -> tuple[str | None, Approval | None]:
    """(None, approval to consume) if a fitting approval exists, else (denial reason, None)."""
    if approval_id:
        approval = select_row(Approval, pk=approval_id, run=run.pk)
    else:  # an SDK that does not cite the approval still finds it by the action's digest
        approval = (
            Approval.objects.filter(
                run=run, digest=digest, status=Approval.APPROVED, consumed_by__isnull=True
            )
            .order_by("-requested_at")
            .first()
        )
    if approval is None or approval.status != Approval.APPROVED:
        return "approval_required", None
    if approval.consumed_by_id:
        return "approval_already_used", None
    if approval.digest != digest:
        return "approval_mismatch", None
    if approver_rank(approval.required_role) < approver_rank(policy.approver_role):
        return "approval_role_insufficient", None
    return None, approval


def approval_digest(
    *, run_id: Any, attempt_id: Any, tool: str, action: str, args: dict[str, Any]
) -> str:
    return hashlib.sha256(
        canonical(
            {
                "run": str(run_id),
                "attempt": str(attempt_id),
                "tool": tool,
                "action": action,
                "args": args,
            }
        )
    ).hexdigest()


def approval_denial(
    run: Run,
    approval_id: Any,
    tool: str,
    action: str,
    args: dict,
    *,
    policies: Any = _UNREAD,
    latest: Any = _UNREAD,
) -> tuple[str | None, Approval | None, str]:
    """(denial reason or None, the approval to consume, detail). The agent's policy decides first;
    without one, an approval the worker asked for still binds the action it named. ``policies`` (the
    agent's for ``tool``) and ``latest`` (the run's latest approval for tool:action, or None): the
    declaration's hot path reads them in one statement with its other facts."""
    digest = approval_digest(
        run_id=run.pk, attempt_id=run.current_attempt_id, tool=tool, action=action, args=args
    )
    policy = required_policy(run.agent_id, tool, action, args, policies, run_id=run.pk)
    if policy is not None:
        reason, approval = policy_denial(run, policy, approval_id, digest)
        detail = f"policy '{policy.spec}' requires an approval by {policy.approver_role}"
        return reason, approval, detail if reason else ""
    if approval_id:
        approval = Approval.objects.filter(pk=approval_id, run=run).first()
        if approval is None or approval.status != Approval.APPROVED:
            return "approval_not_granted", None, ""
        if approval.consumed_by_id:
            return "approval_already_used", None, ""
        if digest != approval.digest:
            return "approval_mismatch", None, ""
        return None, approval, ""
    # An action that asked for approval may not slip through without citing it -- and one that was
    # rejected or timed out may not either, unless a newer request was approved and cited.
    if latest is _UNREAD:
        latest = select_row(
            Approval, run=run.pk, tool=tool, action=action, order_by=("-requested_at",)
        )
    if latest is not None and latest.consumed_by_id is None:
        if latest.status in (Approval.PENDING, Approval.APPROVED):
            return "approval_required", None, ""
        if latest.status != Approval.SUPERSEDED:
            return f"approval_{latest.status}", None, ""
    return None, None, ""


# --- multi-party approvals: the steps an approval must pass, and how far it has come ---------------


def plan_steps(
    policy: ApprovalPolicy | None, args: dict, now: Any, deadline: Any
) -> tuple[list[dict[str, Any]], Any]:
    """(the approval's steps, its deadline) for a new request. Only the policy's steps whose
    condition matches the args count (fail closed, like the policy's own condition); stage 0 opens
    now, its steps' ``within`` deadlines start now. The approval's deadline is the sooner of the
    worker's and the open stage's, so the existing deadline scan times a late step out."""
    if policy is None or not policy.steps:
        return [], deadline
    steps = []
    for raw in policy.steps:
        condition = parse_condition(raw.get("condition") or "")
        if condition is not None and not condition.matches(args):
            continue
        steps.append({**raw, "opened_at": None, "deadline": None})
    stages = sorted({s["stage"] for s in steps})  # renumber: a skipped stage leaves no gap
    for s in steps:
        s["stage"] = stages.index(s["stage"])
    return steps, open_stage(steps, 0, now, deadline)


def open_stage(steps: list[dict[str, Any]], stage: int, now: Any, deadline: Any) -> Any:
    """Mark ``stage``'s steps opened at ``now``; return the approval's deadline while it is open."""
    soonest = deadline
    for s in steps:
        if s["stage"] != stage:
            continue
        s["opened_at"] = now.isoformat()
        if s.get("within_s"):
            due = now + timedelta(seconds=s["within_s"])
            s["deadline"] = due.isoformat()
            soonest = due if soonest is None or due < soonest else soonest
    return soonest
