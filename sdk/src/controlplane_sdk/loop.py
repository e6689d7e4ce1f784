"""``run_agent_loop``: the main loop of a long-running agent worker process.

::

    def purchase(ctx: RunContext) -> None:
        ...   # steps, effects, checkpoints (see README)

    run_agent_loop(Client(URL, TOKEN), agent="purchasing", worker_name="worker-7", run_fn=purchase)

For each queued run of the agent (``GET /runs?agent=…&state=queued``) it claims the run (skipping it on
``lease_held``/``not_claimable``), calls ``run_fn(ctx)``, and ends the attempt:

=========================================  =================================================================
``run_fn`` returns                         finish ``succeeded`` (unless ``run_fn`` already called ``ctx.finish``);
                                           if refused (``effects_unresolved``) finish ``failed``
``PauseRequested``                         release the lease (acknowledges the pause); resumes later
``StopRequested``                          release the lease (another actor now owns execution)
``CancelRequested``                        release the lease (acknowledges the cancel); if that is
                                           refused, finish ``failed`` / ``cancelled``
``EffectDenied`` ``run_paused``/…          treated as the matching directive; other reasons → finish failed
``LeaseLost``                              stop at once; never write again with this fencing token
any other exception                        finish ``failed`` with a failure class (``timeout``/``error``)
=========================================  =================================================================

An exception group of one (an agent running a ``TaskGroup``) counts as the exception inside it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from ._util import raise_sole
from .client import Client
from .errors import (
    ApiError,
    CancelRequested,
    ClaimRefused,
    ControlPlaneError,
    DirectiveInterrupt,
    EffectDenied,
    LeaseLost,
    NotFound,
    OutcomeNotRecorded,
    PauseRequested,
    ServerUnreachable,
    StopRequested,
)
from .runtime import RunContext, Worker
from .tracing import run_trace

__all__ = ["run_agent_loop", "run_one", "RunSummary", "classify_failure"]

log = logging.getLogger("controlplane_sdk")

RunFn = Callable[[RunContext], Any]

_DENIAL_AS_DIRECTIVE: dict[str, type[DirectiveInterrupt]] = {
    "run_paused": PauseRequested,
    "run_cancelled": CancelRequested,
}


@dataclass(frozen=True)
class RunSummary:
    """What the loop did with one claimed run."""

    run_id: str
    attempt_id: str
    outcome: str  # succeeded | failed | paused | stopped | cancelled | lease_lost
    detail: str = ""


def classify_failure(exc: BaseException) -> str:
    """Failure class for an exception: its ``failure_class`` attribute, else ``timeout``/``error``."""
    fc = getattr(exc, "failure_class", None)
    if isinstance(fc, str) and fc:
        return fc
    if isinstance(exc, (TimeoutError, httpx.TimeoutException)):
        return "timeout"
    if isinstance(exc, EffectDenied):
        return "effect_denied"
    if isinstance(exc, (OutcomeNotRecorded, ServerUnreachable)):
        return "control_plane_unreachable"
    return "error"


def _try_finish(
    ctx: RunContext, outcome: str, failure_class: str | None = None, error: str | None = None
) -> None:
    try:
        ctx.finish(outcome, failure_class=failure_class, error=error)
    except ControlPlaneError as err:
        log.warning("run %s: finish(%s) not accepted: %s", ctx.run_id, outcome, err)


def _call(run_fn: RunFn, ctx: RunContext) -> None:
    """``run_fn(ctx)``, with what a task group wrapped around one exception raised as itself."""
    try:
        run_fn(ctx)
    except BaseExceptionGroup as group:
        raise_sole(group)


def run_one(ctx: RunContext, run_fn: RunFn) -> RunSummary:
    """Run ``run_fn`` on a claimed context and end the attempt according to the table above."""

    def summary(outcome: str, detail: str = "") -> RunSummary:
        return RunSummary(ctx.run_id, ctx.attempt.id, outcome, detail)

    with ctx, run_trace(ctx.run_id):
        try:
            try:
                ctx.check_directive()
                _call(run_fn, ctx)
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
            ctx.release(f"worker stopped at a boundary on {intr.directive}")
            return summary("paused" if isinstance(intr, PauseRequested) else "stopped", intr.reason)
        except CancelRequested as intr:
            if not ctx.release("worker stopped at a boundary on cancel") and not ctx.lease_lost:
                _try_finish(ctx, "failed", "cancelled", intr.reason or "cancelled by operator")
            return summary("cancelled", intr.reason)
        except LeaseLost as lost:
            ctx.stop_heartbeat()
            return summary("lease_lost", str(lost))
        except Exception as exc:  # the agent failed: record it, keep the worker alive
            failure_class = classify_failure(exc)
            if isinstance(getattr(exc, "failure_class", None), str):
                # A failure the agent declared (it named the class): expected, so one line, no traceback.
                log.warning("run %s failed (%s): %s", ctx.run_id, failure_class, exc)
            else:
                log.exception("run %s failed", ctx.run_id)
            if not ctx.finished:
                _try_finish(ctx, "failed", failure_class, f"{type(exc).__name__}: {exc}"[:2000])
            return summary("failed", f"{type(exc).__name__}: {exc}")
        if not ctx.finished:
            try:
                ctx.finish("succeeded")
            except LeaseLost as lost:
                return summary("lease_lost", str(lost))
            except ControlPlaneError as err:  # e.g. effects_unresolved: an outcome is still unknown
                log.warning("run %s: finish(succeeded) refused: %s", ctx.run_id, err)
                fc = err.code if isinstance(err, ApiError) else "control_plane_unreachable"
                ctx.finished = False
                _try_finish(ctx, "failed", fc, f"finish(succeeded) refused: {err}"[:2000])
                return summary("failed", str(err))
        return summary("succeeded")


def run_agent_loop(
    client: Client,
    agent: str,
    worker_name: str,
    run_fn: RunFn,
    *,
    versions: dict[str, Any] | None = None,
    poll_interval: float = 2.0,
    max_runs: int | None = None,
    exit_when_idle: bool = False,
    stop_event: threading.Event | None = None,
    heartbeat_interval: float | None = None,
    states: tuple[str, ...] = ("queued",),
    on_summary: Callable[[RunSummary], None] | None = None,
    long_poll_s: float = 5.0,
) -> list[RunSummary]:
    """Wait for this agent's queued runs and execute them one at a time until stopped.

    Work is long-polled (``long_poll_s`` per request, so a stop is heard within that long) from
    ``/work/claim``; against a server without it, runs are listed every ``poll_interval``.

    Stops when ``stop_event`` is set, after ``max_runs`` claimed runs, or (``exit_when_idle``) when a
    poll finds nothing to claim. Returns the summaries of the runs it handled. A control plane that is
    temporarily unreachable is waited out (logged, retried every ``poll_interval``).
    """
    worker = Worker(
        client, worker_name, agent, versions=versions, heartbeat_interval=heartbeat_interval
    )
    stop = stop_event or threading.Event()
    done: list[RunSummary] = []

    def handle(ctx: RunContext) -> None:
        s = run_one(ctx, run_fn)
        log.info("run %s attempt %s: %s %s", s.run_id, s.attempt_id, s.outcome, s.detail)
        done.append(s)
        if on_summary:
            on_summary(s)

    # Long-poll for work (one request waits until a run is claimable) where the server offers it;
    # list-and-claim every ``poll_interval`` against older servers or for states other than queued.
    long_poll = states == ("queued",)
    while not stop.is_set() and (max_runs is None or len(done) < max_runs):
        if long_poll:
            try:
                ctx = worker.claim_next(wait_s=0 if exit_when_idle else long_poll_s)
            except NotFound:
                log.info("no /work/claim on this server: listing runs every %ss", poll_interval)
                long_poll = False
                continue
            except ControlPlaneError as err:
                log.warning("asking for work failed: %s", err)
                stop.wait(poll_interval)
                continue
            if ctx is not None:
                handle(ctx)
            elif exit_when_idle:
                break
            continue
        claimed = False
        try:
            candidates = [r for s in states for r in worker.queued_runs(s)]
        except ControlPlaneError as err:
            log.warning("listing runs failed: %s", err)
            candidates = []
        for run in candidates:
            if stop.is_set():
                break
            try:
                ctx = worker.claim(str(run["id"]))
            except ClaimRefused as refused:
                log.info("run %s skipped: %s", run.get("id"), refused.code)
                continue
            except ControlPlaneError as err:
                log.warning("claim of run %s failed: %s", run.get("id"), err)
                continue
            handle(ctx)
            claimed = True
            break  # re-list: states change while we work
        if not claimed:
            if exit_when_idle:
                break
            stop.wait(poll_interval)
    return done
