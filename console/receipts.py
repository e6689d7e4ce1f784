"""Receipt cards: what an intervention did, the answer first (the answer lines are the contract's own,
interventions/<kind>.py; interventions/cards.py has the pieces), and the receipt's permalink page
/receipts/<intervention id>/."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from django.http import Http404, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from console.common import (
    ConsoleRequest,
    console_view,
    kind_label,
    present,
    visible_run_or_404,
)
from console.reports import report_for
from interventions.cards import answer, card, cell, row, table
from interventions.models import Intervention
from interventions.plugins import REGISTRY
from interventions.selectors import intervention_by_id


def _state_line(r: dict[str, Any]) -> str:
    state = r.get("state")
    waiting = r.get("waiting_for")
    return f"The run is now {state}" + (
        f": waiting for {waiting.removeprefix('the ')}" if waiting else ""
    )


class _Read(dict):
    """A receipt that remembers which keys the card read, so the folded rest shows only the others."""

    def __init__(self, data: dict[str, Any]):
        super().__init__(data)
        self.read: set[str] = set()

    def get(self, key: Any, default: Any = None) -> Any:
        self.read.add(key)
        return super().get(key, default)

    def __getitem__(self, key: Any) -> Any:
        self.read.add(key)
        return super().__getitem__(key)


# On the receipt's header line already, or drawn by the job's report below the card.
NOT_REPEATED = {
    "kind",
    "issued_by",
    "role",
    "reason",
    "scope",
    "override",
    "override_reason",
    "job",
}


def receipt_card(i: Intervention) -> dict[str, Any]:
    r = _Read(i.receipt or {})
    contract = REGISTRY.get(i.kind)
    answers = contract.console.receipt(r) if contract else []
    who = answer(
        "who",
        "Who and why",
        f"{i.actor_label} ({i.role or 'no role'}): {i.reason} ·",
        at=i.created_at,
    )
    if i.override:
        who["text"] = f"{i.actor_label} ({i.role}), overriding: {i.override_reason} · {i.reason} ·"
    rest = {k: v for k, v in r.items() if k not in r.read and k not in NOT_REPEATED}
    more = [answer("recorded", "Also recorded", "", table(["receipt"], [row(cell("value", rest))]))]
    out = card(
        "receipt-card",
        f"Receipt: {kind_label(i.kind)}",
        _state_line(r) if r.get("state") else f"Status {i.status}",
        [*answers, who],
        more=more if rest else [],
    )
    return out | {"kind": i.kind, "id": str(i.pk), "run_id": str(i.run_id), "status": i.status}


def receipt_context(i: Intervention) -> dict[str, Any]:
    return {
        "i": i,
        "card": receipt_card(i),
        "label": kind_label(i.kind),
        "rep": report_for(i),
    }


@console_view
@require_GET
def receipt_page(request: ConsoleRequest, intervention_id: UUID) -> HttpResponse:
    """The receipt's permalink: the card and its job report, for anyone who may see the run."""
    intervention = intervention_by_id(intervention_id)
    if intervention is None:
        raise Http404("no such receipt")
    run = visible_run_or_404(request.actor, intervention.run_id)
    return render(
        request,
        "console/intervention_receipt.html",
        receipt_context(intervention)
        | {"run": run, "job": present((intervention.receipt or {}).get("job"))},
    )
