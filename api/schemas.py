"""Request bodies of the worker protocol (docs/concepts/worker-protocol.md). Field names are part of the contract."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal
from uuid import UUID

from ninja import Schema as NinjaSchema
from pydantic import (
    AfterValidator,
    AwareDatetime,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    field_validator,
)
from pydantic_core import PydanticCustomError

from core.limits import MAX_INT, json_problem
from core.names import name_problem, scope_problem
from core.window import datetime_problem

Name = Field(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9_.:\-]+$")
# Fencing tokens are stored as PostgreSQL bigint: a larger number is bad input (422), not a 500 from
# the database ("bigint out of range") when a refused declaration is recorded with it.
MAX_FENCING_TOKEN = MAX_INT
INSIDE_FIELD = "inside_field"  # a refused value inside a JSON document (api.app names its path)


class Schema(NinjaSchema):
    """Every request body and query of the API: values the database can store and a page can render
    (core.limits), or a 422 naming the field -- and, inside a JSON document, the path in it."""

    @field_validator("*", mode="after")
    @classmethod
    def _storable_in_postgres(cls, value: Any) -> Any:
        problem = json_problem(value)
        if problem:
            where, why = problem
            # api.app appends ctx.path to the field's name: the 422 names events.0.data.fire_at.
            raise PydanticCustomError(INSIDE_FIELD, "{path}: {why}", {"path": where, "why": why})
        return value


class StrictOptions(Schema):
    """Nested options: every key known, every value of its exact type (no "3" for 3, no "never")."""

    model_config = ConfigDict(extra="forbid", strict=True)


def _sane_datetime(value: datetime) -> datetime:
    if why := datetime_problem(value):
        raise ValueError(why)
    return value


def _canonical_name(value: str) -> str:
    if why := name_problem(value):
        raise ValueError(why)
    return value


def _canonical_scope(value: str) -> str:
    if why := scope_problem(value):
        raise ValueError(why)
    return value


# Tool and action names in their one canonical form (core.names): no look-alike reaches a policy.
ToolName = Annotated[str, Field(min_length=1, max_length=100), AfterValidator(_canonical_name)]
Scope = Annotated[str, Field(min_length=3, max_length=200), AfterValidator(_canonical_scope)]

# tz-aware and inside core.limits' window: psycopg must be able to read back what PostgreSQL stores.
SaneDatetime = Annotated[AwareDatetime, AfterValidator(_sane_datetime)]


class RetryPolicy(StrictOptions):
    """A run's retry policy (interventions.retry.DEFAULT_POLICY holds the defaults)."""

    max_attempts: StrictInt = Field(default=3, ge=1, le=100)
    backoff_s: StrictInt | StrictFloat = Field(default=2, ge=0, le=86_400, allow_inf_nan=False)
    backoff_factor: StrictInt | StrictFloat = Field(default=2, ge=1, le=10, allow_inf_nan=False)
    max_backoff_s: StrictInt | StrictFloat = Field(
        default=300, ge=0, le=86_400, allow_inf_nan=False
    )
    retryable: list[Annotated[str, Field(min_length=1, max_length=100)]] = Field(
        default=[], max_length=50
    )
    non_retryable: list[Annotated[str, Field(min_length=1, max_length=100)]] = Field(
        default=[], max_length=50
    )


class GrantRequest(Schema):
    scope: Scope
    ttl_s: int | None = Field(default=None, ge=1, le=7 * 24 * 3600)


class RunIn(Schema):
    agent: str = Field(min_length=1, max_length=100)
    goal: str = Field(min_length=1, max_length=2000)
    input: dict[str, Any] = {}
    parent_run_id: UUID | None = None
    versions: dict[str, Any] = {}
    authority: list[GrantRequest] = Field(default=[], max_length=50)
    deadline: SaneDatetime | None = None
    retry_policy: RetryPolicy = Field(default_factory=RetryPolicy)


class ClaimIn(Schema):
    worker: str = Field(min_length=1, max_length=150)
    versions: dict[str, Any] = {}


class HeartbeatIn(Schema):
    fencing_token: StrictInt = Field(ge=0, le=MAX_FENCING_TOKEN)
    wait_s: float = Field(default=0, ge=0, le=60)


class ReleaseIn(Schema):
    fencing_token: StrictInt = Field(ge=0, le=MAX_FENCING_TOKEN)
    reason: str = Field(default="", max_length=500)


