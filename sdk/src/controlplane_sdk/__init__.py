"""controlplane SDK: the worker side of the control plane's protocol (docs/concepts/worker-protocol.md).

Import as ``controlplane_sdk``. Main entry points:

* :class:`Client` — one typed method per ``/api/v1`` call, bearer auth, error mapping, retries of
  idempotent calls.
* :class:`Worker` / :class:`RunContext` — claim a run, heartbeat in the background, honour directives
  at step boundaries, ``effect(...)`` context manager, checkpoints, assumptions, timers, approvals.
* :func:`run_agent_loop` — the main loop of an agent worker process.
"""

from .aio import AsyncClient
from .client import API_PREFIX, Client
from .effects import EffectScope
from .errors import (
    ApiError,
    CancelRequested,
    ClaimRefused,
    Conflict,
    ControlPlaneError,
    DirectiveInterrupt,
    EffectAlreadyFailed,
    EffectDenied,
    EffectsUnresolved,
    EffectUnresolved,
    Forbidden,
    IdempotencyKeyReused,
    InvalidRequest,
    LeaseHeld,
    LeaseLost,
    NotClaimable,
    NotFound,
    OutcomeNotRecorded,
    PauseRequested,
    ServerUnreachable,
    StopRequested,
    Unauthorized,
)
from .loop import RunSummary, classify_failure, run_agent_loop, run_one
from .models import (
    Approval,
    Attempt,
    Checkpoint,
    Claim,
    Directive,
    EffectDecision,
    EffectStatus,
    Event,
    HeartbeatReply,
    Lease,
)
from .runtime import RunContext, Worker

__version__ = "0.2.0"

__all__ = [
    "API_PREFIX",
    "Client",
    "AsyncClient",
    "Worker",
    "RunContext",
    "EffectScope",
    "run_agent_loop",
    "run_one",
    "RunSummary",
    "classify_failure",
    "Approval",
    "Attempt",
    "Checkpoint",
    "Claim",
    "Directive",
    "EffectDecision",
    "EffectStatus",
    "Event",
    "HeartbeatReply",
    "Lease",
    "ControlPlaneError",
    "ServerUnreachable",
    "ApiError",
    "Unauthorized",
    "Forbidden",
    "NotFound",
    "Conflict",
    "InvalidRequest",
    "LeaseLost",
    "ClaimRefused",
    "LeaseHeld",
    "NotClaimable",
    "EffectDenied",
    "EffectUnresolved",
    "EffectAlreadyFailed",
    "EffectsUnresolved",
    "IdempotencyKeyReused",
    "OutcomeNotRecorded",
    "DirectiveInterrupt",
    "PauseRequested",
    "CancelRequested",
    "StopRequested",
]
