"""Fleet operations: preview across a filter, start in waves, follow, halt (interventions/fleet/operations.py)."""

from __future__ import annotations

from typing import Any, Literal
from uuid import UUID

from django.http import HttpRequest
from ninja import Router
from ninja.responses import Status
from pydantic import Field, StrictBool, StrictFloat, StrictInt

from api.auth import caller
from api.responses import ERRORS_READ, ERRORS_WRITE, JSON, Out
from api.schemas import Schema, StrictOptions
from core.actors import Actor
from core.errors import Forbidden, NotFound
from core.roles import may
from interventions.fleet.operations import (
    MAX_PAUSE_S,
    MAX_WAVE_SIZE,
    FleetParams,
    cancel_fleet_operation,
    confirm_fleet_operation,
    halt_fleet_operation,
    preview_fleet_operation,
    start_fleet_operation,
)
from interventions.fleet.selectors import operation_dict, recent_operations
from interventions.models import FleetOperation
from interventions.selectors import operation_by_id

router = Router(tags=["fleet operations"])

# freeze_capability / restore_capability still parse, to be refused by name (422 on "kind", naming
# the standing freeze: interventions/fleet/selection.py RETIRED_KINDS; docs/operator/fleet.md).
FleetKind = Literal[
    "pause", "resume", "cancel", "freeze_capability", "restore_capability", "take_command"
]


class FleetOptions(StrictOptions):
    scope: str | None = Field(
        default=None,
        min_length=3,
        max_length=200,
        pattern=r"^[A-Za-z0-9_.\-]+:([A-Za-z0-9_.\-]+|\*)$",
    )  # the retired freeze_capability / restore_capability kinds': still parsed, never used
    suspend_authority: StrictBool = False  # pause


class FleetIn(Schema):
    kind: FleetKind
    # The run list's query string: state=running&state=paused&agent=purchasing&id=<uuid>...
    filter: str = Field(min_length=1, max_length=40_000)
    options: FleetOptions = Field(default_factory=FleetOptions)
    wave_size: StrictInt = Field(default=10, ge=1, le=MAX_WAVE_SIZE)
    pause_s: StrictInt = Field(default=0, ge=0, le=MAX_PAUSE_S)
    max_failures: StrictInt | None = Field(default=None, ge=0, le=100_000)
    max_failure_pct: StrictInt | StrictFloat | None = Field(
        default=None, ge=0, le=100, allow_inf_nan=False
    )
    override_reason: str = Field(default="", max_length=2000)


class FleetStartIn(FleetIn):
    reason: str = Field(min_length=1, max_length=2000)
    digest: str = Field(default="", max_length=64)  # the preview's: a changed selection is refused
    # Record it "previewed" (its runs fixed, nothing issued) until POST /fleet/{id}/confirm.
    hold: StrictBool = False


class HaltIn(Schema):
    reason: str = Field(min_length=1, max_length=2000)


class FleetPreviewOut(Out):
    kind: str
    contract: str
    filter: str
    matched: int
    will_act_on: int
    excluded: int
    excluded_runs: list[JSON]
    runs: list[JSON]
    in_flight: JSON
    waves: int
    wave_size: int
    pause_s: int
    max_failures: int
    digest: str


class FleetTargetOut(Out):
    run_id: str
    position: int
    wave: int
    status: str
    intervention_id: str | None
    error: str
    detail: str


class FleetOperationOut(Out):
    id: str
    kind: str
    state: str
    filter: str
    reason: str
    options: JSON
    total: int
    succeeded: int
    failed: int
    skipped: int
    pending: int
    max_failures: int
    waves: int
    current_wave: int
    wave_size: int
    pause_s: int
    next_wave_at: str | None
    halted_reason: str
    halted_automatically: bool
    created_by: str
    created_at: str
    finished_at: str | None
    wave_progress: list[JSON]
    targets: list[FleetTargetOut] = []


class FleetListOut(Out):
    operations: list[FleetOperationOut]


def _operator(request: HttpRequest) -> Actor:
    actor: Actor = caller(request)
    if actor.is_worker:
        raise Forbidden("a worker token can never run a fleet operation")
    if not may(actor.roles, "view"):
        raise Forbidden("no role grants viewing runs")
    return actor


def _params(body: FleetIn) -> FleetParams:
    return FleetParams(
        options=body.options.model_dump(mode="json", exclude_unset=True),
        wave_size=body.wave_size,
        pause_s=body.pause_s,
        max_failures=body.max_failures,
        max_failure_pct=body.max_failure_pct,
        override_reason=body.override_reason,
    )


@router.post("/fleet/preview", response={200: FleetPreviewOut, **ERRORS_WRITE})
def preview(request: HttpRequest, body: FleetIn) -> Any:
    actor = _operator(request)
    return preview_fleet_operation(
        actor=actor, kind=body.kind, run_filter=body.filter, params=_params(body)
    )


@router.post("/fleet", response={202: FleetOperationOut, **ERRORS_WRITE})
def start(request: HttpRequest, body: FleetStartIn) -> Any:
    actor = caller(request)  # a worker is refused inside the service, so the refusal is audited
    op = start_fleet_operation(
        actor=actor,
        kind=body.kind,
        run_filter=body.filter,
        reason=body.reason,
        params=_params(body),
        digest=body.digest,
        hold=body.hold,
    )
    return Status(202, operation_dict(op))


@router.get("/fleet", response={200: FleetListOut, **ERRORS_READ})
def list_operations(request: HttpRequest) -> Any:
    actor = _operator(request)
    ops = recent_operations(actor=actor)
    return {"operations": [operation_dict(op, targets=False) for op in ops]}


def _get(operation_id: UUID, actor: Actor) -> FleetOperation:
    op = operation_by_id(operation_id, actor)
    if op is None:  # or another team's: as absent
        raise NotFound(f"fleet operation {operation_id} does not exist", object="fleet_operation")
    return op


@router.get("/fleet/{operation_id}", response={200: FleetOperationOut, **ERRORS_READ})
def get_operation(request: HttpRequest, operation_id: UUID) -> Any:
    return operation_dict(_get(operation_id, _operator(request)))


@router.post("/fleet/{operation_id}/halt", response={200: FleetOperationOut, **ERRORS_WRITE})
def halt(request: HttpRequest, operation_id: UUID, body: HaltIn) -> Any:
    actor = caller(request)
    op = halt_fleet_operation(actor=actor, operation_id=operation_id, reason=body.reason)
    return operation_dict(op)


@router.post("/fleet/{operation_id}/confirm", response={202: FleetOperationOut, **ERRORS_WRITE})
def confirm(request: HttpRequest, operation_id: UUID) -> Any:
    op = confirm_fleet_operation(actor=caller(request), operation_id=operation_id)
    return Status(202, operation_dict(op))


@router.post("/fleet/{operation_id}/cancel", response={200: FleetOperationOut, **ERRORS_WRITE})
def cancel(request: HttpRequest, operation_id: UUID, body: HaltIn) -> Any:
    op = cancel_fleet_operation(
        actor=caller(request), operation_id=operation_id, reason=body.reason
    )
    return operation_dict(op)
