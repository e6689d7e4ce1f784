"""Close: the accountable owner ends the case. Nothing further happens to the run."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypedDict

from core.actors import Actor
from core.roles import ADMIN, INCIDENT_COMMANDER, OPERATOR
from interventions import cards, facts
from interventions.models import Intervention
from interventions.plugins import Answers, Console, Contract, Request, Rows, Spec
from runs.models import Run
from runs.selectors import unresolved_effects
from runs.services.decisions import apply_transition
from runs.states import Event


class ClosePreview(TypedDict):
    committed_effects: Rows
    unresolved_effects: Rows
    note: str


class CloseReceipt(TypedDict):
    state: str
    committed_effects: Rows


def preview(run: Run, req: Request, actor: Actor) -> ClosePreview:
    return {
        "committed_effects": facts.committed_effects(run),
        "unresolved_effects": unresolved_effects(run),
        "note": "closing is final: no retry, compensation or resume afterwards",
    }


def apply(run: Run, req: Request, actor: Actor, intervention: Intervention) -> CloseReceipt:
    apply_transition(run, Event.CLOSE, actor=actor, reason=req.reason)
    return {"state": run.state, "committed_effects": facts.committed_effects(run)}


# --- on the console: its preview card and receipt, drawn by console/cards.py and console/receipts.py


def close_card(p: Mapping[str, Any]) -> Answers:
    unresolved = p.get("unresolved_effects") or []
    return [
        cards.answer("final", "Final", p.get("note", "")),
        cards.answer(
            "committed",
            "Stays committed",
            "",
            cards.committed_table(p.get("committed_effects") or []),
            empty="nothing committed",
        ),
        cards.answer(
            "unresolved",
            "Left unresolved",
            "",
            cards.unresolved_table(unresolved),
            empty="nothing in flight or unknown",
            tone="bad" if unresolved else "",
        ),
    ]


def close_receipt(r: Mapping[str, Any]) -> Answers:
    return [
        cards.answer(
            "committed",
            "Stays committed",
            "closed: nothing further happens to the run",
            cards.committed_table(r.get("committed_effects") or []),
            empty="nothing committed",
        )
    ]


CONTRACTS = (
    Contract(
        kind="close",
        event=Event.CLOSE,
        preview=preview,
        apply=apply,
        spec=Spec(
            summary="the accountable owner ends the case",
            stops=("everything, for good",),
            continues=(),
            cascade="this run only",
            authority="unchanged",
        ),
        may_issue=frozenset({OPERATOR, INCIDENT_COMMANDER, ADMIN}),
        console=Console(card=close_card, receipt=close_receipt),
        order=160,
        owner_bound=True,
    ),
)
