"""Request bodies of the worker protocol (DESIGN §5). Field names are part of the contract."""
from __future__ import annotations

from datetime import datetime
from typing import Any, Literal
from uuid import UUID

from ninja import Schema
from pydantic import Field

Name = Field(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9_.:\-]+$")


class GrantRequest(Schema):
    scope: str = Field(min_length=3, max_length=200, pattern=r"^[A-Za-z0-9_.\-]+:([A-Za-z0-9_.\-]+|\*)$")
    ttl_s: int | None = Field(default=None, ge=1, le=7 * 24 * 3600)


class RunIn(Schema):
    agent: str = Field(min_length=1, max_length=100)
    goal: str = Field(min_length=1, max_length=2000)
    input: dict[str, Any] = {}
    parent_run_id: UUID | None = None
    versions: dict[str, Any] = {}
    authority: list[GrantRequest] = Field(default=[], max_length=50)
    deadline: datetime | None = None
    retry_policy: dict[str, Any] = {}


class ClaimIn(Schema):
    worker: str = Field(min_length=1, max_length=150)
    versions: dict[str, Any] = {}


class HeartbeatIn(Schema):
    fencing_token: int = Field(ge=0)
    wait_s: float = Field(default=0, ge=0, le=60)


class ReleaseIn(Schema):
    fencing_token: int = Field(ge=0)
    reason: str = Field(default="", max_length=500)


class CompensationSpec(Schema):
    tool: str = Field(min_length=1, max_length=100)
    action: str = Field(min_length=1, max_length=100)
    args: dict[str, Any] = {}


class EffectIn(Schema):
    fencing_token: int = Field(ge=0)
    step: str = Field(min_length=1, max_length=100)
    tool: str = Field(min_length=1, max_length=100)
    action: str = Field(min_length=1, max_length=100)
    idempotency_key: str = Field(min_length=1, max_length=200)
    args: dict[str, Any] = {}
    compensation: CompensationSpec | None = None
    irreversible: bool = False
    approval_id: UUID | None = None


class OutcomeIn(Schema):
    fencing_token: int | None = Field(default=None, ge=0)
    status: Literal["committed", "failed", "unknown"]
    external_ref: str = Field(default="", max_length=200)
    detail: dict[str, Any] = {}


class CheckpointIn(Schema):
    fencing_token: int = Field(ge=0)
    step: str = Field(min_length=1, max_length=100)
    state: dict[str, Any] = {}


class EventIn(Schema):
    kind: str = Field(min_length=1, max_length=50)
    data: dict[str, Any] = {}


class EventsIn(Schema):
    fencing_token: int = Field(ge=0)
    events: list[EventIn] = Field(min_length=1, max_length=200)


class ApprovalIn(Schema):
    fencing_token: int = Field(ge=0)
    tool: str = Field(min_length=1, max_length=100)
    action: str = Field(min_length=1, max_length=100)
    args: dict[str, Any] = {}
    reason: str = Field(default="", max_length=2000)
    deadline_s: int | None = Field(default=None, ge=1, le=7 * 24 * 3600)
    required_role: Literal["approver", "incident_commander", "admin"] = "approver"


class FinishIn(Schema):
    fencing_token: int = Field(ge=0)
    outcome: Literal["succeeded", "failed"]
    failure_class: str = Field(default="", max_length=100)
    error: str = Field(default="", max_length=5000)
