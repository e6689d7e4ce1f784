"""The asyncio runtime: the same contract as ``runtime.py`` / ``effects.py`` / ``loop.run_one``,
awaited instead of blocking, with the heartbeat an asyncio task instead of a thread::

    async def purchase(ctx: AsyncRunContext) -> None:
        async with ctx.step("charge"):
            async with ctx.effect("payments", "charge", args={"amount": 42}) as fx:
                if not fx.already_done:
                    r = await world.post("/charge", headers={"Idempotency-Key": fx.idempotency_key})
                    fx.committed(r.json()["id"])

    async with AsyncClient(URL, TOKEN) as cp:
        ctx = await AsyncWorker(cp, "worker-1", "purchasing").claim_next(wait_s=20)  # aio_loop
        if ctx is not None:
            summary = await arun_one(ctx, purchase)

Directives are honoured at ``async with ctx.step(...)`` boundaries (``PauseRequested``,
``CancelRequested``, ``StopRequested``, ``LeaseLost``), an effect records exactly one outcome by the
rules of :func:`controlplane_sdk.effects.settle`, keys are the call's identity as in the sync
runtime, ``fx.then(...)`` carries the next declaration on an outcome as in the sync runtime, and
``arun_one`` ends the attempt by the table in ``loop.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as _dt
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from types import TracebackType
from typing import Any, TypeVar

from ._core import default_key, timer_event
from .aio import AsyncClient
from .effects import Ahead, ScopeBase, carried_checkpoint, not_recorded
from .errors import (
    ApiError,
    CancelRequested,
    ControlPlaneError,
    EffectDenied,
    LeaseLost,
    PauseRequested,
    StopRequested,
)
from .models import Approval, Claim, Directive, EffectDecision, Event, HeartbeatReply
from .tools import agoverned
from .tracing import run_trace

R = TypeVar("R")

__all__ = ["AsyncRunContext", "AsyncEffectScope"]

log = logging.getLogger("controlplane_sdk")
_INTERRUPTS = {"pause": PauseRequested, "cancel": CancelRequested, "stop": StopRequested}
_DENIAL_AS_DIRECTIVE = {"run_paused": PauseRequested, "run_cancelled": CancelRequested}


class AsyncEffectScope(ScopeBase):
    """``async with ctx.effect(...) as fx``: declare on entry, one outcome on exit; what it is and
    what the agent reports (``fx.committed(...)``, ``fx.then(...)``, …) is the sync scope's."""

    _ctx: AsyncRunContext

    async def __aenter__(self) -> AsyncEffectScope:
        ctx = self._ctx
        try:
            body = self._body()
            self._declared(
                await ctx._take_ahead(body)
                or await ctx.client.declare_effect(ctx.run_id, attempt_id=ctx.attempt.id, **body)
            )
        except (LeaseLost, EffectDenied) as err:
            self._refused(err)
            raise
        return self

    async def __aexit__(
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
                self.outcome_response = await ctx.client.record_outcome(
                    self.effect_id, ctx.fencing_token, status, external_ref=ref, detail=detail,
                    checkpoint=checkpoint,
                )  # fmt: skip
            else:
                self.outcome_response, ahead = await ctx.client.record_outcome_and_declare(
                    ctx.run_id, self.effect_id, ctx.fencing_token, status, then, external_ref=ref,
                    detail=detail, checkpoint=checkpoint, attempt_id=ctx.attempt.id,
                )  # fmt: skip
                if ahead is not None:
                    await ctx._hold_ahead(then, ahead)
        except ControlPlaneError as err:
            not_recorded(self.effect_id, status, err, exc)
            return
        if checkpoint is not None:
            await ctx._checkpoint_written(self.step, checkpoint[1], self.outcome_response)


class AsyncRunContext:
    """One claimed attempt, for asyncio agents; ``async with ctx:`` stops the heartbeat task."""

    def __init__(
        self,
        client: AsyncClient,
        claim: Claim,
        worker_name: str,
        *,
        heartbeat_interval: float | None = None,
    ) -> None:
        self.client, self.worker_name, self.claim_result = client, worker_name, claim
        self.run_id, self.attempt, self.lease = claim.run_id, claim.attempt, claim.lease
        self.start_checkpoint = claim.checkpoint
        self.state: dict[str, Any] = dict(claim.checkpoint.state) if claim.checkpoint else {}
        self.last_checkpoint_seq = claim.checkpoint.seq if claim.checkpoint else None
        self.current_step: str | None = None
        self.finished = False
        ttl = float(claim.lease.ttl_s or 30.0)
        self.heartbeat_interval = heartbeat_interval or max(ttl / 3.0, 0.05)
        self.directive, self.directive_reason = claim.directive, ""
        self._approval: dict[str, Any] | None = None
        self._timers_fired: list[dict[str, Any]] = []
        self._lease_lost: LeaseLost | None = None
        self._declared: dict[tuple[str, str, str], int] = {}
        self._ahead = Ahead()  # the next declaration, decided on the previous outcome (fx.then)
        self._task: asyncio.Task[None] | None = None

    @property
    def fencing_token(self) -> int:
        return self.lease.fencing_token

    @property
    def lease_lost(self) -> bool:
        return self._lease_lost is not None

    def _mark_lease_lost(self, err: ApiError) -> None:
        if self._lease_lost is None:
            self._lease_lost = (
                err
                if isinstance(err, LeaseLost)
                else LeaseLost(err.status, "lease_lost", err.detail, err.payload)
            )

    # -- heartbeats and directives ---------------------------------------------------------------

    async def _beat(self, wait_s: float | None = None) -> HeartbeatReply:
        try:
            hb = await self.client.heartbeat(self.lease.id, self.fencing_token, wait_s=wait_s)
        except LeaseLost as err:
            self._mark_lease_lost(err)
            raise
        self.directive, self.directive_reason = hb.directive, hb.reason
        if hb.approval is not None:
            self._approval = hb.approval
        self._timers_fired.extend(hb.timers_fired)
        return hb

    def pop_fired_timers(self) -> list[dict[str, Any]]:
        """Timers the server delivered on heartbeats since the last call (``timers_fired``), oldest
        first, as :meth:`RunContext.pop_fired_timers`."""
        fired, self._timers_fired = self._timers_fired, []
        return fired

    async def wait_for_directive(
        self, wait_s: float = 20.0, *, timeout: float | None = None, current: str | None = None
    ) -> str:
        """Await (heartbeat long-poll with ``wait_s``) a directive other than ``current`` (default:
        the latest seen), or ``timeout`` seconds; return the directive then."""
        start = current if current is not None else self.directive
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            w = wait_s if deadline is None else min(wait_s, deadline - time.monotonic())
            if w <= 0:
                return self.directive
            t0 = time.monotonic()
            hb = await self._beat(wait_s=w)
            if hb.directive != start:
                return hb.directive
            # a server that answers at once (no long-poll) must not turn this into a busy loop
            pause = min(w, 1.0) - (time.monotonic() - t0)
            if pause > 0:
                await asyncio.sleep(pause)

    async def set_timer(
        self, name: str, fire_at: _dt.datetime | str | None = None, *, in_s: float | None = None
    ) -> str:
        """Set a timer (keeps running while paused). Give ``fire_at`` or ``in_s``; returns ``fire_at``."""
        if fire_at is None:
            if in_s is None:
                raise ValueError("set_timer needs fire_at or in_s")
            fire_at = _dt.datetime.now(_dt.UTC) + _dt.timedelta(seconds=in_s)
        when = fire_at.isoformat() if isinstance(fire_at, _dt.datetime) else str(fire_at)
        await self.client.append_events(self.run_id, self.fencing_token, [timer_event(name, when)])
        return when

    def tool(
        self,
        tool: str,
        action: str,
        *,
        key: Callable[..., str] | None = None,
        step: str | None = None,
        compensate: dict[str, Any] | None = None,
        irreversible: bool = False,
        unknown_on: tuple[type[BaseException], ...] = (),
    ) -> Callable[[Callable[..., Awaitable[R]]], Callable[..., Awaitable[R]]]:
        """:meth:`RunContext.tool` for ``async def`` tools: each awaited call is an effect."""
        return agoverned(
            self, tool, action, key=key, step=step, compensate=compensate,
            irreversible=irreversible, unknown_on=unknown_on,
        )  # fmt: skip

    async def aclose(self) -> None:
        """:meth:`RunContext.close`: stop the heartbeat task."""
        await self.stop_heartbeat()

    def start_heartbeat(self) -> None:
        if self._task is None and not self.lease_lost:
            self._task = asyncio.create_task(self._heartbeats(), name=f"heartbeat-{self.run_id}")

    async def _heartbeats(self) -> None:
        with run_trace(self.run_id):
            while True:
                await asyncio.sleep(self.heartbeat_interval)
                try:
                    await self._beat()
                except LeaseLost:
                    log.warning(
                        "run %s: lease %s lost; heartbeat stopped", self.run_id, self.lease.id
                    )
                    return
                except ControlPlaneError as err:  # transient: keep trying
                    log.warning("run %s: heartbeat failed: %s", self.run_id, err)

    async def stop_heartbeat(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def __aenter__(self) -> AsyncRunContext:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop_heartbeat()

    async def refresh(self) -> str:
        return (await self._beat()).directive

    async def check_directive(self, *, refresh: bool = True) -> str:
        """A step boundary: raises the directive's interrupt, or waits out ``wait``."""
        if refresh and not self.lease_lost:
            with contextlib.suppress(ControlPlaneError):
                await self._beat()
        while self._lease_lost is None and self.directive == Directive.WAIT:
            t0 = time.monotonic()
            await self._beat(wait_s=20)
            await asyncio.sleep(max(0.0, 1.0 - (time.monotonic() - t0)))  # no busy loop
        if self._lease_lost is not None:
            raise self._lease_lost
        if self.directive in _INTERRUPTS:
            raise _INTERRUPTS[self.directive](self.directive_reason)
        return self.directive

    async def get_run(self) -> dict[str, Any]:
        return await self.client.get_run(self.run_id)

    # -- steps, effects, history -------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def step(self, name: str) -> AsyncIterator[None]:
        """As :meth:`RunContext.step`: a boundary checks the directive, except before an effect
        authorized on the previous outcome (``fx.then``), which found the run running a moment ago."""
        if not self.declared_ahead:
            await self.check_directive()
        for counted in [k for k in self._declared if k[0] == name]:
            del self._declared[counted]
        prev, self.current_step = self.current_step, name
        await self.event("step_started", {"step": name, "attempt": self.attempt.number})
        try:
            yield
        finally:
            self.current_step = prev
        await self.event("step_completed", {"step": name, "attempt": self.attempt.number})

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
        unknown_on: tuple[type[BaseException], ...] = (),
        approval_id: str | None = None,
        checkpoint: dict[str, Any] | None = None,
    ) -> AsyncEffectScope:
        """As :meth:`RunContext.effect` (the same default keys), for ``async with``."""
        step = step or self.current_step
        if not step:
            raise ValueError("effect() needs step= (or run it inside `async with ctx.step(name):`)")
        counted = None
        if key is None:
            key, counted = default_key(self.run_id, step, tool, action, self._declared)
        return AsyncEffectScope(
            self,
            tool=tool,
            action=action,
            key=key,
            step=step,
            args=args,
            compensate=compensate,
            irreversible=irreversible,
            unknown_on=unknown_on,
            approval_id=approval_id,
            checkpoint=checkpoint,
            counted=counted,
        )

    def _count(self, counted: tuple[str, str, str]) -> None:
        self._declared[counted] = self._declared.get(counted, 0) + 1

    @property
    def declared_ahead(self) -> bool:
        """An effect was authorized on the previous outcome and waits for its ``ctx.effect(...)``."""
        return self._ahead.authorized

    async def _hold_ahead(self, body: dict[str, Any], answer: EffectDecision | ApiError) -> None:
        unused = self._ahead.hold(body, answer)
        await self._not_dispatched(unused, "another declaration rode on a later outcome")

    async def _take_ahead(self, body: dict[str, Any]) -> EffectDecision | None:
        use, unused = self._ahead.take(body)
        await self._not_dispatched(unused, "the agent declared another effect instead")
        return use

    async def _not_dispatched(self, decision: EffectDecision | None, why: str) -> None:
        """As the sync runtime: an effect authorized ahead and not dispatched is recorded
        ``failed`` with ``not_dispatched``, so it leaves nothing unresolved."""
        if decision is None or self.lease_lost:
            return
        log.warning("run %s: effect %s declared ahead was not dispatched (%s)",
                    self.run_id, decision.idempotency_key, why)  # fmt: skip
        detail = {"not_dispatched": True, "reason": why}
        try:
            await self.client.record_outcome(
                decision.id, self.fencing_token, "failed", detail=detail
            )
        except ControlPlaneError as err:
            log.error("run %s: effect %s left in flight: %s", self.run_id, decision.id, err)

    async def checkpoint(self, step: str, state: dict[str, Any]) -> int:
        d = await self.client.checkpoint(self.run_id, self.fencing_token, step, state)
        self.state = dict(state)
        if d.get("seq") is not None:
            self.last_checkpoint_seq = int(d["seq"])
        return self.last_checkpoint_seq or 0

    async def _checkpoint_written(
        self, step: str, state: dict[str, Any], answer: dict[str, Any] | None
    ) -> None:
        try:
            written = carried_checkpoint(answer)
        except LeaseLost as err:
            self._mark_lease_lost(err)
            raise
        if written is None:  # an older server: write it separately
            await self.checkpoint(step, state)
            return
        self.state = dict(state)
        if written.get("seq") is not None:
            self.last_checkpoint_seq = int(written["seq"])

    async def event(self, kind: str, data: dict[str, Any] | None = None) -> None:
        await self.client.append_events(self.run_id, self.fencing_token, [Event(kind, data or {})])

    async def record_assumption(
        self,
        key: str,
        value: Any,
        max_age_s: float | None = None,
        checker: str | None = None,
        meta: dict[str, Any] | None = None,
    ) -> None:
        from .client import Client

        ev = Client.assumption_event(key, value, max_age_s=max_age_s, checker=checker, meta=meta)
        await self.client.append_events(self.run_id, self.fencing_token, [ev])

    # -- approvals -------------------------------------------------------------------------------

    async def request_approval(
        self,
        tool: str,
        action: str,
        args: dict[str, Any] | None,
        reason: str,
        deadline_s: float | None = None,
        required_role: str | None = None,
    ) -> str:
        approval = await self.client.request_approval(
            self.run_id,
            self.fencing_token,
            tool=tool,
            action=action,
            args=args,
            reason=reason,
            deadline_s=deadline_s,
            required_role=required_role,
        )
        return approval.id

    async def await_approval(self, approval_id: str, timeout: float | None = None) -> Approval:
        """Until the approval is decided (or ``timeout``); on pause/cancel it returns it as it
        stands and the next boundary raises (as the sync ``await_approval``)."""
        from .client import Client

        deadline = None if timeout is None else time.monotonic() + timeout
        latest: Approval | None = None
        while deadline is None or time.monotonic() < deadline:
            raw = self._approval
            if raw and str(raw.get("id")) == str(approval_id):
                latest = Client.parse_approval(raw)
                if not latest.pending:
                    return latest
            if self.directive != Directive.WAIT:
                found = Client.find_approval(await self.get_run(), approval_id)
                latest = found or latest
                if (latest and not latest.pending) or self.directive in _INTERRUPTS:
                    break
            t0 = time.monotonic()
            await self._beat(wait_s=20 if deadline is None else max(0.1, min(20, deadline - t0)))
            await asyncio.sleep(max(0.0, 1.0 - (time.monotonic() - t0)))
        return latest or Approval(id=str(approval_id), status="pending")

    # -- end of the attempt ------------------------------------------------------------------------

    async def finish(
        self, outcome: str = "succeeded", failure_class: str | None = None, error: str | None = None
    ) -> dict[str, Any]:
        await self._not_dispatched(self._ahead.drop(), f"the attempt ended ({outcome})")
        try:
            return await self.client.finish(
                self.run_id, self.fencing_token, outcome, failure_class=failure_class, error=error
            )
        finally:
            self.finished = True
            await self.stop_heartbeat()

    async def release(self, reason: str = "") -> bool:
        await self._not_dispatched(self._ahead.drop(), "the worker stopped at a boundary")
        await self.stop_heartbeat()
        if self.lease_lost:
            return False
        try:
            await self.client.release_lease(self.lease.id, self.fencing_token, reason)
            return True
        except ControlPlaneError as err:
            log.warning("run %s: lease release not accepted (%s)", self.run_id, err)
            return False
