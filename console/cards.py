"""Preview cards: a contract's preview as the answers an operator needs, in the order they need them
(docs/operator/scenarios.md), drawn by console/templates/console/intervention_card.html.

Generic: the answer lines, the folded extras and what would block the confirm are the contract's own
console pieces (interventions/plugins.py ``Console``, declared in interventions/<kind>.py); this
module adds the verdict and the frame every card shares.
"""

from __future__ import annotations

from typing import Any

from interventions.cards import card
from interventions.plugins import REGISTRY


def verdict(p: dict[str, Any]) -> tuple[str, str, list[str], list[str]]:
    """(text, tone, refusals, states): the text is followed by the states' badges."""
    if p.get("allowed"):
        if p["state"] != p["next_state"]:
            return "Allowed:", "", [], [p["state"], p["next_state"]]
        return "Allowed: the run stays", "", [], [p["state"]]
    refusal = f"{p['kind'].replace('_', ' ')} is not allowed while the run is {p['state']}"
    return "Not allowed while the run is", "bad", [refusal], [p["state"]]


def preview_card(p: dict[str, Any], dry_run: dict[str, Any] | None = None) -> dict[str, Any]:
    """The card for one preview (the dict interventions.base.preview returns). ``dry_run``: for a
    resume, the revalidation report as it would come out now (console/interventions.py)."""
    kind = p["kind"]
    if dry_run is not None:
        p = p | {"dry_run": dry_run}
    text, tone, refused, states = verdict(p)
    pieces = REGISTRY[kind].console
    return {"kind": kind, "states": states, "foreseen": pieces.foresees(p)} | card(
        "preview-card",
        "Preview — nothing has changed yet",
        text,
        pieces.card(p),
        tone=tone,
        blocking=refused + pieces.blocking(p),
        more=pieces.more(p),
    )
