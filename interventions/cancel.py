"""Cancel stops *future* work: new effects are denied at once, the worker is told to stop
(cooperative), and the lease's expiry forces it. Committed effects stay committed and are listed with
the compensations available -- cancel never marks them undone.

A cancel never escalates: a second plain cancel of a run already cancelling is refused (409, naming
the cancel under way), or answered with the original receipt when the same actor repeats the same
request. Stopping waiting for the worker is its own contract, terminate (interventions/terminate.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypedDict, cast

from django.utils import timezone

from core.actors import Actor
from core.errors import Conflict
from core.roles import ADMIN, INCIDENT_COMMANDER, OPERATOR
from interventions import cards, cascade, facts
from interventions.base import children_in_scope
from interventions.models import Intervention
from interventions.paging import children_link, ledger_link, paged, receipt_children_link
from interventions.plugins import Answers, Console, Contract, Request, Rows, Spec
from runs.models import Run
from runs.services.decisions import apply_transition
from runs.states import Event, State, transition

# A cascade stops children's work; it does not force a child's cooperative cancel nor interrupt a
# compensation under way (those stay an explicit decision on that run).
NOT_CASCADED = frozenset({State.CANCELLING, State.COMPENSATING})


def _children(run: Run, req: Request) -> list[dict[str, Any]]:
    rows = children_in_scope(run, req, Event.CANCEL)
    for row in rows:
        if row["in_scope"] and row["state"] in NOT_CASCADED:
            row["will_change"] = False
            row["note"] = (
                f"a {row['state']} child is not cancelled by the cascade; cancel it itself"
            )
    return rows


class CancelPreview(TypedDict):
    stops: str
    committed_effects: Rows
    committed_effects_total: int
    in_flight_effects: Rows
    in_flight_effects_total: int
    children: Rows
    children_total: int
    children_more: str | None
    note: str


class CancelReceipt(TypedDict):
    state: str
    cancelled_at: str
    new_effects: str
    waiting_for: str | None
    committed_effects: Rows
    committed_effects_total: int
    in_flight_effects: Rows
    in_flight_effects_total: int
    children: Rows
    children_total: int
    children_more: str | None
    cascade: cascade.CascadeProgress | None


def preview(run: Run, req: Request, actor: Actor) -> CancelPreview:
    shown: dict[str, Any] = {
        "stops": "all future work: no new effect is authorised; the worker is told to cancel at its next boundary, "
        "and is forced out when its lease expires",
        **_effects(run),
        **paged("children", _children(run, req), children_link(run.pk)),
        "note": "committed effects remain committed; use compensate to repair them",
    }
    return cast(CancelPreview, shown)


def _effects(run: Run) -> dict[str, Any]:
    return {
        **paged(
            "committed_effects", facts.committed_effects(run), ledger_link(run.pk, "committed")
        ),
        **paged(
            "in_flight_effects", facts.in_flight_effects(run), ledger_link(run.pk, "in_flight")
        ),
    }


def _cancel_one(run: Run, req: Request, actor: Actor, via: dict[str, Any] | None = None) -> None:
    data = {"scope": req.scope, **(via or {})}
    apply_transition(run, Event.CANCEL, actor=actor, reason=req.reason, data=data)


def _cancel_child(child: Run, req: Request, actor: Actor, via: dict[str, Any]) -> str | None:
    """The cascade's step (interventions/cascade.py): the child is locked."""
    if child.state in NOT_CASCADED:
        return f"a {child.state} child is not cancelled by the cascade; cancel it itself"
    if transition(child.state, Event.CANCEL) is None:
        return f"cancel does not apply to a {child.state} run"
    _cancel_one(child, req, actor, via)
    return None


cascade.register_step("cancel", _cancel_child)


def under_way(run: Run) -> Intervention | None:
    """The cancel that moved this run (or, by a tree cancel, its nearest ancestor) on, if any."""
    from interventions.selectors import latest_intervention

    return latest_intervention(run, "cancel")


class CancelUnderWay(TypedDict):
    """The cancel a repeated cancel is refused in favour of (and terminate ends)."""

    intervention: str | None
    issued_by: str | None
    at: str | None
    reason: str | None


def cancel_facts(original: Intervention | None) -> CancelUnderWay:
    if original is None:
        return {"intervention": None, "issued_by": None, "at": None, "reason": None}
    return {
        "intervention": str(original.pk),
        "issued_by": original.actor_label,
        "at": original.created_at.isoformat(),
        "reason": original.reason,
    }


