"""Transfer ownership changes *accountability*, not the run's state. Three separate facets move
together or apart:

- ``assignment``: the accountable person (``Run.assignee``);
- ``decision_authority``: who may resume, cancel, compensate or close (``Run.decision_authority``);
- ``execution_lease``: which worker may execute next (``Run.execution_pin``; ``claim_run`` refuses
  any other worker). Only while no live lease holds the run: a worker mid-step cannot be handed
  over, so the operator pauses first.

The permission and decision-authority checks are base.authorize's (transfer is owner-bound): someone
who is not the current decision authority needs a recorded override. A run nobody owns yet is in the
agent's lane and an operator may simply take it. Every facet moved is its own history event and
audit row, so "who held what, when" is answerable facet by facet.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypedDict

from django.contrib.auth import get_user_model
from django.utils import timezone

from audit.services import record_audit
from core.actors import Actor
from core.errors import Conflict, Invalid
from core.roles import (
    ADMIN,
    INCIDENT_COMMANDER,
    OPERATOR,
    PERMISSIONS,
    may,
    roles_of,
)
from interventions import cards, facts
from interventions.base import pending_approvals
from interventions.models import Intervention
from interventions.plugins import Answers, Console, Contract, Request, Row, Rows, Spec
from runs.models import ExecutionLease, Run
from runs.selectors import unresolved_effects
from runs.services.decisions import notify_run_changed
from runs.services.history import append_history
from runs.states import State

FACETS = ("assignment", "decision_authority", "execution_lease")
# What "who may now ..." answers: the actions the decision authority governs.
GOVERNED = ("resume", "cancel", "compensate", "close")
AGENT_LANE = "agent lane (no human owner)"
FIELDS = {
    "assignment": "assignee",
    "decision_authority": "decision_authority",
    "execution_lease": "execution_pin",
}


def _facets(req: Request) -> list[str]:
    facets = req.options.get("facets")
    if not isinstance(facets, list) or not facets or not all(isinstance(f, str) for f in facets):
        raise Invalid(
            f"options.facets must be a non-empty list drawn from {list(FACETS)}",
            field="options.facets",
        )
    unknown = sorted(set(facets) - set(FACETS))
    if unknown:
        raise Invalid(
            f"unknown facet(s) {unknown}; facets are {list(FACETS)}", field="options.facets"
        )
    return [f for f in FACETS if f in facets]


def _target_user(req: Request, facets: list[str]):
    if not {"assignment", "decision_authority"} & set(facets):
        return None
    name = req.options.get("to")
    if not isinstance(name, str) or not name:
        raise Invalid(
            "options.to (a username) is required to move assignment or decision authority",
            field="options.to",
        )
    user = get_user_model().objects.filter(username=name, is_active=True).first()
    if user is None:
        raise Invalid(f"no active user {name!r}", field="options.to")
    roles = roles_of(user)
    if not roles:
        raise Invalid(f"{name} holds no role and cannot own a run", field="options.to")
    if "decision_authority" in facets and not any(may(roles, a) for a in GOVERNED):
        raise Invalid(
            f"{name}'s role(s) {sorted(roles)} may not resume, cancel, compensate or close: "
            "they cannot hold decision authority",
            field="options.to",
        )
    return user


def _target_worker(req: Request, facets: list[str]) -> str:
    if "execution_lease" not in facets:
        return ""
    worker = req.options.get("to_worker")
    if not isinstance(worker, str) or not worker.strip() or len(worker) > 150:
        raise Invalid(
            "options.to_worker (a worker name) is required to move the execution lease",
            field="options.to_worker",
        )
    return worker.strip()


def _lease_holder(run: Run) -> dict[str, Any]:
    lease = ExecutionLease.objects.filter(run=run).order_by("-granted_at").first()
    live = lease is not None and lease.is_live()
    return {
        "worker": lease.worker if lease else None,
        "live": live,
        "expires_at": lease.expires_at.isoformat() if lease is not None and live else None,
        "pinned_to": run.execution_pin or None,
    }


def _username(user) -> str | None:
    return user.username if user is not None else None


def holders(run: Run) -> dict[str, Any]:
    """The three facets as they stand, each on its own."""
    return {
        "assignment": _username(run.assignee) or AGENT_LANE,
        "decision_authority": _username(run.decision_authority) or AGENT_LANE,
        "execution_lease": _lease_holder(run),
    }


def who_may_now(run: Run) -> dict[str, Any]:
    """Per governed action: the decision authority (if their role allows it) and the roles that may act
    over them with a recorded override. Read from the permission matrix, not restated here."""
    owner = run.decision_authority
    owner_roles = roles_of(owner) if owner is not None else frozenset()
    out = {}
    for action in GOVERNED:
        allowed = sorted(PERMISSIONS[action])
        if owner is None:
            out[action] = {
                "decision_authority": None,
                "may_act": [f"any user with role {r}" for r in allowed],
                "by_override": [],
                "note": "no decision authority: the run is in the agent's lane",
            }
            continue
        override_roles = sorted(PERMISSIONS[action] & PERMISSIONS["override"])
        out[action] = {
            "decision_authority": owner.username,
            "may_act": [owner.username] if may(owner_roles, action) else [],
            "by_override": [f"role {r} (with an override reason)" for r in override_roles],
            "note": (
                "anyone else is refused (not_decision_authority) unless they record an override"
                if may(owner_roles, action)
                else f"{owner.username}'s role(s) {sorted(owner_roles)} may not {action}: only an override can"
            ),
        }
    return out


class TransferPreview(TypedDict):
    """Who holds each facet now, who would hold it, and what is open at the handoff."""

    facets: list[str]
    current: Row
    proposed: Row
    blocked_by: list[str]
    unresolved_effects: Rows
    pending_approvals: Rows
    authority_handed_over: Rows


class TransferReceipt(TypedDict):
    state: str
    facets_moved: list[str]
    facets_unchanged: list[str]
    records: Rows
    before: Row
    after: Row
    overriding_actor: str | None
    unresolved_effects: Rows
    pending_approvals: Rows
    authority_handed_over: Rows
    who_may_now: Row
    execution_note: str


def preview(run: Run, req: Request, actor: Actor) -> TransferPreview:
    facets = _facets(req)
    user, worker = _target_user(req, facets), _target_worker(req, facets)
    lease = _lease_holder(run)
    blocked = []
    if run.state == State.CLOSED:
        blocked.append("the run is closed: nothing about it can change")
    if "execution_lease" in facets and lease["live"]:
        blocked.append(
            f"worker {lease['worker']!r} holds a live execution lease: pause the run first"
        )
    return {
        "facets": facets,
        "current": holders(run),
        "proposed": {
            "assignment": _username(user) if "assignment" in facets else None,
            "decision_authority": _username(user) if "decision_authority" in facets else None,
            "execution_lease": worker or None,
        },
        "blocked_by": blocked,
        "unresolved_effects": unresolved_effects(run),
        "pending_approvals": pending_approvals(run),
        "authority_handed_over": facts.active_grants(run),
    }


def _holds(run: Run, facet: str, value: Any) -> bool:
    if facet == "execution_lease":
        return run.execution_pin == value
    return getattr(run, f"{FIELDS[facet]}_id") == value.pk


def _move(
    run: Run,
    facet: str,
    before: Any,
    after: Any,
    req: Request,
    actor: Actor,
    intervention: Intervention,
) -> dict[str, Any]:
    record = {
        "facet": facet,
        "from": before,
        "to": after,
        "reason": req.reason,
        "by": actor.name,
        "override": intervention.override,
        "override_reason": intervention.override_reason or None,
    }
    append_history(
        run, "ownership_transferred", {**record, "intervention": str(intervention.pk)}, actor=actor
    )
    record_audit(
        actor=actor,
        action="ownership.transferred",
        object_type="run",
        object_id=run.pk,
        run_id=run.pk,
        reason=req.reason,
        context={
            **record,
            "intervention": str(intervention.pk),
            "unresolved_effects": unresolved_effects(run),
        },
    )
    return record


def apply(run: Run, req: Request, actor: Actor, intervention: Intervention) -> TransferReceipt:
    if run.state == State.CLOSED:
        raise Conflict("the run is closed: ownership can no longer change", state=run.state)
    facets = _facets(req)
    user, worker = _target_user(req, facets), _target_worker(req, facets)
    before = holders(run)
    if "execution_lease" in facets and before["execution_lease"]["live"]:
        raise Conflict(
            f"worker {before['execution_lease']['worker']!r} holds a live execution lease; pause the run "
            "first, then transfer execution",
            state=run.state,
        )
    at_handoff = {
        "unresolved_effects": unresolved_effects(run),
        "pending_approvals": pending_approvals(run),
    }
    moved, unchanged, fields = [], [], {}
    for facet in facets:
        value = worker if facet == "execution_lease" else user
        if _holds(run, facet, value):
            unchanged.append(facet)
            continue
        setattr(run, FIELDS[facet], value)
        fields[FIELDS[facet]] = value
        to = {"pinned_to": worker} if facet == "execution_lease" else user.username
        moved.append(_move(run, facet, before[facet], to, req, actor, intervention))
    if not moved:
        raise Conflict(
            f"nothing to transfer: {', '.join(unchanged)} already held by the proposed owner",
            state=run.state,
        )
    Run.objects.filter(pk=run.pk).update(**fields, updated_at=timezone.now())
    notify_run_changed(run)
    return {
        "state": run.state,
        "facets_moved": [m["facet"] for m in moved],
        "facets_unchanged": unchanged,
        "records": moved,
        "before": before,
        "after": holders(run),
        "overriding_actor": actor.name if intervention.override else None,
        "unresolved_effects": at_handoff["unresolved_effects"],
        "pending_approvals": at_handoff["pending_approvals"],
        "authority_handed_over": facts.active_grants(run),
        "who_may_now": who_may_now(run),
        "execution_note": (
            f"only worker {worker!r} may claim the next attempt"
            if "execution_lease" in facets
            else "execution lease unchanged"
        ),
    }


# --- on the console: its preview card and receipt, drawn by console/cards.py and console/receipts.py


def _approvals_table(approvals: list[dict[str, Any]]) -> dict[str, Any]:
    return cards.table(
        ["approval", "action", "status"],
        [
            cards.row(
                cards.cell("id", a["id"]), cards.effect_cell(a), cards.cell("status", a["status"])
            )
            for a in approvals
        ],
    )


def transfer_card(p: Mapping[str, Any]) -> Answers:
    current, proposed = p.get("current") or {}, p.get("proposed") or {}
    facets = p.get("facets") or []
    lease = current.get("execution_lease") or {}
    now_text = {
        "assignment": current.get("assignment"),
        "decision_authority": current.get("decision_authority"),
        "execution_lease": (
            f"{lease.get('worker')} (live)"
            if lease.get("live")
            else (lease.get("worker") or "none")
        )
        + (f", pinned to {lease['pinned_to']}" if lease.get("pinned_to") else ""),
    }
    rows = [
        cards.row(
            cards.cell("text", f.replace("_", " ")),
            cards.cell("text", now_text.get(f) or "—"),
            cards.cell("text", (proposed.get(f) or "—") if f in facets else "unchanged"),
            mark="moves" if f in facets else "",
        )
        for f in ("assignment", "decision_authority", "execution_lease")
    ]
    approvals = p.get("pending_approvals") or []
    return [
        cards.answer("facets", "Moves", "", cards.table(["facet", "now", "after"], rows)),
        cards.answer(
            "unresolved",
            "Unresolved at handoff",
            "",
            cards.unresolved_table(p.get("unresolved_effects") or []),
            empty="no effect in flight or unknown",
        ),
        cards.answer(
            "approvals",
            "Pending decisions",
            "",
            _approvals_table(approvals),
            empty="no pending approval",
        ),
        cards.answer(
            "authority",
            "Grants handed over as they are",
            "",
            cards.grants_table(p.get("authority_handed_over") or []),
        ),
    ]


def transfer_receipt(r: Mapping[str, Any]) -> Answers:
    records = r.get("records") or []
    may = r.get("who_may_now") or {}
    return [
        cards.answer(
            "moved",
            "Moved",
            "",
            cards.table(
                ["facet", "from", "to"],
                [
                    cards.row(
                        cards.cell("text", m["facet"].replace("_", " ")),
                        cards.cell("value", m["from"]),
                        cards.cell("value", m["to"]),
                    )
                    for m in records
                ],
            ),
        ),
        cards.answer(
            "who_may_now",
            "Who may now",
            "",
            cards.table(
                ["action", "may act", "by override"],
                [
                    cards.row(
                        cards.cell("text", action),
                        cards.cell("text", ", ".join(v.get("may_act") or []) or "nobody directly"),
                        cards.cell("text", ", ".join(v.get("by_override") or []) or "—"),
                    )
                    for action, v in may.items()
                ],
            ),
        ),
        cards.answer(
            "unresolved",
            "Unresolved at handoff",
            "",
            cards.unresolved_table(r.get("unresolved_effects") or []),
            empty="no effect in flight or unknown",
        ),
        cards.answer(
            "approvals",
            "Pending decisions at handoff",
            "",
            _approvals_table(r.get("pending_approvals") or []),
            empty="no pending approval",
        ),
        cards.answer("execution", "Execution", r.get("execution_note", "")),
    ]


def transfer_blocking(p: Mapping[str, Any]) -> list[str]:
    return list(p.get("blocked_by") or [])


CONTRACTS = (
    Contract(
        kind="transfer",
        event=None,
        preview=preview,
        apply=apply,
        spec=Spec(
            summary="changes accountability: assignment, execution lease, decision authority",
            stops=(),
            continues=("the run, unchanged",),
            cascade="this run only",
            authority="decision rights move to the new owner; grants are handed over as they are",
            claims=("facets_separate", "former_owner_rejected"),
        ),
        may_issue=frozenset({OPERATOR, INCIDENT_COMMANDER, ADMIN}),
        console=Console(
            card=transfer_card,
            receipt=transfer_receipt,
            blocking=transfer_blocking,
            fields=("to", "facets", "to_worker"),
        ),
        order=70,
        owner_bound=True,
    ),
)
