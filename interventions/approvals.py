"""Approve / reject: the planned human-in-the-loop boundary a worker asked for (distinct from an
emergency pause).

The approval is bound to the exact action by its digest (tool, action, args, run, attempt); the effect
declaration that follows must carry the same digest and may use it once (runs.services.effects).
Here: who may decide (the permission matrix, then the approval's own required role), separation of
duties (whoever requested the approval or started the run can never approve it), what the approver
was shown, and the run going back to ``running`` so the worker's next heartbeat carries the decision.

A deadline that passes without a decision ends the request ``timed_out`` -- never recorded as a
human rejection -- and escalates (``expire_approvals``, a beat job).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any, TypedDict

from celery import shared_task
from django.db import transaction
from django.utils import timezone

from audit.services import record_audit
from core.actors import Actor, system_actor
from core.errors import Conflict, Forbidden, Invalid, NotFound
from core.roles import ADMIN, APPROVER, INCIDENT_COMMANDER, SECURITY_RESPONDER
from interventions import cards
from interventions.base import user_for
from interventions.models import Intervention
from interventions.plugins import Answers, Console, Contract, Request, Row, Spec
from interventions.registry import redact
from runs.models import Approval, ApprovalDecision, Run
from runs.selectors import approval_progress
from runs.services.approvals import open_stage
from runs.services.decisions import apply_transition, lock_run
from runs.services.history import append_history
from runs.states import Event, transition
from runs.team_scope import team_slugs_of


class SeparationOfDuties(Forbidden):
    code = "separation_of_duties"


class RoleRequired(Forbidden):
    """Allowed to decide approvals, but not this one (or not its open step): another role is needed."""

    code = "approval_role_required"


class TeamRequired(Forbidden):
    """Allowed to decide approvals, but the open step names a team this person is not in."""

    code = "approval_team_required"


def _approval(run: Run, req: Request) -> Approval:
    approval_id = req.options.get("approval_id")
    if not approval_id:
        raise Invalid("options.approval_id is required", field="options.approval_id")
    try:
        approval_id = uuid.UUID(str(approval_id))
    except ValueError:
        raise Invalid("options.approval_id must be a UUID", field="options.approval_id") from None
    approval = Approval.objects.filter(pk=approval_id, run=run).first()
    if approval is None:
        raise NotFound(f"approval {approval_id} does not exist on this run", object="approval")
    return approval


def shown_to_approver(run: Run, approval: Approval) -> dict[str, Any]:
    """Exactly what the decision is about; stored on the approval as what the approver was shown."""
    return {
        "approval": str(approval.pk),
        "tool": approval.tool,
        "action": approval.action,
        "args": redact(approval.tool, approval.args),
        "digest": approval.digest,
        "run_goal": run.goal,
        "run": str(run.pk),
        "attempt": str(approval.attempt_id),
        "requested_by": approval.requested_by,
        "request_reason": approval.reason,
        "requested_at": approval.requested_at.isoformat(),
        "required_role": approval.required_role,
        "policy": approval.policy.spec if approval.policy else None,
        "deadline": approval.deadline.isoformat() if approval.deadline else None,
        "progress": approval_progress(approval) if approval.steps else None,
    }


class DecisionPreview(TypedDict):
    """What an approver is shown before approving or rejecting."""

    shown: Row
    approval_status: str
    binding: str
    delivery: str


class DecisionReceipt(TypedDict):
    state: str
    approval: Row
    shown: Row
    delivery: str
    binding: str


def preview(run: Run, req: Request, actor: Actor) -> DecisionPreview:
    approval = _approval(run, req)
    return {
        "shown": shown_to_approver(run, approval),
        "approval_status": approval.status,
        "binding": "the approval covers only this tool, action and these exact args in this attempt, once",
        "delivery": "the worker's next heartbeat carries the decision",
    }


# Who satisfies an approval's required role. An incident commander may decide an approver-level
# request: a timed-out approval escalates to them, so they must be able to act on it.
SATISFIES: dict[str, frozenset[str]] = {
    APPROVER: frozenset({APPROVER, INCIDENT_COMMANDER, ADMIN}),
    INCIDENT_COMMANDER: frozenset({INCIDENT_COMMANDER, ADMIN}),
    SECURITY_RESPONDER: frozenset({SECURITY_RESPONDER, ADMIN}),
    ADMIN: frozenset({ADMIN}),
}


class DigestChanged(Conflict):
    code = "approval_digest_changed"


def open_steps(approval: Approval, decisions: list[ApprovalDecision]) -> list[int]:
    """Indexes of the open stage's steps that still need someone."""
    filled = [0] * len(approval.steps)
    for d in decisions:
        if d.decision == ApprovalDecision.APPROVED:
            filled[d.step] += 1
    return [
        i
        for i, s in enumerate(approval.steps)
        if s["stage"] == approval.stage and filled[i] < s.get("count", 1)
    ]