def repeat(run: Run, req: Request, actor: Actor) -> Intervention | None:
    """A cancel of a run already cancelling (or cancelled by a cancel) is not a new decision. The same
    actor sending the same request again gets the original; anyone else is refused, told which cancel
    is under way and that terminate is the contract that stops waiting for the worker."""
    if run.state not in (State.CANCELLING, State.CANCELLED):
        return None
    original = under_way(run)
    same = original is not None and (
        original.run_id == run.pk
        and original.actor_label == actor.label
        and original.reason == req.reason
        and original.scope == req.scope
        and (original.options or {}) == req.options
    )
    if same:
        return original
    facts = cancel_facts(original)
    who = f" by {facts['issued_by']} at {facts['at']} ({facts['reason']})" if original else ""
    waiting = "; terminate stops waiting for the worker" if run.state == State.CANCELLING else ""
    raise Conflict(
        f"the run is already {run.state}: a cancel was issued{who}{waiting}",
        state=run.state,
        existing_cancel=facts,
    )


def apply(run: Run, req: Request, actor: Actor, intervention: Intervention) -> CancelReceipt:
    listed = _children(run, req)  # as they stood at the decision, before the cascade changed them
    _cancel_one(run, req, actor)
    # A tree's children are reached by the cascade: the first few here, the rest in its job.
    progress = cascade.start(run, req, actor, intervention) if req.scope == "tree" else None
    shown: dict[str, Any] = {
        "state": run.state,
        "cancelled_at": timezone.now().isoformat(),
        "new_effects": "denied from this commit on",
        "waiting_for": "the worker to stop (or its lease to expire)"
        if run.state == State.CANCELLING
        else None,
        **_effects(run),
        **paged("children", listed, receipt_children_link(intervention.pk)),
        "cascade": progress,
    }
    return cast(CancelReceipt, shown)


# --- on the console: its preview card and receipt, drawn by console/cards.py and console/receipts.py


def cancel_card(p: Mapping[str, Any]) -> Answers:
    return [
        cards.answer("stops", "What stops", p.get("stops", "")),
        cards.answer(
            "committed",
            "Stays committed",
            p.get("note", ""),
            cards.committed_table(p.get("committed_effects") or []),
            empty="nothing committed yet",
        ),
        cards.answer(
            "may_still_complete",
            "May still complete",
            "",
            cards.in_flight_table(p.get("in_flight_effects") or []),
            empty="nothing in flight",
        ),
        cards.children_answer(p, "children"),
    ]


def cancel_receipt(r: Mapping[str, Any]) -> Answers:
    return [
        cards.answer(
            "stops", "New effects", f"{r.get('new_effects', '')} ·", at=r.get("cancelled_at")
        ),
        cards.answer(
            "committed",
            "Still committed",
            "cancel never marks them undone; compensate to repair them",
            cards.committed_table(r.get("committed_effects") or []),
            empty="nothing had committed",
        ),
        cards.answer(
            "may_still_complete",
            "May still complete",
            "",
            cards.in_flight_table(r.get("in_flight_effects") or []),
            empty="nothing in flight",
        ),
        cards.children_answer(r, "children"),
    ]


def cancel_now(r: Mapping[str, Any], now: Mapping[str, Any]) -> str:
    return cards.stopped_now(now, "cancel", "cancelling", "cancelled")


CONTRACTS = (
    Contract(
        kind="cancel",
        event=Event.CANCEL,
        preview=preview,
        apply=apply,
        spec=Spec(
            summary="stops future work; committed effects stay committed",
            stops=(
                "authorisation of new effects",
                "new steps (directive 'cancel'); forced at lease expiry (terminate stops waiting sooner)",
                "a recovery or compensation under way (a compensation step already called finishes)",
            ),
            continues=("in-flight effects' outcomes are recorded",),
            cascade="scope 'run' or 'tree'",
            authority="unchanged",
            claims=(
                "committed_effects_listed_with_compensations",
                "never_marks_undone",
                "a_second_cancel_never_forces",
            ),
        ),
        may_issue=frozenset({OPERATOR, INCIDENT_COMMANDER, ADMIN}),
        console=Console(card=cancel_card, receipt=cancel_receipt, now=cancel_now, danger=True),
        order=30,
        scoped=True,
        owner_bound=True,
        repeat=repeat,
    ),
)
