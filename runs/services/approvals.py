"""Approval policy: the agent's registration decides which declarations need a human, not the worker.

``required_policy`` is read inside the declaration's transaction (runs.services.effects): a
declaration that matches a policy is denied ``approval_required`` unless an approval for exactly that
action (its digest: run, attempt, tool, action, args) is approved, unconsumed and was decided under a
role at least as strong as the policy's. The approval is consumed by the effect it authorises.
"""

from __future__ import annotations

from typing import Any

from core.roles import approver_rank
from core.rows import select_row, select_rows
from runs.conditions import ConditionError, parse_condition
from runs.models import Approval, ApprovalPolicy, Run


def required_policy(agent_id: Any, tool: str, action: str, args: dict) -> ApprovalPolicy | None:
    """The strongest policy of the agent that this call matches, or None."""
    found = None
    for policy in select_rows(ApprovalPolicy, agent=agent_id, tool=tool):
        if policy.action not in (action, "*"):
            continue
        try:
            condition = parse_condition(policy.condition)
        except ConditionError:
            condition = (
                None  # stored before validation tightened: an unreadable rule always applies
            )
        if condition is not None and not condition.matches(args):
            continue
        if found is None or approver_rank(policy.approver_role) > approver_rank(
            found.approver_role
        ):
            found = policy
    return found


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
