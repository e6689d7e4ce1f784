"""Freeze a capability: hold back one ``tool:action`` (or ``tool:*``) on a run, whatever its grants
say, until restored. Narrower than suspending a grant (freezing ``payments:charge`` leaves a
``payments:*`` grant's refunds alone) and independent of it: the grants are untouched.

From the commit on, a declaration of a frozen tool:action is denied ``capability_frozen`` with the
freeze's reason (``runs/services/freeze.py``, one indexed lookup on the declaration's path). What is
already in flight cannot be recalled: the preview and receipt name it. ``restore_capability`` lifts
the live freeze of exactly that scope. Both are audited per run; a fleet operation issues them across
a filter (interventions/fleet/operations.py). Not owner-bound, like the authority contracts; not on a closed run.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypedDict

from django.utils import timezone

from audit.services import record_audit
from core.actors import Actor
from core.errors import Conflict, Invalid
from core.roles import ADMIN, INCIDENT_COMMANDER, SECURITY_RESPONDER
from interventions import cards
from interventions.models import Intervention
from interventions.plugins import Answers, Console, Contract, Request, Rows, Spec
from runs.models import CapabilityFreeze, Effect, Run
from runs.services.decisions import notify_run_changed
from runs.services.history import append_history
from runs.states import State


def scope_of(options: dict[str, Any]) -> str:
    scope = options.get("scope")
    tool, _, action = scope.partition(":") if isinstance(scope, str) else ("", "", "")
    if not isinstance(scope, str) or not tool or not action or ":" in action:
        raise Invalid(
            "options.scope must look like 'tool:action' or 'tool:*'", field="options.scope"
        )
    return scope


def live_freeze(run: Run, scope: str) -> CapabilityFreeze | None:
    return CapabilityFreeze.objects.filter(run=run, scope=scope, lifted_at__isnull=True).first()


def _covered(scope: str, tool: str, action: str) -> bool:
    return scope in (f"{tool}:{action}", f"{tool}:*")


def in_flight_in_scope(run: Run, scope: str) -> list[dict[str, Any]]:
    return [
        {
            "id": str(e.pk),
            "step": e.step,
            "tool": e.tool,
            "action": e.action,
            "idempotency_key": e.idempotency_key,
            "note": "already dispatched: cannot be recalled; may still complete",
        }
        for e in Effect.objects.filter(run=run, decision=Effect.AUTHORIZED, status=Effect.IN_FLIGHT)
        if _covered(scope, e.tool, e.action)
    ]


def blocked_by(run: Run, req: Request, scope: str) -> list[str]:
    """Why this run's freeze or restore would be refused (the fleet preview reads it too)."""
    if run.state == State.CLOSED:
        return ["the run is closed: its capabilities can no longer change"]
    live = live_freeze(run, scope)
    if req.kind == "freeze_capability" and live is not None:
        return [f"{scope} is already frozen on this run (since {live.frozen_at.isoformat()})"]
    if req.kind == "restore_capability" and live is None:
        return [f"{scope} is not frozen on this run"]
    return []


class FreezePreview(TypedDict):
    """What freezing (or restoring) one capability of a run would change."""

    capability: str
    change: str
    new_declarations: str
    grants: str
    blocked_by: list[str]
    cannot_recall: str | None
    in_flight_effects: Rows


class FreezeReceipt(TypedDict):
    state: str
    capability: str
    frozen: bool
    at: str
    new_declarations: str
    in_flight_effects: Rows


def preview(run: Run, req: Request, actor: Actor) -> FreezePreview:
    scope = scope_of(req.options)
    freezing = req.kind == "freeze_capability"
    return {
        "capability": scope,
        "change": "freeze" if freezing else "restore",
        "new_declarations": (
            f"declarations of {scope} are denied (capability_frozen) from the commit on"
            if freezing
            else f"declarations of {scope} are decided by the run's grants again"
        ),
        "grants": "unchanged: a freeze holds back the capability, not the grant",
        "blocked_by": blocked_by(run, req, scope),
        "cannot_recall": "in-flight effects below may still complete; their outcomes are recorded"
        if freezing
        else None,
        "in_flight_effects": in_flight_in_scope(run, scope),
    }