def step_for(
    approval: Approval,
    decisions: list[ApprovalDecision],
    actor: Actor,
    teams: frozenset[str] = frozenset(),
) -> int | None:
    """The open step this person fills: one naming their own role or one of their ``teams`` first,
    else the first role step they satisfy (an admin fills an approver step only when no admin step
    is open). A team step is filled only by the team's members (who may approve at all: the
    contract's permission row let them this far), whatever their role."""

    def fits(step: dict[str, Any]) -> bool:
        if step.get("team"):
            return step["team"] in teams
        return bool(SATISFIES.get(step["role"], frozenset({ADMIN})) & actor.roles)

    fitting = [i for i in open_steps(approval, decisions) if fits(approval.steps[i])]
    exact = [
        i
        for i in fitting
        if approval.steps[i].get("team") or approval.steps[i]["role"] in actor.roles
    ]
    chosen = exact or fitting
    return chosen[0] if chosen else None


def _refuse_step(
    approval: Approval, decisions: list[ApprovalDecision], actor: Actor, teams: frozenset[str]
) -> Forbidden:
    """The person fits no open step: say which role or team the open stage needs."""
    needed = [approval.steps[i] for i in open_steps(approval, decisions)]
    roles = sorted({s["role"] for s in needed if not s.get("team")})
    named_teams = sorted({s["team"] for s in needed if s.get("team")})
    if named_teams and not roles:
        return TeamRequired(
            f"the open step needs a member of team {', '.join(named_teams)}; you are in "
            f"{', '.join(sorted(teams)) or 'no team'}",
            required_team=named_teams[0],
            your_teams=sorted(teams),
        )
    wants = [f"role {', '.join(roles)}"] if roles else []
    wants += [f"a member of team {', '.join(named_teams)}"] if named_teams else []
    return RoleRequired(
        f"the open step needs {' or '.join(wants)}; you hold {sorted(actor.roles)}",
        required_role=roles[0] if roles else approval.required_role,
        **({"required_team": named_teams[0]} if named_teams else {}),
    )


def _check_decider(run: Run, approval: Approval, actor: Actor) -> None:
    if approval.steps:
        _check_separation(run, approval, actor)  # the step's role is checked when it is chosen
        return
    if not SATISFIES.get(approval.required_role, frozenset({ADMIN})) & actor.roles:
        raise RoleRequired(
            f"this approval needs role {approval.required_role}; you hold {sorted(actor.roles)}",
            required_role=approval.required_role,
        )
    _check_separation(run, approval, actor)


def _check_separation(run: Run, approval: Approval, actor: Actor) -> None:
    # Four eyes: the identity that asked (or that started the run) never decides.
    if actor.label in (approval.requested_by, run.created_by):
        raise SeparationOfDuties(
            f"{actor.name} requested this approval or started the run and may not decide it",
            requested_by=approval.requested_by,
            run_created_by=run.created_by,
        )


