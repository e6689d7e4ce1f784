"""The ``effect(...)`` context manager: declare → dispatch → record the outcome.

Usage (inside an agent step)::

    with ctx.effect("payments", "charge", key=f"order-{oid}-charge", args={"amount": 42},
                    compensate={"tool": "payments", "action": "refund"}) as fx:
        if fx.already_done:            # replayed: the charge committed in an earlier attempt
            pass                        # do NOT call the world again; fx.external_ref / fx.result are set
        else:
            charge = payments.charge(amount=42, idempotency_key=fx.idempotency_key)
            fx.committed(external_ref=charge["id"], detail={"amount": 42})
    charge_id = fx.external_ref        # available in both cases

Contract:

* Entering declares the effect (with the run's fencing token). A refusal raises
  :class:`~controlplane_sdk.errors.EffectDenied` **before the body runs**, so nothing is dispatched.
  ``EffectUnresolved``, ``EffectAlreadyFailed`` and ``IdempotencyKeyReused`` are raised the same way.
* Always pass ``fx.idempotency_key`` to the external system: it is stable across attempts, and is
  what reconciliation asks the world about.
* On exit the outcome is recorded exactly once:
  - the body called ``fx.committed(...)``, ``fx.failed(...)`` or ``fx.unknown(...)`` → that outcome
    (even if the body raised afterwards: the world call already happened);
  - the body raised a timeout/connection error (``httpx.TimeoutException``, ``httpx.TransportError``,
    ``TimeoutError``, ``ConnectionError`` or a class in ``unknown_on``) → ``unknown``: the world may have
    accepted the request; recovery will reconcile it by idempotency key;
  - the body raised anything else → ``failed``;
  - the body returned normally without saying → ``committed``.
  The body's exception is then re-raised unchanged.
* When ``fx.already_done`` is true nothing is recorded (the ledger already says ``committed``).
* If the outcome cannot be written (server unreachable after retries) the SDK raises
  :class:`~controlplane_sdk.errors.OutcomeNotRecorded` (or, if the body itself raised, logs it and adds a
  note to the body's exception). The effect then stays ``in_flight`` until recovery reconciles it.
* Do not call ``ctx.check_directive()`` inside an effect block: check at step boundaries.
"""

from __future__ import annotations

import json
import logging
from types import TracebackType
from typing import Any, Protocol, Self, cast

import httpx

from ._core import declaration_body
from ._util import json_default
from .client import Client
from .errors import (
    ApiError,
    ControlPlaneError,
    EffectDenied,
    LeaseLost,
    OutcomeNotRecorded,
    error_from_response,
)
from .models import Attempt, EffectDecision


class RunHost(Protocol):
    """What an effect needs of the run it belongs to (:class:`~controlplane_sdk.RunContext`).
    A protocol, so this module and ``runtime`` (which creates scopes) do not import each other."""

    client: Client
    run_id: str
    attempt: Attempt

    @property
    def fencing_token(self) -> int: ...

    def effect(
        self,
        tool: str,
        action: str,
        *,
        key: str | None = None,
        args: dict[str, Any] | None = None,
        step: str | None = None,
        compensate: dict[str, Any] | None = None,
        irreversible: bool = False,
        approval_id: str | None = None,
        unknown_on: tuple[type[BaseException], ...] = (),
    ) -> EffectScope: ...

    def _take_ahead(self, body: dict[str, Any]) -> EffectDecision | None: ...

    def _hold_ahead(self, body: dict[str, Any], answer: EffectDecision | ApiError) -> None: ...

    def _mark_lease_lost(self, err: ApiError) -> None: ...

    def _count(self, counted: tuple[str, str, str]) -> None: ...

    def _checkpoint_written(
        self, step: str, state: dict[str, Any], answer: dict[str, Any] | None
    ) -> None: ...


__all__ = [
    "Ahead",
    "EffectScope",
    "ScopeBase",
    "RunHost",
    "UNKNOWN_ON_DEFAULT",
    "settle",
    "not_recorded",
    "carried_checkpoint",
]

log = logging.getLogger("controlplane_sdk")

