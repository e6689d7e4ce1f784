"""Which runs a fleet operation acts on: the filter parsed (runs/search.py), the runs it matches,
and for each whether its per-run contract applies today -- from the state table and the decision
authority, without running the contract's own preview."""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import dataclass
from typing import Any

from django.db.models import QuerySet
from django.http import QueryDict

from core.actors import Actor
from core.errors import Invalid
from interventions.plugins import get_contract
from runs.models import Run
from runs.search import BadFilter, RunFilter
from runs.states import State, transition

# fleet kind -> the per-run contract each run receives
FLEET_KINDS = {
    "pause": "pause",
    "resume": "resume",
    "cancel": "cancel",
    "take_command": "transfer",
}
# Retired: a freeze over a scope of the fleet is a standing rule, not run-by-run freezes of a one-off
# selection (which left a run started afterwards unfrozen while the operation said "completed").
# One contract freezes the fleet: standing_freeze (interventions/fleet/freezes.py). Asked for by
# name, these are refused saying so; a run's own freeze is still its per-run contract.
RETIRED_KINDS = {
    "freeze_capability": "POST /api/v1/fleet/freezes (a standing freeze; restore it with "
    "POST /api/v1/fleet/freezes/{id}/restore)",
    "restore_capability": "POST /api/v1/fleet/freezes/{id}/restore for a standing freeze, or "
    "restore_capability on the run for a run's own freeze",
}
# The per-run contract each recorded operation's runs receive: one recorded before the retirement
# (still running, or held) finishes as it started, and may still be followed and halted.
RECORDED_KINDS = FLEET_KINDS | {kind: kind for kind in RETIRED_KINDS}
MAX_TARGETS = 5000


@dataclass
class Selection:
    matched: int
    targets: list[Run]
    excluded: list[tuple[Run, str]]


# The filter keys a fleet selection understands (runs/search.py). Any other key is refused, never
# ignored: dropping one would widen the operation to runs the operator did not choose.
FILTER_KEYS = frozenset(
    {
        "q",
        "id",
        "agent",
        "touched",
        "owner",
        "state",
        "attention",
        "since",
        "until",
        "updated_since",
        "updated_until",
    }
)
# A list page's paging and order: the operation takes every match, in its own order.
PAGING_KEYS = frozenset({"cursor", "before", "after", "page", "sort", "order", "limit"})
MAX_IDS = 1000


@dataclass(frozen=True)
class FleetFilter:
    """The run list's filter, plus an explicit list of runs (several ``id``: runs picked one by one)."""

    runs: RunFilter
    ids: tuple[uuid.UUID, ...] = ()

    def queryset(self, actor: Actor) -> QuerySet[Run]:
        qs = self.runs.queryset(actor)
        return qs.filter(pk__in=self.ids) if self.ids else qs


def parse_filter(run_filter: str) -> FleetFilter:
    query = QueryDict(run_filter, mutable=True)
    for key in PAGING_KEYS & set(query):
        del query[key]
    unknown = sorted(set(query) - FILTER_KEYS)
    if unknown:
        raise Invalid(
            f"a fleet operation cannot select runs by {unknown[0]!r}; use {sorted(FILTER_KEYS)}",
            field=f"filter.{unknown[0]}",
        )
    ids: tuple[uuid.UUID, ...] = ()
    if len(picked := query.getlist("id")) > 1:  # one id (or prefix) is the run list's own filter
        if len(picked) > MAX_IDS:
            raise Invalid(f"at most {MAX_IDS} ids", field="filter.id")
        try:
            ids = tuple(dict.fromkeys(uuid.UUID(v) for v in picked))
        except ValueError:
            raise Invalid("several ids must each be a full run id", field="filter.id") from None
        del query["id"]
    try:
        selected = RunFilter.from_query(query)
    except BadFilter as err:
        raise Invalid(err.detail, field=f"filter.{err.field}") from None
    if selected.is_empty and not ids:
        raise Invalid("choose the runs: filter by state, agent, id, owner, …", field="filter")
    return FleetFilter(selected, ids)


def select(actor: Actor, kind: str, run_filter: str, options: dict[str, Any]) -> Selection:
    """The runs the filter matches, split into those the contract applies to and the rest (why)."""
    runs = list(
        parse_filter(run_filter).queryset(actor).order_by("created_at", "pk")[: MAX_TARGETS + 1]
    )
    if len(runs) > MAX_TARGETS:
        raise Invalid(f"the filter matches more than {MAX_TARGETS} runs: narrow it", field="filter")
    targets, excluded = [], []
    for run in runs:
        why = refusal(run, kind, actor)
        if why:
            excluded.append((run, why))
        else:
            targets.append(run)
    return Selection(len(runs), targets, excluded)


def refusal(run: Run, kind: str, actor: Actor) -> str:
    """Why the per-run contract would be refused today ("" if it applies) -- from the state table
    and the decision authority, without running the contract's own preview."""
    contract = get_contract(FLEET_KINDS[kind])
    if contract.event is not None and transition(run.state, contract.event) is None:
        return f"{contract.kind} is not allowed while the run is {run.state}"
    if run.state == State.CLOSED:
        return "the run is closed"
    owner = run.decision_authority
    if kind == "take_command":
        return "you already hold decision authority" if owner and owner.pk == actor.user_id else ""
    if contract.owner_bound and owner is not None and owner.pk != actor.user_id:
        return f"{owner.username} holds decision authority over this run"
    return ""


def selection_digest(kind: str, options: dict[str, Any], targets: list[Run]) -> str:
    """What the operator confirmed: a start whose selection differs is refused (preview again)."""
    body = json.dumps([kind, options, sorted(str(r.pk) for r in targets)], sort_keys=True)
    return hashlib.sha256(body.encode()).hexdigest()[:32]
