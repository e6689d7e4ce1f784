"""The contract registry: one :class:`Contract` per intervention kind, declared by the module that
implements it and registered when the app is ready (interventions/apps.py), never by a list.

A contract module ends with ``CONTRACTS = (Contract(...), ...)``: its state-machine event, its
preview and apply, what it promises (:class:`Spec`, served at /api/v1/contracts and drawn on the
contracts page), who may issue it (its permission row, handed to core.roles), and its console pieces
(:class:`Console`: the preview card's and the receipt's answer lines, drawn generically by
console/cards.py and console/receipts.py). tests/interventions/test_registry.py walks the registry
and fails for a kind missing any of them. How to add one: docs/concepts/adding-a-contract.md.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from core.errors import Invalid
from core.roles import declare_permission
from interventions.cards import state_now
from runs.states import Event

if TYPE_CHECKING:
    from core.actors import Actor
    from interventions.models import Intervention
    from runs.models import Run

# A preview's or receipt's listed facts (effects, grants, children...): JSON objects as the API
# serves them. Each contract types its own preview and receipt (a TypedDict beside its apply).
Row = dict[str, Any]
Rows = list[dict[str, Any]]

# A card's answer lines (interventions/cards.py draws each piece), built from a preview or a receipt.
Answers = list[dict[str, Any]]
Builder = Callable[[Mapping[str, Any]], Answers]
# A receipt's headline now: (the receipt as recorded, interventions.selectors.receipt_now) -> a sentence.
Headline = Callable[[Mapping[str, Any], Mapping[str, Any]], str]


def no_answers(_: Mapping[str, Any]) -> Answers:
    return []


def no_problems(_: Mapping[str, Any]) -> list[str]:
    return []


def always(_: Mapping[str, Any]) -> bool:
    return True


@dataclass
class Request:
    """What an operator (or a policy) asks of a contract: its kind, reason, scope and options."""

    kind: str
    reason: str
    scope: str = "run"
    options: dict[str, Any] = field(default_factory=dict)
    override_reason: str = ""

    @property
    def override(self) -> bool:
        return bool(self.override_reason)


@dataclass(frozen=True)
class Spec:
    """What a contract promises, in the operator's words. Roles and state edges are not repeated
    here: the contracts document reads them from the permission row and runs.states."""

    summary: str
    stops: tuple[str, ...]
    continues: tuple[str, ...]
    cascade: str
    authority: str
    jobs: tuple[str, ...] = ()
    claims: tuple[str, ...] = ()  # each checked by tests/interventions/test_contracts.py
    preconditions: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "summary": self.summary,
            "stops": list(self.stops),
            "continues": list(self.continues),
            "cascade": self.cascade,
            "authority": self.authority,
        }
        if self.preconditions:
            out["preconditions"] = list(self.preconditions)
        return out | {"jobs": list(self.jobs), "claims": list(self.claims)}


@dataclass(frozen=True)
class Console:
    """A contract's pieces on the console, as data the generic renderers draw.

    ``card``: the preview's answer lines; ``receipt``: the receipt's (the receipt builder reads a
    mapping that remembers which keys it read, so the folded rest shows only the others);
    ``blocking``: what confirm would refuse, as the preview already knows it (Confirm is disabled);
    ``more``: folded extras under the preview card; ``fields``: the dialog's form fields, read into
    the request's options; ``danger``: its button is drawn as a dangerous one; ``guard_note``: when
    set, the dialog offers an override of the contract's guard (to roles holding its
    ``guard_right``) and says what it overrides; ``offered``: whether the run page offers its button;
    ``now``: the receipt's headline, the current truth read at render time (the recorded answers
    stay below it as the decision-time snapshot); ``foresees``: what the follow-up job will refuse,
    as far as the preview can tell without side effects (Confirm stays enabled and says so)."""

    card: Builder
    receipt: Builder
    blocking: Callable[[Mapping[str, Any]], list[str]] = no_problems
    more: Builder = no_answers
    fields: tuple[str, ...] = ()
    danger: bool = False
    guard_note: str = ""
    # Given the run page's facts (runs.selectors.run_detail), whether there is anything to act on:
    # hides the button otherwise (no pending approval, no grant to restore). Services check again.
    offered: Callable[[Mapping[str, Any]], bool] = always
    now: Headline = state_now
    foresees: Callable[[Mapping[str, Any]], list[str]] = no_problems


@dataclass
class Contract:
    kind: str
    event: Event | None  # the state-machine event, or None for contracts that do not move state
    # Each returns the contract's own TypedDict (e.g. pause.PausePreview / pause.PauseReceipt).
    preview: Callable[[Run, Request, Actor], Mapping[str, Any]]
    apply: Callable[[Run, Request, Actor, Intervention], Mapping[str, Any]]
    spec: Spec
    may_issue: frozenset[str]  # the roles allowed to issue it (its row in core.roles.PERMISSIONS)
    console: Console
    order: int  # its place on the contracts page and among a run's buttons
    scoped: bool = False  # may cascade to descendants (scope=tree)
    # Acting on the run's course honours its decision authority; an emergency pause and the
    # security responder's authority changes do not wait for the owner (recorded all the same).
    owner_bound: bool = False
    # The right an override of this contract's own guard takes (a failing revalidation, a
    # non-retryable failure class): recorded as an override like any other.
    guard_right: str = "override"
    # A decision already taken that this request repeats (called with the run locked, before the
    # state table is consulted): the original intervention when the same actor sends the same
    # request again (its receipt is answered, nothing new is decided), a Conflict naming it when
    # someone else asks for what is already under way, None when this is a new decision. Cancel
    # declares one: two plain cancels never escalate (docs/concepts/contracts.md#cancel).
    repeat: Callable[[Run, Request, Actor], Intervention | None] | None = None


@dataclass(frozen=True)
class FleetContract:
    """A contract over a scope of the fleet rather than one run (hold_intake, release_intake,
    standing_freeze, standing_restore): no state edge of a run, but every other piece a run's
    contract has, declared here so the contracts page and tests/interventions/test_registry.py read
    them from one place. Declared as ``FLEET_CONTRACTS`` by the module that implements it.

    ``preview``: its preview service (a pure read with a digest the decision checks); ``issue``: its
    decision service (one transaction with its audit event, answering its receipt); ``audit``: the
    audit action that decision records (a refusal is recorded under it too, outcome ``denied``);
    ``receipt``: the keys its receipt records; ``endpoints``: its API, preview first; ``console``:
    the console page an operator issues it from."""

    kind: str
    spec: Spec
    may_issue: frozenset[str]
    order: int
    preview: Callable[..., Mapping[str, Any]]
    issue: Callable[..., Any]
    audit: str
    receipt: tuple[str, ...]
    endpoints: tuple[str, ...]
    console: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "audit": self.audit,
            "receipt": list(self.receipt),
            "endpoints": list(self.endpoints),
            "console": self.console,
        }


REGISTRY: dict[str, Contract] = {}
FLEET_REGISTRY: dict[str, FleetContract] = {}


def register(contract: Contract) -> Contract:
    if contract.kind in REGISTRY and REGISTRY[contract.kind] is not contract:
        raise ValueError(f"intervention kind {contract.kind!r} is declared twice")
    REGISTRY[contract.kind] = contract
    declare_permission(contract.kind, contract.may_issue)
    return contract


def discover() -> None:
    """Import every module of this app and register the contracts each declares (``CONTRACTS``).
    Importing them also registers their Celery tasks and outbox job kinds (interventions/jobs.py)."""
    import interventions

    for info in pkgutil.walk_packages(interventions.__path__, "interventions."):
        if ".migrations" in info.name or info.name.endswith(".apps"):
            continue
        module = importlib.import_module(info.name)
        for contract in getattr(module, "CONTRACTS", ()):
            register(contract)
        for fleet in getattr(module, "FLEET_CONTRACTS", ()):
            if fleet.kind in FLEET_REGISTRY and FLEET_REGISTRY[fleet.kind] is not fleet:
                raise ValueError(f"fleet contract {fleet.kind!r} is declared twice")
            FLEET_REGISTRY[fleet.kind] = fleet
            declare_permission(fleet.kind, fleet.may_issue)
    ordered = sorted(REGISTRY.values(), key=lambda c: (c.order, c.kind))
    REGISTRY.clear()
    REGISTRY.update((c.kind, c) for c in ordered)
    fleet_ordered = sorted(FLEET_REGISTRY.values(), key=lambda c: (c.order, c.kind))
    FLEET_REGISTRY.clear()
    FLEET_REGISTRY.update((c.kind, c) for c in fleet_ordered)


def get_contract(kind: str) -> Contract:
    if kind not in REGISTRY:
        raise Invalid(
            f"unknown intervention kind {kind!r}; one of {sorted(REGISTRY)}", field="kind"
        )
    return REGISTRY[kind]


def owner_bound(kind: str) -> bool:
    contract = REGISTRY.get(kind)
    return contract is not None and contract.owner_bound