UNKNOWN_ON_DEFAULT: tuple[type[BaseException], ...] = (
    httpx.TimeoutException,
    httpx.TransportError,
    TimeoutError,
    ConnectionError,
)


class ScopeBase:
    """What a declared effect is and what the agent reports about it, sync or async (the
    context-manager halves are :class:`EffectScope` and ``aio_runtime.AsyncEffectScope``)."""

    def __init__(
        self,
        ctx: Any,
        *,
        tool: str,
        action: str,
        key: str,
        step: str,
        args: dict[str, Any] | None,
        compensate: dict[str, Any] | None,
        irreversible: bool,
        unknown_on: tuple[type[BaseException], ...] = (),
        approval_id: str | None = None,
        checkpoint: dict[str, Any] | None = None,
        counted: tuple[str, str, str] | None = None,
    ) -> None:
        self._ctx = ctx
        self._counted = counted  # a default key's position: counted once declared
        self.tool = tool
        self.action = action
        self.step = step
        self.args = args or {}
        self.compensate = compensate
        self.irreversible = irreversible
        self.idempotency_key = key
        self.approval_id = approval_id
        self._unknown_on = UNKNOWN_ON_DEFAULT + tuple(unknown_on)
        #: the step's checkpoint state, written with this effect's outcome (one round trip)
        self._checkpoint = checkpoint
        #: the next declaration, carried by this effect's outcome (``then``)
        self._then: dict[str, Any] | None = None
        self.declaration: EffectDecision | None = None
        #: outcome the agent asked for: (status, external_ref, detail) or None
        self._outcome: tuple[str, str | None, Any] | None = None
        #: the server's answer to the outcome POST (``{"id", "status", "late", "stale_lease"}``)
        self.outcome_response: dict[str, Any] | None = None
        self.external_ref: str | None = None
        self.result: Any = None

    # -- what the declaration said ---------------------------------------------------------------

    @property
    def effect_id(self) -> str:
        assert self.declaration is not None, "effect not declared yet"
        return self.declaration.id

    @property
    def decision(self) -> str:
        """``authorized`` or ``replayed`` (a denial raises instead)."""
        return self.declaration.decision if self.declaration else "undeclared"

    @property
    def replayed(self) -> bool:
        return bool(self.declaration and self.declaration.replayed)

    @property
    def already_done(self) -> bool:
        """True when an earlier attempt committed this effect: skip the world call."""
        return bool(self.declaration and self.declaration.already_done)

    @property
    def status(self) -> str | None:
        """Ledger status: as declared, then as recorded on exit."""
        if self.outcome_response and self.outcome_response.get("status"):
            return str(self.outcome_response["status"])
        if self._outcome:
            return self._outcome[0]
        return self.declaration.status if self.declaration else None

    # -- what the agent reports ------------------------------------------------------------------

    def committed(self, external_ref: str | None = None, detail: Any = None) -> None:
        """The world accepted the request (``external_ref``: its id for the thing, e.g. ``ch_123``)."""
        self._set("committed", external_ref, detail)

    def failed(self, detail: Any = None) -> None:
        """The world definitely rejected the request (nothing happened)."""
        self._set("failed", None, detail)

    def unknown(self, detail: Any = None) -> None:
        """The outcome is ambiguous (e.g. accepted then timed out); recovery will reconcile."""
        self._set("unknown", None, detail)

    def checkpoint(self, state: dict[str, Any]) -> None:
        """The step's state once this effect has committed (it may hold the world's answer), written
        with the outcome in one round trip; like ``checkpoint=`` on :meth:`RunContext.effect`."""
        self._checkpoint = dict(state)

    def then(
        self,
        tool: str,
        action: str,
        *,
        step: str | None = None,
        key: str | None = None,
        args: dict[str, Any] | None = None,
        compensate: dict[str, Any] | None = None,
        irreversible: bool = False,
        approval_id: str | None = None,
    ) -> Self:
        """Declare the run's next effect on this one's outcome: one round trip for both.

        Returns that effect's scope, to enter where it is dispatched (``with ctx.step("charge"),
        charge as fx:``); an equal ``ctx.effect(...)`` (same step, key, tool, action, args,
        compensation) does the same. Entering it uses the decision the outcome carried instead of
        declaring again (a refusal is raised there, as its own declaration would have been), and the
        ``ctx.step`` boundary before it does not heartbeat: the authorization just found the run
        running under our lease. ``step`` defaults to this effect's, ``key`` to ``ctx.effect``'s
        default. Carried only on a ``committed`` outcome of a body that did not raise (otherwise,
        or against an older server, entering it declares as usual). Declared ahead but not
        dispatched (the agent declares something else, or the attempt ends first), the effect is
        recorded ``failed`` with ``not_dispatched`` (its key is then spent, as after any failed
        dispatch)."""
        nxt = self._ctx.effect(
            tool,
            action,
            key=key,
            args=args,
            step=step or self.step,
            compensate=compensate,
            irreversible=irreversible,
            approval_id=approval_id,
        )
        self._then = nxt._body()
        return cast(Self, nxt)

    def _body(self) -> dict[str, Any]:
        return declaration_body(
            self._ctx.fencing_token,
            step=self.step,
            tool=self.tool,
            action=self.action,
            idempotency_key=self.idempotency_key,
            args=self.args,
            compensation=self.compensate,
            irreversible=self.irreversible,
            approval_id=self.approval_id,
        )

    def _set(self, status: str, external_ref: str | None, detail: Any) -> None:
        if self.already_done:
            log.warning(
                "effect %s already committed (replayed); %s() ignored", self.idempotency_key, status
            )
            return
        self._outcome = (status, external_ref, detail)
        if external_ref is not None:
            self.external_ref = external_ref
        if detail is not None:
            self.result = detail

    def _declared(self, decision: EffectDecision) -> None:
        """The declaration answered (or the previous outcome carried) ``decision``."""
        self.declaration = decision
        if self._counted is not None:
            self._ctx._count(self._counted)
        self.idempotency_key = decision.idempotency_key
        if self.already_done:
            self.external_ref = decision.external_ref
            self.result = decision.outcome_detail

    def _refused(self, err: BaseException) -> None:
        """A declaration refused with ``err`` (raised by the caller): a lost lease is noted."""
        if isinstance(err, LeaseLost) or (
            isinstance(err, EffectDenied) and err.reason == "lease_lost"
        ):
            self._ctx._mark_lease_lost(err)

    def _closing(
        self, exc: BaseException | None
    ) -> tuple[
        tuple[str, str | None, Any], tuple[str, dict[str, Any]] | None, dict[str, Any] | None
    ]:
        """The block ended (``exc``: what it raised): the outcome to record, the checkpoint that
        rides on it and the next declaration it carries (``then``)."""
        self._outcome = settle(self._outcome, exc, self._unknown_on)
        # The step's checkpoint rides on a successful outcome only: a step that failed did not end.
        checkpoint = (
            (self.step, self._checkpoint) if self._checkpoint is not None and exc is None else None
        )
        then = self._then if self._outcome[0] == "committed" and exc is None else None
        return self._outcome, checkpoint, then

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} {self.tool}:{self.action} key={self.idempotency_key!r} "
            f"decision={self.decision} status={self.status}>"
        )


