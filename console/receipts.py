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
    visible_run_or_404,
)
from console.reports import report_for
from interventions.cards import answer, card, cell, children_table, clock, row, state_now, table
from interventions.models import Intervention
from interventions.plugins import REGISTRY
from interventions.selectors import (
    cascade_page,
    intervention_by_id,
    live_receipt,
    progress_text,
    receipt_now,
)
from runs.models import Run


def _then_line(i: Intervention, r: dict[str, Any]) -> str:
    """The decision-time snapshot's own line: what the receipt recorded when it was issued."""
    state = r.get("state")
    waiting = r.get("waiting_for")
    said = f"the run was {state}" if state else f"status {i.status}"
    if waiting:
        said += f", waiting for {waiting.removeprefix('the ')}"
    return f"Recorded at the decision, {clock(i.created_at)}: {said}"


def headline(i: Intervention) -> dict[str, Any]:
    """The receipt's headline: the current truth, read from the database at render time by the
    contract's ``Console.now`` (interventions/<kind>.py); ``final`` once nothing moves by itself."""
    now = receipt_now(i)
    contract = REGISTRY.get(i.kind)
    text = (contract.console.now if contract else state_now)(i.receipt or {}, now)
    if now.get("cascade"):  # a tree cascade: "... · 120 of 200 children reached"
        text = f"{text} · {progress_text(now['cascade'])}"
    return {"text": text, "final": now["final"], "state": now["state"], "id": str(i.pk)}


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
    r = _Read(live_receipt(i))
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
        _then_line(i, r),
        [*answers, who],
        more=more if rest else [],
    )
    return out | {
        "kind": i.kind,
        "id": str(i.pk),
        "run_id": str(i.run_id),
        "status": i.status,
        "now": headline(i),
    }


def receipt_context(i: Intervention) -> dict[str, Any]:
    return {
        "i": i,
        "card": receipt_card(i),
        "label": kind_label(i.kind),
        "rep": report_for(i),
    }


def visible_intervention_or_404(actor: Any, intervention_id: UUID) -> tuple[Intervention, Run]:
    """An intervention and its run, for anyone who may see the run (a 404 otherwise)."""
    intervention = intervention_by_id(intervention_id)
    if intervention is None:
        raise Http404("no such receipt")
    return intervention, visible_run_or_404(actor, intervention.run_id)


@console_view
@require_GET
def receipt_page(request: ConsoleRequest, intervention_id: UUID) -> HttpResponse:
    """The receipt's permalink: the card and its job report, for anyone who may see the run."""
    intervention, run = visible_intervention_or_404(request.actor, intervention_id)
    return render(
        request, "console/intervention_receipt.html", receipt_context(intervention) | {"run": run}
    )


@console_view
@require_GET
def receipt_headline(request: ConsoleRequest, intervention_id: UUID) -> HttpResponse:
    """The receipt card alone, re-read while the run still moves by itself (the card polls it)."""
    intervention, _ = visible_intervention_or_404(request.actor, intervention_id)
    return render(
        request, "console/intervention_card.html#card", {"card": receipt_card(intervention)}
    )


CHILDREN_PAGE = 100


@console_view
@require_GET
def receipt_children(request: ConsoleRequest, intervention_id: UUID) -> HttpResponse:
    """The children a pause or cancel listed, a page at a time, with what it did to each: the
    receipt card shows the first page only (interventions/paging.py)."""
    intervention, run = visible_intervention_or_404(request.actor, intervention_id)
    try:
        after = max(int(request.GET.get("after", "0")), 0)
    except ValueError:
        after = 0
    after = min(after, 10_000_000)
    page = cascade_page(intervention, after, CHILDREN_PAGE)
    rows = [c | {"will_change": c["status"] == "changed"} for c in page["children"]]
    return render(
        request,
        "console/receipt_children.html",
        {
            "i": intervention,
            "run": run,
            "label": kind_label(intervention.kind),
            "tbl": children_table(rows),
            "page": page,
            "first": after + 1 if rows else after,
            "last": after + len(rows),
            "prev_after": max(after - CHILDREN_PAGE, 0) if after else None,
            "next_after": after + len(rows) if after + len(rows) < page["total"] else None,
            "progress": progress_text(page["cascade"]) if page["cascade"] else "",
        },
    )