def _decide(status: str, event: Event):
    def apply(run: Run, req: Request, actor: Actor, intervention: Intervention) -> DecisionReceipt:
        approval = _approval(run, req)
        if approval.status != Approval.PENDING:
            raise Conflict(
                f"approval is already {approval.status}",
                state=run.state,
                approval_status=approval.status,
            )
        _check_decider(run, approval, actor)
        now = timezone.now()
        shown = intervention.preview.get("shown") or shown_to_approver(run, approval)
        seen = req.options.get("digest") or shown.get("digest")
        if seen != approval.digest:  # decided on another action than the one asked about
            raise DigestChanged(
                "the approval's action digest is not the one you decided on: review it again",
                field="options.digest",
                digest=approval.digest,
            )
        if approval.steps:
            return _decide_step(run, approval, req, actor, status, event, shown, now)
        # Compare-and-swap on the status: the run lock already serialises deciders, the filter makes
        # the "still pending" precondition part of the write itself.
        updated = Approval.objects.filter(pk=approval.pk, status=Approval.PENDING).update(
            status=status,
            decided_by=user_for(actor),
            decided_at=now,
            decision_reason=req.reason,
            shown=shown,
        )
        if updated != 1:
            raise Conflict("approval was decided meanwhile", state=run.state)
        record = {
            "approval": str(approval.pk),
            "decision": status,
            "decided_by": actor.name,
            "role": actor.role,
            "decided_at": now.isoformat(),
            "decision_reason": req.reason,
            "digest": approval.digest,
        }
        append_history(run, "approval_decided", record, attempt=run.current_attempt_id, actor=actor)
        apply_transition(
            run,
            event,
            actor=actor,
            reason=req.reason,
            data={"approval": str(approval.pk), "decision": status},
        )
        return {
            "state": run.state,
            "approval": {**record, "tool": approval.tool, "action": approval.action},
            "shown": shown,
            "delivery": "the worker's next heartbeat carries the decision (directive continue, approval status "
            f"{status})",
            "binding": (
                "declare the effect with approval_id and exactly these args; any other args are denied "
                "(approval_mismatch), and the approval is single-use"
                if status == Approval.APPROVED
                else "the action was not approved"
            ),
        }

    return apply


def _decide_step(
    run: Run,
    approval: Approval,
    req: Request,
    actor: Actor,
    status: str,
    event: Event,
    shown: dict[str, Any],
    now: Any,
) -> DecisionReceipt:
    """One person's decision on a multi-party approval, inside the intervention's transaction (the
    run lock serialises deciders): counted in one open step, once per person; the approval ends
    approved when the last stage fills, rejected on any rejection; otherwise the next stage opens
    (its ``within`` deadlines start now) or it waits for more people."""
    approval = Approval.objects.select_for_update().get(pk=approval.pk)
    decisions = list(
        ApprovalDecision.objects.filter(approval=approval).select_related("decided_by")
    )
    if any(d.decided_by_label == actor.label for d in decisions):
        raise Conflict(
            f"{actor.name} already decided this approval; a person counts once",
            approval_status=approval.status,
        )
    # Team membership is read now, under the run lock: a person removed from the team a moment ago
    # no longer counts for it.
    teams = team_slugs_of(actor.user_id) if any(s.get("team") for s in approval.steps) else None
    step = step_for(approval, decisions, actor, teams or frozenset())
    if step is None:
        raise _refuse_step(approval, decisions, actor, teams or frozenset())
    team = approval.steps[step].get("team") or ""
    decided = ApprovalDecision.objects.create(
        approval=approval,
        step=step,
        decided_by=user_for(actor),
        decided_by_label=actor.label,
        # a team step names no role: the role the member decided with
        role=approval.steps[step]["role"] or actor.role,
        decision=status,
        digest=approval.digest,
        reason=req.reason,
        decided_at=now,
    )
    decisions.append(decided)
    outcome = Approval.PENDING
    if status == Approval.REJECTED:
        outcome = Approval.REJECTED
    elif not open_steps(approval, decisions):
        stages = {s["stage"] for s in approval.steps}
        if approval.stage + 1 in stages:
            approval.stage += 1
            # The next stage's own deadline; the worker's overall deadline still bounds it.
            approval.deadline = open_stage(
                approval.steps, approval.stage, now, approval.overall_deadline
            )
        else:
            outcome = Approval.APPROVED
    fields = ["steps", "stage", "deadline"]
    if outcome != Approval.PENDING:
        approval.status, approval.decided_by = outcome, user_for(actor)
        approval.decided_at, approval.decision_reason, approval.shown = now, req.reason, shown
        fields += ["status", "decided_by", "decided_at", "decision_reason", "shown"]
    approval.save(update_fields=fields)
    progress = approval_progress(approval, decisions)
    record = {
        "approval": str(approval.pk),
        "decision": status,
        "decided_by": actor.name,
        "role": actor.role,
        "step": step,
        "step_role": approval.steps[step]["role"],
        **({"step_team": team} if team else {}),
        "decided_at": now.isoformat(),
        "decision_reason": req.reason,
        "digest": approval.digest,
        "approval_status": outcome,
        "progress": progress,
    }
    append_history(run, "approval_decided", record, attempt=run.current_attempt_id, actor=actor)
    if outcome != Approval.PENDING:
        apply_transition(
            run,
            event,
            actor=actor,
            reason=req.reason,
            data={"approval": str(approval.pk), "decision": outcome},
        )
    waiting = ", ".join(
        f"{r['still_needed']} " + (f"from team {r['team']}" if r["team"] else r["role"])
        for r in progress["steps"]
        if r["open"] and r["still_needed"]
    )
    return {
        "state": run.state,
        "approval": {**record, "tool": approval.tool, "action": approval.action},
        "shown": shown,
        "delivery": (
            f"counted; the approval still needs {waiting}: the run waits"
            if outcome == Approval.PENDING
            else "the worker's next heartbeat carries the decision (directive continue, approval "
            f"status {outcome})"
        ),
        "binding": (
            "declare the effect with approval_id and exactly these args; any other args are denied "
            "(approval_mismatch), and the approval is single-use"
            if outcome == Approval.APPROVED
            else "the action is not approved (yet)"
            if outcome == Approval.PENDING
            else "the action was not approved"
        ),
    }


