"""``AsyncWorker`` and ``arun_one``: claiming runs and ending attempts for asyncio agents, by the
same table as :func:`controlplane_sdk.run_one` (see ``loop.py``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from ._util import raise_sole
from .aio import AsyncClient
from .aio_runtime import AsyncRunContext
from .errors import (
    ApiError,
    CancelRequested,
    ClaimRefused,
    ControlPlaneError,
    DirectiveInterrupt,
    EffectDenied,
    LeaseLost,
    NotFound,
    PauseRequested,
    StopRequested,
)
from .loop import RunSummary, classify_failure
from .models import Claim
from .tracing import run_trace

__all__ = ["AsyncWorker", "arun_one", "arun_agent_loop"]

log = logging.getLogger("controlplane_sdk")
_DENIAL_AS_DIRECTIVE = {"run_paused": PauseRequested, "run_cancelled": CancelRequested}


class AsyncWorker:
    """Claims runs for one agent under one worker identity (as :class:`~controlplane_sdk.Worker`)."""

    def __init__(
        self,
        client: AsyncClient,
        worker_name: str,
        agent: str,
        *,
        versions: dict[str, Any] | None = None,
        heartbeat_interval: float | None = None,
    ) -> None:
        self.client, self.worker_name, self.agent = client, worker_name, agent
        self.versions, self.heartbeat_interval = versions or {}, heartbeat_interval

    def _context(self, claim: Claim, heartbeat: bool) -> AsyncRunContext:
        ctx = AsyncRunContext(
            self.client, claim, self.worker_name, heartbeat_interval=self.heartbeat_interval
        )
        if heartbeat:
            ctx.start_heartbeat()
        return ctx

    async def queued_runs(self, state: str = "queued") -> list[dict[str, Any]]:
        """Runs of this agent waiting for a worker."""
        return await self.client.list_runs(agent=self.agent, state=state)

    async def claim(self, run_id: str, *, heartbeat: bool = True) -> AsyncRunContext:
        claim = await self.client.claim(run_id, self.worker_name, self.versions)
        return self._context(claim, heartbeat)

    async def claim_next(
        self, wait_s: float = 20.0, *, heartbeat: bool = True
    ) -> AsyncRunContext | None:
        claim = await self.client.claim_next(self.worker_name, [self.agent], self.versions, wait_s)
        return None if claim is None else self._context(claim, heartbeat)


async def _try_finish(ctx: AsyncRunContext, outcome: str, fc: str | None, err: str | None) -> None:
    try:
        await ctx.finish(outcome, failure_class=fc, error=err)
    except ControlPlaneError as refused:
        log.warning("run %s: finish(%s) not accepted: %s", ctx.run_id, outcome, refused)


async def _call(run_fn: Callable[[AsyncRunContext], Awaitable[Any]], ctx: AsyncRunContext) -> None:
    """``await run_fn(ctx)``, with what a task group wrapped around one exception raised as itself."""
    try:
        await run_fn(ctx)
    except BaseExceptionGroup as group:
        raise_sole(group)


async def arun_one(
    ctx: AsyncRunContext, run_fn: Callable[[AsyncRunContext], Awaitable[Any]]
) -> RunSummary:
    """``await run_fn(ctx)`` and end the attempt by the same table as :func:`run_one`."""

    def summary(outcome: str, detail: str = "") -> RunSummary:
        return RunSummary(ctx.run_id, ctx.attempt.id, outcome, detail)

    async with ctx:
        with run_trace(ctx.run_id):
            try:
                try:
                    await ctx.check_directive()
                    await _call(run_fn, ctx)
                except EffectDenied as denied:
                    if denied.reason == "lease_lost":
                        raise LeaseLost(
                            denied.status, "lease_lost", denied.detail, denied.payload
                        ) from denied
                    interrupt = _DENIAL_AS_DIRECTIVE.get(denied.reason)
                    if interrupt is None:
                        raise
                    raise interrupt(f"effect denied: {denied.reason}") from denied
            except (PauseRequested, StopRequested) as intr:
                await ctx.release(f"worker stopped at a boundary on {intr.directive}")
                return summary(
                    "paused" if isinstance(intr, PauseRequested) else "stopped", intr.reason
                )
            except CancelRequested as intr:
                if (
                    not await ctx.release("worker stopped at a boundary on cancel")
                    and not ctx.lease_lost
                ):
                    await _try_finish(
                        ctx, "failed", "cancelled", intr.reason or "cancelled by operator"
                    )
                return summary("cancelled", intr.reason)
            except LeaseLost as lost:
                await ctx.stop_heartbeat()
                return summary("lease_lost", str(lost))
            except DirectiveInterrupt:  # pragma: no cover - the three above are all of them
                raise
            except Exception as exc:  # the agent failed: record it, keep the worker alive
                fc = classify_failure(exc)
                log.warning("run %s failed (%s): %s", ctx.run_id, fc, exc)
                if not ctx.finished:
                    await _try_finish(ctx, "failed", fc, f"{type(exc).__name__}: {exc}"[:2000])
                return summary("failed", f"{type(exc).__name__}: {exc}")
            if not ctx.finished:
                try:
                    await ctx.finish("succeeded")
                except LeaseLost as lost:
                    return summary("lease_lost", str(lost))
                except ControlPlaneError as err:
                    fc = err.code if isinstance(err, ApiError) else "control_plane_unreachable"
                    ctx.finished = False
                    await _try_finish(ctx, "failed", fc, f"finish(succeeded) refused: {err}"[:2000])
                    return summary("failed", str(err))
            return summary("succeeded")


async def arun_agent_loop(
    client: AsyncClient,
    agent: str,
    worker_name: str,
    run_fn: Callable[[AsyncRunContext], Awaitable[Any]],
    *,
    versions: dict[str, Any] | None = None,
    poll_interval: float = 2.0,
    max_runs: int | None = None,
    exit_when_idle: bool = False,
    stop_event: asyncio.Event | None = None,
    heartbeat_interval: float | None = None,
    states: tuple[str, ...] = ("queued",),
    on_summary: Callable[[RunSummary], None] | None = None,
    long_poll_s: float = 5.0,
) -> list[RunSummary]:
    """:func:`controlplane_sdk.run_agent_loop` for asyncio agents, with the same arguments and
    stops (``stop_event`` is an ``asyncio.Event``): long-polls ``/work/claim`` (listing runs every
    ``poll_interval`` against a server without it, or for other states), one run at a time."""
    worker = AsyncWorker(
        client, worker_name, agent, versions=versions, heartbeat_interval=heartbeat_interval
    )
    stop = stop_event or asyncio.Event()
    done: list[RunSummary] = []

    async def idle() -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), poll_interval)

    async def handle(ctx: AsyncRunContext) -> None:
        s = await arun_one(ctx, run_fn)
        log.info("run %s attempt %s: %s %s", s.run_id, s.attempt_id, s.outcome, s.detail)
        done.append(s)
        if on_summary:
            on_summary(s)

    long_poll = states == ("queued",)
    while not stop.is_set() and (max_runs is None or len(done) < max_runs):
        if long_poll:
            try:
                ctx = await worker.claim_next(wait_s=0 if exit_when_idle else long_poll_s)
            except NotFound:
                log.info("no /work/claim on this server: listing runs every %ss", poll_interval)
                long_poll = False
                continue
            except ControlPlaneError as err:
                log.warning("asking for work failed: %s", err)
                await idle()
                continue
            if ctx is not None:
                await handle(ctx)
            elif exit_when_idle:
                break
            continue
        claimed = False
        try:
            candidates = [r for s in states for r in await worker.queued_runs(s)]
        except ControlPlaneError as err:
            log.warning("listing runs failed: %s", err)
            candidates = []
        for run in candidates:
            if stop.is_set():
                break
            try:
                ctx = await worker.claim(str(run["id"]))
            except ClaimRefused as refused:
                log.info("run %s skipped: %s", run.get("id"), refused.code)
                continue
            except ControlPlaneError as err:
                log.warning("claim of run %s failed: %s", run.get("id"), err)
                continue
            await handle(ctx)
            claimed = True
            break  # re-list: states change while we work
        if not claimed:
            if exit_when_idle:
                break
            await idle()
    return done