def apply(run: Run, req: Request, actor: Actor, intervention: Intervention) -> FreezeReceipt:
    scope = scope_of(req.options)
    blocked = blocked_by(run, req, scope)
    if blocked:
        raise Conflict(blocked[0], state=run.state, capability=scope)
    now = timezone.now()
    freeze: CapabilityFreeze | None
    if req.kind == "freeze_capability":
        freeze = CapabilityFreeze.objects.create(
            run=run,
            scope=scope,
            reason=req.reason,
            frozen_by=actor.label,
            intervention_id=intervention.pk,
            frozen_at=now,
        )
        kind, action = "capability_frozen", "capability.frozen"
    else:
        freeze = live_freeze(run, scope)
        assert freeze is not None  # blocked_by said so, under the run lock
        # Compare-and-swap: only a live freeze is lifted, once.
        if not CapabilityFreeze.objects.filter(pk=freeze.pk, lifted_at__isnull=True).update(
            lifted_at=now, lifted_by=actor.label, lift_reason=req.reason
        ):
            raise Conflict(f"{scope} was restored meanwhile", state=run.state, capability=scope)
        kind, action = "capability_restored", "capability.restored"
    facts = {
        "capability": scope,
        "freeze": str(freeze.pk),
        "intervention": str(intervention.pk),
        "reason": req.reason,
    }
    in_flight = in_flight_in_scope(run, scope)
    append_history(run, kind, facts, actor=actor)
    record_audit(
        actor=actor,
        action=action,
        object_type="run",
        object_id=run.pk,
        run_id=run.pk,
        reason=req.reason,
        context={**facts, "state": run.state, "in_flight_effects": in_flight},
    )
    notify_run_changed(run)
    return {
        "state": run.state,
        "capability": scope,
        "frozen": req.kind == "freeze_capability",
        "at": now.isoformat(),
        "new_declarations": preview(run, req, actor)["new_declarations"],
        "in_flight_effects": in_flight,
    }


# --- on the console: its preview card and receipt, drawn by console/cards.py and console/receipts.py


def freeze_card(p: Mapping[str, Any]) -> Answers:
    return [
        cards.answer("capability", "Capability", f"{p.get('change')} {p.get('capability')}"),
        cards.answer("declarations", "New declarations", p.get("new_declarations", "")),
        cards.answer("grants", "Grants", p.get("grants", "")),
        cards.answer(
            "may_still_complete",
            "Already dispatched",
            p.get("cannot_recall") or "",
            cards.in_flight_table(p.get("in_flight_effects") or []),
            empty="nothing in flight under this capability",
        ),
    ]


def freeze_receipt(r: Mapping[str, Any]) -> Answers:
    return [
        cards.answer(
            "capability",
            "Capability",
            f"{r.get('capability')} {'frozen' if r.get('frozen') else 'restored'} ·",
            at=r.get("at"),
        ),
        cards.answer("declarations", "New declarations", r.get("new_declarations", "")),
        cards.answer(
            "may_still_complete",
            "Already dispatched",
            "",
            cards.in_flight_table(r.get("in_flight_effects") or []),
            empty="nothing in flight under this capability",
        ),
    ]


# The kinds of this module share their console pieces.
FREEZE_CONSOLE = Console(card=freeze_card, receipt=freeze_receipt, fields=("capability",))

CONTRACTS = (
    Contract(
        kind="freeze_capability",
        event=None,
        preview=preview,
        apply=apply,
        spec=Spec(
            summary="hold back one tool:action on the run, whatever its grants say",
            stops=("declarations of that tool:action (capability_frozen), from the commit on",),
            continues=(
                "in-flight requests (cannot be recalled; listed)",
                "every other capability",
                "the grants themselves (unchanged)",
            ),
            cascade="this run only; a fleet operation freezes a filter's runs, one decision each",
            authority="grants unchanged; the capability is frozen until restored",
            claims=("denied_after_commit",),
        ),
        may_issue=frozenset({INCIDENT_COMMANDER, SECURITY_RESPONDER, ADMIN}),
        console=FREEZE_CONSOLE,
        order=140,
    ),
    Contract(
        kind="restore_capability",
        event=None,
        preview=preview,
        apply=apply,
        spec=Spec(
            summary="lift a capability freeze",
            stops=(),
            continues=("declarations of that tool:action are decided by the grants again",),
            cascade="this run only",
            authority="unchanged",
        ),
        may_issue=frozenset({INCIDENT_COMMANDER, SECURITY_RESPONDER, ADMIN}),
        console=FREEZE_CONSOLE,
        order=150,
    ),
)
