"""Typed views of the worker-protocol responses (docs/concepts/worker-protocol.md).

These are plain frozen dataclasses; the client builds them from JSON (see ``client.py``, the one
place that knows field names). Each keeps the whole decoded payload in ``raw`` because the server
may add fields freely.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

__all__ = [
    "Directive",
    "EffectStatus",
    "Attempt",
    "Lease",
    "Checkpoint",
    "Claim",
    "HeartbeatReply",
    "EffectDecision",
    "Approval",
    "Event",
]

JSON = dict[str, Any]


class Directive(StrEnum):
    """What the control plane tells a worker to do, on claim and on every heartbeat."""

    CONTINUE = "continue"
    PAUSE = "pause"
    CANCEL = "cancel"
    WAIT = "wait"
    STOP = "stop"


class EffectStatus(StrEnum):
    """Ledger status of an effect."""

    IN_FLIGHT = "in_flight"
    COMMITTED = "committed"
    FAILED = "failed"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class Attempt:
    """One try at executing the run; retries and redrives create new attempts, never reuse one."""

    id: str
    number: int


@dataclass(frozen=True)
class Lease:
    """The execution lease: every write must carry ``fencing_token``; an older token is refused."""

    id: str
    fencing_token: int
    expires_at: str | None = None
    ttl_s: float | None = None


@dataclass(frozen=True)
class Checkpoint:
    """A durable boundary: the attempt starts *after* ``step`` with ``state`` restored."""

    seq: int
    step: str | None
    state: JSON = field(default_factory=dict)


@dataclass(frozen=True)
class Claim:
    """Result of ``POST /runs/{id}/claim``."""

    run_id: str
    attempt: Attempt
    lease: Lease
    checkpoint: Checkpoint | None
    directive: str
    raw: JSON = field(default_factory=dict, repr=False)


@dataclass(frozen=True)
class HeartbeatReply:
    """Result of ``POST /leases/{id}/heartbeat``: the current directive (and why)."""

    directive: str
    reason: str
    expires_at: str | None
    approval: JSON | None = None
    timers_fired: list[JSON] = field(default_factory=list)
    raw: JSON = field(default_factory=dict, repr=False)


@dataclass(frozen=True)
class EffectDecision:
    """Result of declaring an effect (``POST /runs/{id}/effects``).

    ``decision`` is ``authorized`` (dispatch now, then record the outcome) or ``replayed`` (the same
    key and arguments were declared before; ``status`` says what became of it). A ``denied`` decision
    is never returned: it raises :class:`EffectDenied`. ``adopted`` is true when the SDK recovered its
    own declaration whose response was lost in transit (see ``Client.declare_effect``).
    """

    id: str
    decision: str
    status: str
    idempotency_key: str
    external_ref: str | None = None
    outcome_detail: Any = None
    adopted: bool = False
    raw: JSON = field(default_factory=dict, repr=False)

    @property
    def replayed(self) -> bool:
        return self.decision == "replayed"

    @property
    def already_done(self) -> bool:
        """True when the world call already committed: the agent must not call the world again."""
        return self.replayed and self.status == EffectStatus.COMMITTED


@dataclass(frozen=True)
class Approval:
    """A planned human-in-the-loop decision requested by the run."""

    id: str
    # pending | approved | rejected | timed_out | superseded (the run moved on: cancelled, retried,
    # recovered or a new attempt; it can no longer be decided). Server-defined.
    status: str
    reason: str | None = None
    decided_by: str | None = None
    raw: JSON = field(default_factory=dict, repr=False)

    @property
    def approved(self) -> bool:
        return self.status == "approved"

    @property
    def pending(self) -> bool:
        return self.status == "pending"

    def outcome(self) -> str:
        """What happened to the request, in the operator's words (never "rejected" for a timeout)."""
        return {
            "approved": "approved",
            "rejected": f"rejected by {self.decided_by or 'an approver'}",
            "timed_out": "timed out before anyone decided",
            "superseded": "superseded: the run moved on before it was decided",
        }.get(self.status, self.status)


@dataclass(frozen=True)
class Event:
    """One history entry to append (``kind`` such as ``step_started``, ``assumption``, ``timer_set``)."""

    kind: str
    data: JSON = field(default_factory=dict)