class CompensationSpec(Schema):
    tool: ToolName
    action: ToolName
    args: dict[str, Any] = {}


class EffectIn(Schema):
    fencing_token: StrictInt = Field(ge=0, le=MAX_FENCING_TOKEN)
    step: str = Field(min_length=1, max_length=100)
    tool: ToolName
    action: ToolName
    idempotency_key: str = Field(min_length=1, max_length=200)
    args: dict[str, Any] = {}
    compensation: CompensationSpec | None = None
    irreversible: bool = False
    approval_id: UUID | None = None


class StepCheckpointIn(Schema):
    """The step's checkpoint, carried by its last effect's outcome (written in the same transaction)."""

    step: str = Field(min_length=1, max_length=100)
    state: dict[str, Any] = {}


class OutcomeIn(Schema):
    fencing_token: StrictInt | None = Field(default=None, ge=0, le=MAX_FENCING_TOKEN)
    status: Literal["committed", "failed", "unknown"]
    external_ref: str = Field(default="", max_length=200)
    detail: dict[str, Any] = {}
    # Optional, to save round trips (an older server ignores them; a client sees that their answers
    # are missing and makes the separate calls): the step's checkpoint, written with the outcome in
    # one transaction (needs ``fencing_token``), and the next effect's declaration on the same run,
    # decided right after the outcome committed, exactly as POST /runs/{id}/effects would.
    checkpoint: StepCheckpointIn | None = None
    next: EffectIn | None = None


class CheckpointIn(Schema):
    fencing_token: StrictInt = Field(ge=0, le=MAX_FENCING_TOKEN)
    step: str = Field(min_length=1, max_length=100)
    state: dict[str, Any] = {}


class EventIn(Schema):
    kind: str = Field(min_length=1, max_length=50)
    data: dict[str, Any] = {}


class EventsIn(Schema):
    fencing_token: StrictInt = Field(ge=0, le=MAX_FENCING_TOKEN)
    events: list[EventIn] = Field(min_length=1, max_length=200)


class ApprovalIn(Schema):
    fencing_token: StrictInt = Field(ge=0, le=MAX_FENCING_TOKEN)
    tool: ToolName
    action: ToolName
    args: dict[str, Any] = {}
    reason: str = Field(default="", max_length=2000)
    deadline_s: int | None = Field(default=None, ge=1, le=7 * 24 * 3600)
    required_role: Literal["approver", "incident_commander", "admin"] = "approver"


class FinishIn(Schema):
    fencing_token: StrictInt = Field(ge=0, le=MAX_FENCING_TOKEN)
    outcome: Literal["succeeded", "failed"]
    failure_class: str = Field(default="", max_length=100)
    error: str = Field(default="", max_length=5000)


Text150 = Annotated[str, Field(min_length=1, max_length=150)]
Text64 = Annotated[str, Field(min_length=1, max_length=64)]


class CompensationOptions(StrictOptions):
    """Bounds as interventions.compensate.OPTION_BOUNDS."""

    max_attempts: StrictInt = Field(default=3, ge=1, le=10)
    backoff_s: StrictInt | StrictFloat = Field(default=1.0, ge=0, le=300, allow_inf_nan=False)
    claim_ttl_s: StrictInt = Field(default=60, ge=1, le=3600)


