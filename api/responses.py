"""Response bodies of /api/v1 (docs/concepts/worker-protocol.md): what each operation answers, per
status, in the OpenAPI document. Field names are part of the contract (add fields freely, rename none).

Every model allows extra fields: the services build these dicts and may add to them before a schema
catches up, and a client must ignore what it does not know. Timestamps stay the ISO 8601 strings the
services render (typed ``str`` so a response is byte-for-byte what the service produced).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

JSON = dict[str, Any]


class Out(BaseModel):
    model_config = ConfigDict(extra="allow")


# --- errors ---------------------------------------------------------------------------------------


class ErrorOut(Out):
    """Every 4xx: a code, a sentence, and the offending field ("" when the request as a whole is
    refused: a missing token, a run that does not exist, a state that forbids it)."""

    error: str
    detail: Any
    field: str = ""


class ValidationErrorOut(ErrorOut):
    """422 from the schemas: ``field`` is the first offending field, ``errors`` all of them."""

    errors: list[JSON] = []


ERRORS_READ = {401: ErrorOut, 403: ErrorOut, 404: ErrorOut, 422: ValidationErrorOut}
ERRORS_WRITE = ERRORS_READ | {400: ErrorOut, 409: ErrorOut, 413: ErrorOut}


# --- runs -----------------------------------------------------------------------------------------


class RunSummaryOut(Out):
    id: str
    agent: str
    goal: str
    state: str
    directive: str
    parent_run_id: str | None
    attempt: int
    fencing_token: int
    assignee: str | None
    decision_authority: str | None
    created_at: str
    state_changed_at: str
    deadline: str | None
    unresolved_effects: int | None


class RunListOut(Out):
    runs: list[RunSummaryOut]
    next_cursor: str | None = None  # pass as ``after`` for the next page; null on the last one
    prev_cursor: str | None = None  # pass as ``before`` for the page before


class ChildOut(Out):
    id: str
    state: str
    agent: str


class AttemptOut(Out):
    id: str
    number: int
    worker: str
    outcome: str
    failure_class: str
    started_at: str
    ended_at: str | None
    started_from: int | None


class LeaseRowOut(Out):
    id: str
    worker: str
    fencing_token: int
    status: str
    expires_at: str
    end_reason: str


class GrantOut(Out):
    id: str
    scope: str
    status: str
    expires_at: str


class CheckpointOut(Out):
    id: int | None = None
    seq: int
    step: str | None
    state: JSON
    hash: str | None = None
    created_at: str | None = None


class ApprovalRowOut(Out):
    id: str
    status: str
    tool: str
    action: str
    digest: str
    deadline: str | None
    required_role: str | None = None
    policy: str | None = None  # the agent's approval policy that required it, if one did
    # multi-party: each step with who approved and how many are still needed (None: one approver)
    progress: JSON | None = None


class RunDetailOut(RunSummaryOut):
    input: JSON
    versions: JSON
    retry_policy: JSON
    allowed_events: list[str]
    children: list[ChildOut]
    attempts: list[AttemptOut]
    leases: list[LeaseRowOut]
    authority: list[GrantOut]
    checkpoint: CheckpointOut | None
    approvals: list[ApprovalRowOut]
    unresolved_effects: int


class HistoryEventOut(Out):
    seq: int
    kind: str
    actor: str
    data: JSON
    created_at: str
    hash: str


class IntegrityOut(Out):
    ok: bool
    checked: int | None = None
    first_broken_seq: int | None = None
    problem: str | None = None


class HistoryOut(Out):
    events: list[HistoryEventOut]
    integrity: IntegrityOut


# --- the worker protocol --------------------------------------------------------------------------


class AttemptRefOut(Out):
    id: str
    number: int


class LeaseOut(Out):
    id: str
    fencing_token: int
    expires_at: str
    ttl_s: float


class ClaimOut(Out):
    run_id: str
    state: str
    attempt: AttemptRefOut
    lease: LeaseOut
    checkpoint: CheckpointOut | None
    directive: str


class WorkOut(Out):
    """``POST /work/claim``: the claim of the run handed to this worker, or null if none came."""

    claim: ClaimOut | None


class HeartbeatApprovalOut(Out):
    """The run's latest approval request, as a heartbeat reports it."""

    id: str
    status: str
    tool: str
    action: str
    digest: str
    decision_reason: str


class HeartbeatOut(Out):
    directive: str
    reason: str
    state: str
    expires_at: str
    lease_status: str
    fencing_token: int
    timers_fired: list[JSON]
    approval: HeartbeatApprovalOut | None


class RunStateOut(Out):
    """Release answers ``run_id``, finish ``id``: both are kept as they always were."""

    state: str
    run_id: str | None = None
    id: str | None = None


