"""Intake holds: preview, hold, see the held queue with its age, release (interventions/intake.py)."""

from __future__ import annotations

from typing import Any, Literal
from uuid import UUID

from django.http import HttpRequest
from ninja import Router
from ninja.responses import Status
from pydantic import ConfigDict, Field

from api.auth import caller
from api.responses import ERRORS_READ, ERRORS_WRITE, JSON, Out
from api.schemas import Schema
from core.errors import Forbidden
from core.roles import may
from interventions.intake import (
    hold_dict,
    hold_intake,
    hold_preview,
    intake_state,
    release_intake,
    release_preview,
)

router = Router(tags=["intake"])

Target = Field(default="", max_length=100, pattern=r"^[A-Za-z0-9_.\-]*$")


class HoldScopeIn(Schema):
    model_config = ConfigDict(extra="forbid")
    scope: Literal["agent", "tool", "all"]
    target: str = Target  # the agent's or tool's name; empty for "all"
    # The team whose runs it holds: one of the caller's (empty: their only team); "*": every team's,
    # for cross_team people only (docs/operator/teams.md).
    team: str = Field(default="", max_length=50, pattern=r"^([A-Za-z0-9_\-]*|\*)$")


class HoldIn(HoldScopeIn):
    reason: str = Field(min_length=1, max_length=2000)
    preview_digest: str = Field(default="", max_length=64)


class ReleaseIn(Schema):
    model_config = ConfigDict(extra="forbid")
    reason: str = Field(min_length=1, max_length=2000)
    preview_digest: str = Field(default="", max_length=64)


class HoldOut(Out):
    id: str
    scope: str
    target: str
    covers: str
    team: str
    reason: str
    held_by: str
    held_at: str
    live: bool
    released_at: str | None
    released_by: str
    receipt: JSON
    queued: JSON | None = None


class IntakeOut(Out):
    holds: list[HoldOut]
    queued: JSON  # every held queued run, oldest first, with its age
    released: list[HoldOut]


class HoldPreviewOut(Out):
    """What holding intake over a scope would do: the runs it would hold, and what it leaves alone."""

    kind: str
    scope: str
    target: str
    team: str
    covers: str
    new_runs: str
    queued: JSON
    started_runs: int
    continues: str
    blocked_by: list[str]
    digest: str


class ReleasePreviewOut(Out):
    """What releasing a hold would make claimable, and what other holds still keep held."""

    kind: str
    hold: str
    covers: str
    team: str
    held_by: str
    held_at: str
    held_reason: str
    queued: JSON
    becomes_claimable: str
    still_held: list[str]
    other_holds: list[str]
    blocked_by: list[str]
    digest: str


def _viewer(request: HttpRequest) -> Any:
    actor = caller(request)
    if actor.is_worker or not may(actor.roles, "view"):
        raise Forbidden("no role grants viewing intake")
    return actor


@router.get("/intake", response={200: IntakeOut, **ERRORS_READ})
def state(request: HttpRequest) -> Any:
    return intake_state(_viewer(request))


@router.post("/intake/holds/preview", response={200: HoldPreviewOut, **ERRORS_WRITE})
def preview_hold(request: HttpRequest, body: HoldScopeIn) -> Any:
    return hold_preview(actor=caller(request), scope=body.scope, target=body.target, team=body.team)


@router.post("/intake/holds", response={202: HoldOut, **ERRORS_WRITE})
def hold(request: HttpRequest, body: HoldIn) -> Any:
    actor = caller(request)
    made = hold_intake(
        actor=actor,
        scope=body.scope,
        target=body.target,
        reason=body.reason,
        seen_digest=body.preview_digest or None,
        team=body.team,
    )
    return Status(202, hold_dict(made, actor=actor))


@router.post(
    "/intake/holds/{hold_id}/release/preview", response={200: ReleasePreviewOut, **ERRORS_WRITE}
)
def preview_release(request: HttpRequest, hold_id: UUID) -> Any:
    return release_preview(actor=caller(request), hold_id=hold_id)


@router.post("/intake/holds/{hold_id}/release", response={200: HoldOut, **ERRORS_WRITE})
def release(request: HttpRequest, hold_id: UUID, body: ReleaseIn) -> Any:
    actor = caller(request)
    done = release_intake(
        actor=actor,
        hold_id=hold_id,
        reason=body.reason,
        seen_digest=body.preview_digest or None,
    )
    return hold_dict(done, actor=actor)
