"""Request bodies of the worker protocol (DESIGN §5). Field names are part of the contract."""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any, Literal
from uuid import UUID

from ninja import Schema as NinjaSchema
from pydantic import Field, field_validator

Name = Field(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9_.:\-]+$")
# Fencing tokens are stored as PostgreSQL bigint: a larger number is bad input (422), not a 500 from
# the database ("bigint out of range") when a refused declaration is recorded with it.
MAX_FENCING_TOKEN = 2**63 - 1


def _storable(value: Any) -> None:
    """PostgreSQL refuses NUL characters in text and jsonb, and jsonb refuses NaN/Infinity: such input
    would fail at INSERT time as a 500, so it is refused here as a 422 naming the field."""
    if isinstance(value, str):
        if "\x00" in value:
            raise ValueError("must not contain NUL (\\u0000) characters")
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError("numbers must be finite")
    elif isinstance(value, dict):
        for key, item in value.items():
            _storable(key)
            _storable(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _storable(item)


class Schema(NinjaSchema):
    """Every request body and query of the API: values the database can store, or a 422."""

    @field_validator("*", mode="after")
    @classmethod
    def _storable_in_postgres(cls, value: Any) -> Any:
        _storable(value)
        return value


class GrantRequest(Schema):
    scope: str = Field(
        min_length=3, max_length=200, pattern=r"^[A-Za-z0-9_.\-]+:([A-Za-z0-9_.\-]+|\*)$"
    )
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
    fencing_token: int = Field(ge=0, le=MAX_FENCING_TOKEN)
    wait_s: float = Field(default=0, ge=0, le=60)


class ReleaseIn(Schema):
    fencing_token: int = Field(ge=0, le=MAX_FENCING_TOKEN)
    reason: str = Field(default="", max_length=500)


class CompensationSpec(Schema):
    tool: str = Field(min_length=1, max_length=100)
    action: str = Field(min_length=1, max_length=100)
    args: dict[str, Any] = {}


class EffectIn(Schema):
    fencing_token: int = Field(ge=0, le=MAX_FENCING_TOKEN)
    step: str = Field(min_length=1, max_length=100)
    tool: str = Field(min_length=1, max_length=100)
    action: str = Field(min_length=1, max_length=100)
    idempotency_key: str = Field(min_length=1, max_length=200)
    args: dict[str, Any] = {}
    compensation: CompensationSpec | None = None
    irreversible: bool = False
    approval_id: UUID | None = None


class OutcomeIn(Schema):
    fencing_token: int | None = Field(default=None, ge=0, le=MAX_FENCING_TOKEN)
    status: Literal["committed", "failed", "unknown"]
    external_ref: str = Field(default="", max_length=200)
    detail: dict[str, Any] = {}


class CheckpointIn(Schema):
    fencing_token: int = Field(ge=0, le=MAX_FENCING_TOKEN)
    step: str = Field(min_length=1, max_length=100)
    state: dict[str, Any] = {}


class EventIn(Schema):
    kind: str = Field(min_length=1, max_length=50)
    data: dict[str, Any] = {}


class EventsIn(Schema):
    fencing_token: int = Field(ge=0, le=MAX_FENCING_TOKEN)
    events: list[EventIn] = Field(min_length=1, max_length=200)


class ApprovalIn(Schema):
    fencing_token: int = Field(ge=0, le=MAX_FENCING_TOKEN)
    tool: str = Field(min_length=1, max_length=100)
    action: str = Field(min_length=1, max_length=100)
    args: dict[str, Any] = {}
    reason: str = Field(default="", max_length=2000)
    deadline_s: int | None = Field(default=None, ge=1, le=7 * 24 * 3600)
    required_role: Literal["approver", "incident_commander", "admin"] = "approver"


class FinishIn(Schema):
    fencing_token: int = Field(ge=0, le=MAX_FENCING_TOKEN)
    outcome: Literal["succeeded", "failed"]
    failure_class: str = Field(default="", max_length=100)
    error: str = Field(default="", max_length=5000)
