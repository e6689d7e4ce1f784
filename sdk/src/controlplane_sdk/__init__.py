"""controlplane SDK: the worker side of the control plane's protocol (docs/concepts/worker-protocol.md).

Import as ``controlplane_sdk``. Main entry points:

* :class:`Client` — one typed method per ``/api/v1`` call, bearer auth, error mapping, retries of
  idempotent calls.
* :class:`Worker` / :class:`RunContext` — claim a run, heartbeat in the background, honour directives
  at step boundaries, ``effect(...)`` context manager, checkpoints, assumptions, timers, approvals.
* :func:`run_agent_loop` — the main loop of an agent worker process.
* :class:`AsyncClient`, :class:`AsyncWorker`, :class:`AsyncRunContext`, :func:`arun_one` — the
  same for asyncio agents, natively async (``async with ctx.effect(...)``).
"""

from typing import TYPE_CHECKING, Any

from ._core import PROTOCOL_VERSION
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
    EffectCompensated,
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

if TYPE_CHECKING:
    from .aio import AsyncClient
    from .aio_loop import AsyncWorker, arun_agent_loop, arun_one
    from .aio_runtime import AsyncEffectScope, AsyncRunContext

# The asyncio side loads on first use: a synchronous agent does not pay for importing asyncio.
_ASYNC = {
    "AsyncClient": "aio",
    "AsyncWorker": "aio_loop",
    "AsyncRunContext": "aio_runtime",
    "AsyncEffectScope": "aio_runtime",
    "arun_one": "aio_loop",
    "arun_agent_loop": "aio_loop",
}


def __getattr__(name: str) -> Any:
    if name in _ASYNC:
        import importlib

        return getattr(importlib.import_module(f".{_ASYNC[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__version__ = "0.2.0"

__all__ = [
    "API_PREFIX",
    "PROTOCOL_VERSION",
    "Client",
    "AsyncClient",
    "AsyncWorker",
    "AsyncRunContext",
    "AsyncEffectScope",
    "arun_one",
    "arun_agent_loop",
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
    "EffectCompensated",
    "EffectsUnresolved",
    "IdempotencyKeyReused",
    "OutcomeNotRecorded",
    "DirectiveInterrupt",
    "PauseRequested",
    "CancelRequested",
    "StopRequested",
]