class EffectScope(ScopeBase):
    """One declared external side effect; created by :meth:`RunContext.effect`."""

    _ctx: RunHost

    # -- context manager -------------------------------------------------------------------------

    def __enter__(self) -> EffectScope:
        ctx = self._ctx
        try:
            self._declared(
                ctx._take_ahead(self._body())
                or ctx.client.declare_effect(ctx.run_id, attempt_id=ctx.attempt.id, **self._body())
            )
        except (LeaseLost, EffectDenied) as err:
            self._refused(err)
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.already_done:
            return
        (status, ref, detail), checkpoint, then = self._closing(exc)
        ctx = self._ctx
        try:
            if then is None:
                self.outcome_response = ctx.client.record_outcome(
                    self.effect_id, ctx.fencing_token, status, external_ref=ref, detail=detail,
                    checkpoint=checkpoint,
                )  # fmt: skip
            else:
                self.outcome_response, ahead = ctx.client.record_outcome_and_declare(
                    ctx.run_id, self.effect_id, ctx.fencing_token, status, then, external_ref=ref,
                    detail=detail, checkpoint=checkpoint, attempt_id=ctx.attempt.id,
                )  # fmt: skip
                if ahead is not None:
                    ctx._hold_ahead(then, ahead)
        except ControlPlaneError as err:
            not_recorded(self.effect_id, status, err, exc)
            return
        if checkpoint is not None:
            ctx._checkpoint_written(self.step, checkpoint[1], self.outcome_response)


