"""Exceptions raised by the SDK.

Every error the server returns is JSON ``{"error": code, "detail": ...}``
(docs/concepts/worker-protocol.md). The client maps the ``error`` code to one of the classes below;
anything it does not recognise becomes a plain :class:`ApiError` carrying the HTTP status, the code and the detail.

Directive interrupts (:class:`PauseRequested`, :class:`CancelRequested`, :class:`StopRequested`) are not
server errors: they are raised by :meth:`RunContext.check_directive` at a step boundary so that agent
code unwinds to the worker loop, which then honours the directive.
"""

from __future__ import annotations

from typing import Any

__all__ = [
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
    "error_from_response",
]


class ControlPlaneError(Exception):
    """Base class of every exception the SDK raises on its own behalf."""


class ServerUnreachable(ControlPlaneError):
    """The control plane could not be reached (connection error or timeout), after any retries.

    The original ``httpx`` exception is available as ``__cause__``. For a non-idempotent call
    (claim, finish, events, approvals, create_run) the SDK did not retry, and the call may or may not
    have reached the server.
    """


class ApiError(ControlPlaneError):
    """The server answered with an error (4xx/5xx).

    Attributes: ``status`` (HTTP status), ``code`` (the ``error`` field), ``detail`` (the ``detail``
    field, if any) and ``payload`` (the whole decoded body, or ``{}``).
    """

    def __init__(
        self, status: int, code: str, detail: Any = None, payload: dict[str, Any] | None = None
    ):
        self.status = status
        self.code = code
        self.detail = detail
        self.payload: dict[str, Any] = payload or {}
        super().__init__(f"{status} {code}" + (f": {detail}" if detail not in (None, "") else ""))


class Unauthorized(ApiError):
    """401: the bearer token is missing, unknown or revoked."""


class Forbidden(ApiError):
    """403: the token is valid but not allowed to do this."""


class NotFound(ApiError):
    """404: no such run, lease, effect or approval."""


class Conflict(ApiError):
    """409 ``conflict``: the transition is not allowed in the run's current state."""


class InvalidRequest(ApiError):
    """422 ``invalid`` (or any other 400/422 the SDK has no finer class for)."""


class LeaseLost(ApiError):
    """409 ``lease_lost``: this worker no longer holds the execution lease (expired, fenced out,
    transferred). Stop executing: any further write with this fencing token is refused."""


class ClaimRefused(ApiError):
    """Base of the two ways a claim is refused; the worker loop simply skips the run."""


class LeaseHeld(ClaimRefused):
    """409 ``lease_held``: another worker holds a live lease on the run."""


class NotClaimable(ClaimRefused):
    """409 ``not_claimable``: the run is not in a state that can be claimed (finished, paused, …)."""


class EffectDenied(ApiError):
    """409 ``denied``: the effect declaration was refused; **nothing may be dispatched**.

    ``reason`` is one of ``run_paused``, ``run_cancelled``, ``not_running``, ``authority_missing``,
    ``authority_suspended``, ``authority_revoked``, ``authority_expired``, ``capability_frozen``,
    ``approval_required``, ``lease_lost`` (docs/concepts/worker-protocol.md); the denial itself is
    recorded in the ledger by the server. ``why`` is the server's sentence; for
    ``capability_frozen``, ``freeze`` names the freeze (``kind`` ``run`` or ``standing``, its
    ``capability``, ``frozen_by``, ``reason``; a standing one its ``id`` and ``scope``).
    """

    def __init__(
        self, status: int, code: str, detail: Any = None, payload: dict[str, Any] | None = None
    ):
        super().__init__(status, code, detail, payload)
        p = payload or {}
        self.reason: str = str(p.get("reason") or detail or "denied")
        self.why: str = str(p.get("detail") or "")
        self.freeze: dict[str, Any] | None = p.get("freeze") or None
        said = f": {self.why}" if self.why and self.why != self.reason else ""
        self.args = (f"effect denied: {self.reason}{said}",)


class EffectUnresolved(ApiError):
    """An earlier effect with the same idempotency key is still ``in_flight`` or ``unknown``.

    Dispatching again could duplicate it, so the SDK refuses; the run needs reconciliation
    (``POST /api/v1/effects/{id}/reconcile``) first. ``effect_id`` names the unresolved effect.
    """

    def __init__(
        self, status: int, code: str, detail: Any = None, payload: dict[str, Any] | None = None
    ):
        super().__init__(status, code, detail, payload)
        p = payload or {}
        eid = p.get("effect_id", p.get("id"))
        self.effect_id: str | None = None if eid is None else str(eid)
        self.effect_status: str | None = p.get("status")


