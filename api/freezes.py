"""Standing capability freezes over a scope of the fleet: preview, set, list, read, preview restore,
restore (interventions/fleet/freezes.py). Every refusal is a 4xx naming the field."""

from __future__ import annotations

from typing import Any, Literal
from uuid import UUID

from django.http import HttpRequest
from ninja import Router
from ninja.responses import Status
from pydantic import Field

from api.auth import caller
from api.responses import ERRORS_READ, ERRORS_WRITE, JSON, Out
from api.schemas import Schema
from core.errors import Forbidden
from core.roles import may
from interventions.fleet import freezes as service
from runs.freezes import freeze_dict

router = Router(tags=["standing freezes"])

CAPABILITY = r"^[A-Za-z0-9_.\-]+:([A-Za-z0-9_.\-]+|\*)$"


class FreezeIn(Schema):
    capability: str = Field(min_length=3, max_length=200, pattern=CAPABILITY)  # tool:action, tool:*
    over: Literal["everything", "agent", "filter"]
    agent: str = Field(default="", max_length=100)  # over=agent
    filter: str = Field(default="", max_length=4000)  # over=filter: agent=…&owner=…&q=…&touched=…
    # The team whose runs it covers: one of the caller's (empty: their only team); "*": every
    # team's, for cross_team people only (docs/operator/teams.md).
    team: str = Field(default="", max_length=50, pattern=r"^([A-Za-z0-9_\-]*|\*)$")


class FreezeSetIn(FreezeIn):
    reason: str = Field(min_length=1, max_length=2000)
    digest: str = Field(default="", max_length=64)  # the preview's: a changed fleet is refused


class RestoreIn(Schema):
    reason: str = Field(min_length=1, max_length=2000)
    digest: str = Field(default="", max_length=64)


class FreezeOut(Out):
    id: str
    capability: str
    over: str
    agent: str | None
    filter: str | None
    scope: str
    team: str
    reason: str
    frozen_by: str
    frozen_at: str
    live: bool
    lifted_at: str | None
    lifted_by: str | None
    covers_now: int | None = None


class FreezePreviewOut(Out):
    capability: str
    over: str
    scope: str
    team: str
    covers_now: int
    covers_by_state: JSON
    runs: list[JSON]
    new_declarations: str
    per_run_freezes: str
    in_flight: JSON
    blocked_by: list[str]
    digest: str


class RestorePreviewOut(Out):
    freeze: FreezeOut
    capability: str
    scope: str
    covers_now: int
    covers_by_state: JSON
    new_declarations: str
    per_run_freezes: str
    blocked_by: list[str]
    digest: str


class FreezeReceiptOut(Out):
    freeze: FreezeOut
    by: str
    covers_now: int
    new_declarations: str
    in_flight: JSON


class FreezeListOut(Out):
    freezes: list[FreezeOut]


def _viewer(request: HttpRequest) -> Any:
    actor = caller(request)
    if actor.is_worker or not may(actor.roles, "view"):
        raise Forbidden("no role grants viewing freezes")
    return actor


@router.post("/fleet/freezes/preview", response={200: FreezePreviewOut, **ERRORS_WRITE})
def preview(request: HttpRequest, body: FreezeIn) -> Any:
    return service.preview_freeze(
        actor=caller(request),
        capability=body.capability,
        over=body.over,
        agent=body.agent,
        filter_text=body.filter,
        team=body.team,
    )


@router.post("/fleet/freezes", response={201: FreezeReceiptOut, **ERRORS_WRITE})
def set_freeze(request: HttpRequest, body: FreezeSetIn) -> Any:
    _, receipt = service.set_freeze(
        actor=caller(request),
        capability=body.capability,
        over=body.over,
        reason=body.reason,
        agent=body.agent,
        filter_text=body.filter,
        digest=body.digest,
        team=body.team,
    )
    return Status(201, receipt)


@router.get("/fleet/freezes", response={200: FreezeListOut, **ERRORS_READ})
def list_freezes(request: HttpRequest, live: bool = False) -> Any:
    actor = _viewer(request)
    return {"freezes": [freeze_dict(f) for f in service.freezes(actor, live_only=live)]}


@router.get("/fleet/freezes/{freeze_id}", response={200: FreezeOut, **ERRORS_READ})
def get_freeze(request: HttpRequest, freeze_id: UUID) -> Any:
    freeze = service.get_freeze(freeze_id, _viewer(request))
    return freeze_dict(freeze) | {"covers_now": service.run_count(freeze) if freeze.live else 0}


@router.post(
    "/fleet/freezes/{freeze_id}/restore/preview",
    response={200: RestorePreviewOut, **ERRORS_WRITE},
)
def preview_restore(request: HttpRequest, freeze_id: UUID) -> Any:
    return service.preview_restore(actor=caller(request), freeze_id=freeze_id)


@router.post("/fleet/freezes/{freeze_id}/restore", response={200: FreezeReceiptOut, **ERRORS_WRITE})
def restore(request: HttpRequest, freeze_id: UUID, body: RestoreIn) -> Any:
    _, receipt = service.restore_freeze(
        actor=caller(request), freeze_id=freeze_id, reason=body.reason, digest=body.digest
    )
    return receipt