def not_recorded(
    effect_id: str, status: str, err: ControlPlaneError, exc: BaseException | None
) -> None:
    """The outcome could not be written: raise ``OutcomeNotRecorded``, or (the body raised) log it
    and note it on the body's exception, which propagates."""
    msg = f"{type(err).__name__}: {err}"
    if exc is None:
        raise OutcomeNotRecorded(effect_id, status, msg) from err
    log.error("outcome %s of effect %s not recorded: %s", status, effect_id, msg)
    exc.add_note(f"controlplane: outcome {status!r} of effect {effect_id} NOT recorded ({msg})")


def carried_checkpoint(answer: dict[str, Any] | None) -> dict[str, Any] | None:
    """The checkpoint an outcome's answer says it wrote; ``None`` when the server did not take it
    (an older one: write it separately). A refusal raises what a separate call would have."""
    written = (answer or {}).get("checkpoint")
    if written is not None and "error" in written:
        raise error_from_response(409, written)
    return written


def settle(
    said: tuple[str, str | None, Any] | None,
    exc: BaseException | None,
    unknown_on: tuple[type[BaseException], ...],
) -> tuple[str, str | None, Any]:
    """The one outcome an effect block records (the module docstring's rules): what the body
    said, else ``committed`` if it returned, ``unknown`` for a timeout, ``failed`` otherwise."""
    if said is not None:
        return said
    if exc is None:
        return ("committed", None, None)
    if isinstance(exc, unknown_on):
        return ("unknown", None, _describe(exc))
    return ("failed", None, _describe(exc))


def _describe(exc: BaseException) -> dict[str, Any]:
    return {"exception": type(exc).__name__, "message": str(exc)[:1000]}


class Ahead:
    """The next declaration, decided on the previous outcome (``fx.then(...)``): its body and what
    the declaration answered (a decision, or the error it would have raised). No I/O: the runtime
    records ``failed`` / ``not_dispatched`` for a decision this hands back unused."""

    def __init__(self) -> None:
        self._held: tuple[dict[str, Any], EffectDecision | ApiError] | None = None

    @property
    def authorized(self) -> bool:
        """An effect was authorized ahead and waits for its ``ctx.effect(...)``."""
        held = self._held
        return (
            held is not None
            and isinstance(held[1], EffectDecision)
            and (held[1].decision == "authorized")
        )

    @staticmethod
    def _same(body: dict[str, Any]) -> dict[str, Any]:
        """A declaration body as the server sees it (JSON), without the fencing token."""
        plain: dict[str, Any] = json.loads(json.dumps(body, default=json_default))
        plain.pop("fencing_token", None)
        return plain

    def hold(
        self, body: dict[str, Any], answer: EffectDecision | ApiError
    ) -> EffectDecision | None:
        """Keep ``answer`` for ``body``; returns the one it replaces if that is left undispatched."""
        earlier = self.drop()
        self._held = (self._same(body), answer)
        return earlier

    def take(self, body: dict[str, Any]) -> tuple[EffectDecision | None, EffectDecision | None]:
        """``(decision for exactly this body, or None: declare it now; an authorized decision for
        something else, now left undispatched)``. A refusal carried for this body is raised."""
        held, self._held = self._held, None
        if held is None:
            return None, None
        if held[0] != self._same(body):
            self._held = held
            return None, self.drop()
        if isinstance(held[1], ApiError):
            raise held[1]
        return held[1], None

    def drop(self) -> EffectDecision | None:
        """Forget what is held; returns it if it was authorized (to record as not dispatched)."""
        held, self._held = self._held, None
        if held is None or not isinstance(held[1], EffectDecision):
            return None
        return held[1] if held[1].decision == "authorized" else None