def expire_due_approvals(*, actor: Actor, now=None) -> list[str]:
    """Pending approvals past their deadline end ``timed_out`` (not rejected) and escalate. One
    transaction per approval; re-derives everything from the database, so running it twice is harmless."""
    now = now or timezone.now()
    expired = []
    due = Approval.objects.filter(status=Approval.PENDING, deadline__lte=now).values_list(
        "pk", "run_id"
    )
    for approval_id, run_id in due:
        with transaction.atomic(durable=True):
            run = lock_run(run_id)
            updated = Approval.objects.filter(
                pk=approval_id, status=Approval.PENDING, deadline__lte=now
            ).update(
                status=Approval.TIMED_OUT,
                decided_at=now,
                decision_reason="deadline passed without a decision",
            )
            if updated != 1:  # decided just before the deadline scan got the lock
                continue
            approval = Approval.objects.get(pk=approval_id)
            data = {
                "approval": str(approval.pk),
                "tool": approval.tool,
                "action": approval.action,
                "deadline": approval.deadline,
                "status": Approval.TIMED_OUT,
                "note": "timed out: no human decided; this is not a rejection",
            }
            append_history(
                run, "approval_timed_out", data, attempt=run.current_attempt_id, actor=actor
            )
            if transition(run.state, Event.APPROVAL_TIMED_OUT) is not None:
                apply_transition(
                    run,
                    Event.APPROVAL_TIMED_OUT,
                    actor=actor,
                    reason="approval deadline passed",
                    data={"approval": str(approval.pk)},
                )
            escalation = {
                **data,
                "escalated_to": INCIDENT_COMMANDER,
                "run_state": run.state,
                "required_role": approval.required_role,
            }
            append_history(
                run, "approval_escalated", escalation, attempt=run.current_attempt_id, actor=actor
            )
            record_audit(
                actor=actor,
                action="approval.escalated",
                object_type="approval",
                object_id=approval.pk,
                run_id=run.pk,
                reason="approval deadline passed without a decision",
                context=escalation,
            )
            expired.append(str(approval.pk))
    return expired


@shared_task(acks_late=True)
def expire_approvals() -> list[str]:
    return expire_due_approvals(actor=system_actor("approvals-deadline"))


# --- on the console: its preview card and receipt, drawn by console/cards.py and console/receipts.py