def _as_uuid(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return UUID(value)
        except ValueError:
            raise ValueError("must be a UUID") from None
    return value


class InterventionOptions(CompensationOptions):
    """Every option any intervention reads; each contract checks which of them it needs."""

    suspend_authority: StrictBool = False  # pause
    reobserve_assumptions: StrictBool = False  # resume
    checkpoint_seq: StrictInt | None = Field(default=None, ge=0, le=MAX_INT)  # retry, redrive
    # redrive: the effects committed after the checkpoint to compensate before the new attempt
    compensate_first: list[UUID] = Field(default=[], max_length=500)
    to: Text150 | None = None  # transfer: a username
    # transfer: which facets (assignment, decision_authority, execution_lease) the contract checks
    facets: list[Annotated[str, Field(max_length=50)]] = Field(default=[], max_length=10)
    to_worker: Text150 | None = None  # transfer
    approval_id: UUID | None = None  # approve, reject
    # approve, reject: the action digest the decider was shown; another one is refused (409)
    digest: Annotated[str, Field(min_length=64, max_length=64, pattern="^[0-9a-f]{64}$")] | None = (
        None
    )
    grant_id: UUID | None = None  # revoke/suspend/restore authority
    scope: Scope | None = None
    prefer: Literal["redrive", "compensate", "escalate"] | None = None  # recover
    compensation: CompensationOptions | None = None  # recover with prefer=compensate

    # UUIDs arrive as JSON strings: strict mode would refuse every one of them.
    @field_validator("compensate_first", mode="before")
    @classmethod
    def _uuids_from_text(cls, value: Any) -> Any:
        if isinstance(value, list):
            return [_as_uuid(v) for v in value]
        return value

    @field_validator("approval_id", "grant_id", mode="before")
    @classmethod
    def _uuid_from_text(cls, value: Any) -> Any:
        return _as_uuid(value)

    def as_dict(self) -> dict[str, Any]:
        """Only what the caller sent (the contracts apply their own defaults), as JSON values."""
        return self.model_dump(mode="json", exclude_unset=True)


class InterventionIn(Schema):
    kind: str = Field(min_length=1, max_length=30)
    reason: str = Field(default="", max_length=2000)
    scope: Literal["run", "tree"] = "run"
    options: InterventionOptions = Field(default_factory=InterventionOptions)
    override_reason: str = Field(default="", max_length=2000)
    # The digest of the preview the caller confirms (POST .../interventions/preview answers it). If
    # given and the run has moved on since, the intervention is refused: 409 preview_stale.
    preview_digest: str | None = Field(default=None, min_length=1, max_length=64)
    # The preview's ``sections`` as the caller had them: a stale confirm's 409 then names what moved
    # (``changed``: each section, with what it was and is when it is a plain value).
    preview_sections: dict[str, Text64] | None = Field(default=None, max_length=60)


class ReconcileIn(Schema):
    outcome: Literal["committed", "failed"]
    evidence: str = Field(min_length=1, max_length=5000)
    external_ref: str = Field(default="", max_length=200)
    reason: str = Field(min_length=1, max_length=2000)
    # Like the reconcile intervention: someone other than the run's decision authority needs an
    # override with a reason (and a role that may override).
    override_reason: str = Field(default="", max_length=2000)


class RunListQuery(Schema):
    """``GET /runs``: runs/search.py's RunFilter (the console's run list reads the same parameters;
    ``agent``, ``touched`` and ``state`` may repeat), then a keyset page of ``limit`` runs."""

    q: str | None = Field(default=None, max_length=200, description="id prefix, goal text or agent")
    id: str | None = Field(default=None, max_length=36, description="a run id or its prefix")
    agent: str | None = Field(default=None, max_length=100)
    touched: str | None = Field(default=None, max_length=201, description="tool or tool:action")
    owner: str | None = Field(default=None, max_length=150, description="assignee or decider")
    state: str | None = Field(default=None, max_length=300, description="comma-separated states")
    attention: str | None = Field(default=None, max_length=5, description="1: needs attention")
    since: str | None = Field(default=None, max_length=40, description="created since: 2h or ISO")
    until: str | None = Field(default=None, max_length=40)
    updated_since: str | None = Field(default=None, max_length=40)
    updated_until: str | None = Field(default=None, max_length=40)
    sort: str | None = Field(default=None, max_length=10, description="created|updated|state|agent")
    after: str | None = Field(default=None, max_length=400, description="next_cursor of a page")
    before: str | None = Field(default=None, max_length=400, description="prev_cursor of a page")
    limit: int = Field(default=50, ge=1, le=500)


class PageIn(Schema):
    """A page of a long list a preview or receipt names only the start of (interventions/paging.py)."""

    after: int = Field(default=0, ge=0, le=1_000_000, description="rows to skip: the link's after")
    limit: int = Field(default=100, ge=1, le=500)


class LedgerFilter(Schema):
    status: str | None = Field(
        default=None, max_length=20, description="in_flight|committed|failed|unknown"
    )


class AuditFilter(Schema):
    """The console's audit filters (audit.selectors.audit_events), plus paging by seq."""

    run_id: str | None = Field(default=None, max_length=36)
    action: str | None = Field(default=None, max_length=60)
    actor: str | None = Field(default=None, max_length=150)
    outcome: str | None = Field(default=None, max_length=10)
    object_type: str | None = Field(default=None, max_length=30)
    component: str | None = Field(default=None, max_length=30)
    after_seq: int = Field(default=0, ge=0, le=MAX_INT)  # seq is a bigint
    limit: int = Field(default=100, ge=1, le=1000)