class EffectAlreadyFailed(ApiError):
    """The key was declared before (same arguments) and that effect is recorded ``failed``.

    Raised by the SDK (the server answers ``decision: replayed, status: failed``) before the body runs:
    the ledger entry for this key is closed, so its outcome cannot be recorded again. A failed effect
    means nothing happened in the world; to try again, declare it under a new key (for example
    ``f"{key}:attempt-{ctx.attempt.number}"``). ``effect_id`` names the failed effect.
    """

    def __init__(
        self, status: int, code: str, detail: Any = None, payload: dict[str, Any] | None = None
    ):
        super().__init__(status, code, detail, payload)
        eid = (payload or {}).get("id")
        self.effect_id: str | None = None if eid is None else str(eid)


class EffectsUnresolved(ApiError):
    """409 ``effects_unresolved``: the attempt cannot finish ``succeeded`` while effects are
    ``in_flight``/``unknown``. ``effects`` lists their ids."""

    def __init__(
        self, status: int, code: str, detail: Any = None, payload: dict[str, Any] | None = None
    ):
        super().__init__(status, code, detail, payload)
        self.effects: list[str] = [str(e) for e in (payload or {}).get("effects") or []]


class IdempotencyKeyReused(ApiError):
    """422 ``idempotency_key_reused``: the key was declared before with *different* arguments."""


class EffectCompensated(IdempotencyKeyReused):
    """422 ``idempotency_key_reused`` with ``compensated: true``: the key's effect committed and was
    then undone (a redrive compensated it first). Replaying it would say it happened; doing it again
    is a new effect: declare it under a new key (for example ``f"{key}:try-{ctx.attempt.number}"``).
    A subclass of :class:`IdempotencyKeyReused`, so code that caught that one still does.
    ``effect_id`` names the compensated effect."""

    def __init__(
        self, status: int, code: str, detail: Any = None, payload: dict[str, Any] | None = None
    ):
        super().__init__(status, code, detail, payload)
        eid = (payload or {}).get("effect_id")
        self.effect_id: str | None = None if eid is None else str(eid)


class OutcomeNotRecorded(ControlPlaneError):
    """The world call finished but its outcome could not be written to the ledger.

    The effect stays ``in_flight`` on the server until recovery reconciles it with the world; the
    worker should stop. ``effect_id`` and ``status`` say what the SDK tried to record.
    """

    def __init__(self, effect_id: str, status: str, message: str = ""):
        self.effect_id = effect_id
        self.status = status
        super().__init__(
            f"outcome {status!r} of effect {effect_id} not recorded"
            + (f": {message}" if message else "")
        )


class DirectiveInterrupt(Exception):
    """Raised at a step boundary when the control plane asks the run to stop making progress.

    Deliberately *not* a :class:`ControlPlaneError`: it is control flow, to be caught by the worker loop.
    ``directive`` is the directive received and ``reason`` the server's explanation (may be empty).
    """

    directive: str = ""

    def __init__(self, reason: str | None = None):
        self.reason = reason or ""
        super().__init__(f"{self.directive}" + (f": {self.reason}" if self.reason else ""))


class PauseRequested(DirectiveInterrupt):
    """Directive ``pause``: stop at this boundary; in-flight outcomes may still be recorded."""

    directive = "pause"


class CancelRequested(DirectiveInterrupt):
    """Directive ``cancel``: stop all future work; committed effects stay committed."""

    directive = "cancel"


class StopRequested(DirectiveInterrupt):
    """Directive ``stop``: this worker must stop executing (e.g. ownership moved, recovery took over)."""

    directive = "stop"


_BY_CODE: dict[str, type[ApiError]] = {
    "lease_lost": LeaseLost,
    "lease_held": LeaseHeld,
    "not_claimable": NotClaimable,
    "denied": EffectDenied,
    "effect_unresolved": EffectUnresolved,
    "effects_unresolved": EffectsUnresolved,
    "idempotency_key_reused": IdempotencyKeyReused,
    "conflict": Conflict,
    "invalid": InvalidRequest,
    "forbidden": Forbidden,
    "unauthorized": Unauthorized,
    "not_found": NotFound,
}

_BY_STATUS: dict[int, type[ApiError]] = {
    400: InvalidRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    422: InvalidRequest,
}


def error_from_response(status: int, payload: Any, text: str = "") -> ApiError:
    """Build the exception for an error response (``payload`` is the decoded JSON body, if any)."""
    if isinstance(payload, dict):
        code = str(payload.get("error") or payload.get("code") or f"http_{status}")
        detail = payload.get("detail")
        cls = _BY_CODE.get(code) or _BY_STATUS.get(status, ApiError)
        if cls is IdempotencyKeyReused and payload.get("compensated") is True:
            cls = EffectCompensated
        return cls(status, code, detail, payload)
    cls = _BY_STATUS.get(status, ApiError)
    return cls(status, f"http_{status}", text[:500] or None, {})