class EffectOut(Out):
    id: str
    run_id: str
    attempt_id: str | None
    kind: str
    step: str
    tool: str
    action: str
    idempotency_key: str
    fingerprint: str
    args: JSON
    decision: str
    reason: str | None
    status: str
    compensation: JSON | None
    irreversible: bool
    compensation_status: str | None
    external_ref: str
    outcome_detail: Any
    declared_at: str
    outcome_at: str | None
    late: bool
    stale_lease: bool
    reconciled: bool
    reconciliation: JSON | None
    compensates: str | None
    # a late outcome that contradicts a reconciled status: what was reported, when, by whom
    discrepancy: JSON | None = None


class EffectDeniedOut(ErrorOut):
    """409 on a declaration: the denied effect (``decision`` "denied", ``reason`` why) -- or, when
    the lease itself is gone, the plain error ``lease_lost``."""

    detail: Any = None
    decision: str | None = None
    reason: str | None = None
    freeze: Any = None  # capability_frozen: the freeze, who set it and why


class CheckpointWrittenOut(Out):
    id: int
    seq: int
    step: str
    hash: str


class NextDeclarationOut(EffectOut):
    """The declaration an outcome carried (``next``), as POST /runs/{id}/effects answers it (the
    effect with ``decision``: authorized, replayed or denied); ``http_status`` is that call's status."""

    http_status: int
    error: str | None = None


class NextDeclarationErrorOut(ErrorOut):
    """A carried declaration refused outright (e.g. ``idempotency_key_reused``): the error that
    POST /runs/{id}/effects would have answered, with its ``http_status``."""

    http_status: int


class OutcomeOut(EffectOut):
    """200 on an outcome: the effect. With ``checkpoint`` in the request: the checkpoint written, or
    why it was refused (the outcome is recorded anyway). With ``next``: that declaration's answer."""

    checkpoint: CheckpointWrittenOut | ErrorOut | None = None
    next: NextDeclarationOut | NextDeclarationErrorOut | None = None


class EffectListOut(Out):
    effects: list[EffectOut]


class EventsAppendedOut(Out):
    seqs: list[int]


class ApprovalRequestedOut(Out):
    id: str
    status: str
    digest: str
    deadline: str | None
    progress: JSON | None = None  # multi-party: the steps to pass (see ApprovalRowOut)


# --- run control ----------------------------------------------------------------------------------


class PreviewOut(Out):
    """The headline of every preview; each contract adds its own sections (see /contracts)."""

    kind: str
    run_id: str
    state: str
    allowed: bool
    next_state: str
    scope: str
    digest: str  # send it back as preview_digest to refuse a confirm once the run has moved on
    sections: dict[str, str]  # and these as preview_sections: a refusal then names what moved


class TreeRowOut(Out):
    position: int
    id: str
    agent: str
    parent: str
    state: str


class TreePageOut(Out):
    """Part of a run's delegation tree, breadth first: ``next`` links the following page."""

    run_id: str
    total: int
    children: list[TreeRowOut]
    next: str | None


class CascadePageOut(Out):
    """Part of the children a pause or cancel listed, with what it did to each: ``status`` pending,
    changed or unchanged (``note`` says why); for scope ``run``, the run's children as they are now."""

    intervention: str
    scope: str
    cascade: JSON | None
    total: int
    children: list[JSON]
    next: str | None


class ReceiptOut(Out):
    id: str
    run_id: str
    kind: str
    status: str
    actor: str
    role: str
    reason: str
    scope: str
    options: JSON
    override: bool
    override_reason: str
    preview: JSON
    receipt: JSON
    created_at: str
    completed_at: str | None
    replayed: bool = False  # the original receipt, answered again to the same actor's same request


class ReceiptListOut(Out):
    interventions: list[ReceiptOut]


class ContractsOut(Out):
    contracts: dict[str, JSON]
    fleet_contracts: dict[str, JSON] = {}
    state_machine: list[JSON]
    permissions: dict[str, list[str]]


# --- audit ----------------------------------------------------------------------------------------


class AuditEventOut(Out):
    seq: int  # global reading order, for after_seq
    chain: str  # "run:<id>" or "system" ("legacy": before per-chain audit)
    chain_seq: int  # the position in the chain, which the hash covers
    event_id: str
    created_at: str
    actor_kind: str
    actor: str
    role: str
    on_behalf_of: str
    action: str
    object_type: str
    object_id: str
    run_id: str | None
    reason: str
    outcome: str
    component: str
    source_ip: str | None
    user_agent: str
    request_id: str
    context: JSON
    prev_hash: str
    hash: str


class AuditListOut(Out):
    events: list[AuditEventOut]
    # "all": the whole log (audit_read_all); "runs": only events of runs (everyone else).
    scope: str


class VerifyOut(Out):
    """The answer first ("Intact: …" or "Broken: <the first break, named>"), then the figures, then
    every part's report as ``audit_verify`` prints it."""

    ok: bool
    answer: str
    events: int
    chains: int
    anchored_at: str | None
    anchors_checked: bool
    failures: list[str]
    report: dict[str, Any]