def approval_card(p: Mapping[str, Any]) -> Answers:
    shown = p.get("shown") or {}
    return [
        cards.answer(
            "decision",
            "Decides",
            f"{shown.get('tool')}:{shown.get('action')} in this attempt, once — "
            f"approval {p.get('approval_status')}",
        ),
        cards.answer(
            "args",
            "With exactly these args",
            "",
            cards.table(["args"], [cards.row(cards.cell("value", shown.get("args") or {}))]),
            empty="no args",
        ),
        cards.answer(
            "requested",
            "Requested",
            f"by {shown.get('requested_by')}: {shown.get('request_reason') or 'no reason given'}",
        ),
        cards.answer(
            "deadline",
            "Deadline",
            "",
            cards.table(
                ["deadline", "needs role"],
                [
                    cards.row(
                        cards.cell("time", shown.get("deadline")),
                        cards.cell("text", _needs_now(shown)),
                    )
                ],
            ),
        ),
        cards.answer("delivery", "Delivery", p.get("delivery", "")),
    ]


def _needs_now(shown: Mapping[str, Any]) -> str:
    """The required role; for a multi-party approval, what its open stage still needs ("1 from team
    payments", "2 approver")."""
    steps = (shown.get("progress") or {}).get("steps") or []
    open_now = [
        f"{s['still_needed']} " + (f"from team {s['team']}" if s.get("team") else s["role"])
        for s in steps
        if s.get("open") and s.get("still_needed")
    ]
    return "; ".join(open_now) or str(shown.get("required_role") or "")


def approval_receipt(r: Mapping[str, Any]) -> Answers:
    a, shown = r.get("approval") or {}, r.get("shown") or {}
    return [
        cards.answer(
            "decision",
            "Decision",
            f"{a.get('decision')} {a.get('tool')}:{a.get('action')} by {a.get('decided_by')} ({a.get('role')})",
            at=a.get("decided_at"),
        ),
        cards.answer("binding", "Binding", r.get("binding", "")),
        cards.answer(
            "args",
            "Args shown",
            "",
            cards.table(["args"], [cards.row(cards.cell("value", shown.get("args") or {}))]),
            empty="no args",
        ),
        cards.answer("delivery", "Delivery", r.get("delivery", "")),
    ]


def approval_blocking(p: Mapping[str, Any]) -> list[str]:
    if p.get("approval_status") in (None, "pending"):
        return []
    return [f"the approval is already {p.get('approval_status')}"]


# The kinds of this module share their console pieces.
APPROVAL_CONSOLE = Console(
    offered=lambda data: bool(data["pending_approvals"]),
    card=approval_card,
    receipt=approval_receipt,
    blocking=approval_blocking,
    fields=("approval_id",),
)

CONTRACTS = (
    Contract(
        kind="approve",
        event=Event.APPROVE,
        preview=preview,
        apply=_decide(Approval.APPROVED, Event.APPROVE),
        spec=Spec(
            summary="a planned human-in-the-loop boundary: approve the exact action",
            stops=(),
            continues=("the run, with a single-use approval bound to the action's digest",),
            cascade="this run only",
            authority="one declaration matching the digest",
            claims=(
                "four_eyes",
                "digest_bound",
                "single_use",
                "policy_required_by_registration",
                "policy_role_wins",
                "superseded_when_the_run_moves_on",
            ),
        ),
        may_issue=frozenset({APPROVER, INCIDENT_COMMANDER, SECURITY_RESPONDER, ADMIN}),
        console=APPROVAL_CONSOLE,
        order=90,
    ),
    Contract(
        kind="reject",
        event=Event.REJECT,
        preview=preview,
        apply=_decide(Approval.REJECTED, Event.REJECT),
        spec=Spec(
            summary="refuse the requested action",
            stops=("the requested action",),
            continues=("the run, which learns the rejection",),
            cascade="this run only",
            authority="unchanged",
            claims=("four_eyes",),
        ),
        may_issue=frozenset({APPROVER, INCIDENT_COMMANDER, SECURITY_RESPONDER, ADMIN}),
        console=APPROVAL_CONSOLE,
        order=100,
    ),
)
