"""Worker runtime: claim a run, keep its lease alive, honour directives at step boundaries.

A :class:`RunContext` is what agent code receives. It holds the attempt, the lease and fencing token,
the checkpoint the attempt starts from, and runs a background heartbeat thread (every ≈ ``ttl_s/3``)
that stores the latest directive. Agent code calls :meth:`RunContext.check_directive` (or uses
``with ctx.step(name):``, which does it for you) at each step boundary; a ``pause``, ``cancel`` or
``stop`` directive raises a :class:`~controlplane_sdk.errors.DirectiveInterrupt` so the code unwinds to
the worker loop. A directive never interrupts code in the middle of a step: the server enforces the
contract anyway (a paused run's effect declarations are denied), the SDK just stops politely.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from ._core import default_key
from .client import Client
from .effects import Ahead, EffectScope, carried_checkpoint
from .errors import (
    ApiError,
    CancelRequested,
    ControlPlaneError,
    LeaseLost,
    PauseRequested,
    StopRequested,
)
from .models import Approval, Checkpoint, Claim, Directive, EffectDecision, Event, HeartbeatReply
from .tools import governed
from .tracing import run_trace

__all__ = ["Worker", "RunContext"]

R = TypeVar("R")

JSON = dict[str, Any]

log = logging.getLogger("controlplane_sdk")

_INTERRUPTS = {
    Directive.PAUSE: PauseRequested,
    Directive.CANCEL: CancelRequested,
    Directive.STOP: StopRequested,
}


class RunContext:
    """One claimed attempt of one run. Use as a context manager so the heartbeat thread stops.

    Attributes for agent code: ``run_id``, ``attempt`` (``.id``, ``.number``), ``lease`` (``.id``,
    ``.fencing_token``, ``.ttl_s``), ``start_checkpoint`` (where this attempt starts, or ``None`` for a
    fresh run), ``state`` (a mutable copy of the checkpoint state, ``{}`` when fresh), ``current_step``.
    """

    def __init__(
        self,
        client: Client,
        claim: Claim,
        worker_name: str,
        *,
        heartbeat_interval: float | None = None,
    ) -> None:
        self.client = client
        self.worker_name = worker_name
        self.claim_result = claim
        self.run_id = claim.run_id
        self.attempt = claim.attempt
        self.lease = claim.lease
        self.start_checkpoint: Checkpoint | None = claim.checkpoint
        self.state: dict[str, Any] = dict(claim.checkpoint.state) if claim.checkpoint else {}
        self.last_checkpoint_seq: int | None = claim.checkpoint.seq if claim.checkpoint else None
        self.current_step: str | None = None
        self.finished = False
        # The next declaration, decided on the previous outcome (``fx.then(...)``).
        self._ahead = Ahead()
        # Effects declared under a default key in the current execution of each step, by
        # (step, tool, action): the next one's position (see ``effect``). Entering a step resets
        # its counts, so a step executed again (resume, redrive) replays the same keys.
        self._declared: dict[tuple[str, str, str], int] = {}
        ttl = float(claim.lease.ttl_s or 30.0)
        self.heartbeat_interval = (
            heartbeat_interval if heartbeat_interval is not None else max(ttl / 3.0, 0.05)
        )
        self._lock = threading.Lock()
        self._directive = claim.directive
        self._reason = ""
        self._approval: dict[str, Any] | None = None
        self._timers_fired: list[dict[str, Any]] = []
        self._lease_lost: LeaseLost | None = None
        self.last_heartbeat_error: Exception | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- lease & directive ------------------------------------------------------------------------

    @property
    def fencing_token(self) -> int:
        return self.lease.fencing_token

    @property
    def directive(self) -> str:
        """Latest directive seen (``continue``, ``pause``, ``cancel``, ``wait``, ``stop``)."""
        with self._lock:
            return self._directive

    @property
    def directive_reason(self) -> str:
        with self._lock:
            return self._reason

    @property
    def lease_lost(self) -> bool:
        return self._lease_lost is not None

    def _apply(self, hb: HeartbeatReply) -> None:
        with self._lock:
            if hb.directive != self._directive:
                log.info(
                    "run %s: directive %s -> %s %s",
                    self.run_id,
                    self._directive,
                    hb.directive,
                    hb.reason,
                )
            self._directive, self._reason = hb.directive, hb.reason
            if hb.approval is not None:
                self._approval = hb.approval
            self._timers_fired.extend(hb.timers_fired)

    def pop_fired_timers(self) -> list[dict[str, Any]]:
        """Timers the server delivered on heartbeats since the last call (``timers_fired``), oldest first.
        A timer that fired while the run was paused is delivered after resume."""
        with self._lock:
            fired, self._timers_fired = self._timers_fired, []
        return fired

    def _mark_lease_lost(self, err: ApiError) -> None:
        with self._lock:
            if self._lease_lost is None:
                self._lease_lost = (
                    err
                    if isinstance(err, LeaseLost)
                    else LeaseLost(err.status, "lease_lost", err.detail, err.payload)
                )
        self._stop.set()

    def _beat(self, wait_s: float | None = None) -> HeartbeatReply:
        try:
            hb = self.client.heartbeat(self.lease.id, self.fencing_token, wait_s=wait_s)
        except LeaseLost as err:
            self._mark_lease_lost(err)
            raise
        self._apply(hb)
        return hb

    def start_heartbeat(self) -> None:
        """Start the background heartbeat thread (done by :meth:`Worker.claim`)."""
        if self._thread is not None or self.lease_lost:
            return
        self._thread = threading.Thread(
            target=self._traced_heartbeat_loop, name=f"heartbeat-{self.run_id}", daemon=True
        )
        self._thread.start()

    def _traced_heartbeat_loop(self) -> None:
        with run_trace(self.run_id):  # a thread starts with an empty context
            self._heartbeat_loop()

    def _heartbeat_loop(self) -> None:
        while not self._stop.wait(self.heartbeat_interval):
            try:
                self._beat()
                self.last_heartbeat_error = None
            except LeaseLost:
                log.warning("run %s: lease %s lost; heartbeat stopped", self.run_id, self.lease.id)
                return
            except (
                ControlPlaneError
            ) as err:  # transient: keep trying until the lease is really gone
                self.last_heartbeat_error = err
                log.warning("run %s: heartbeat failed: %s", self.run_id, err)

    def stop_heartbeat(self) -> None:
        self._stop.set()
        t, self._thread = self._thread, None
        if t is not None and t is not threading.current_thread():
            t.join(timeout=self.client.timeout + 1)

    def close(self) -> None:
        self.stop_heartbeat()

    def __enter__(self) -> RunContext:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def refresh(self) -> str:
        """Heartbeat now (no long-poll) and return the directive. Raises ``LeaseLost``."""
        return self._beat().directive

    def check_directive(self, *, refresh: bool = True, wait_timeout: float | None = None) -> str:
        """Call at a step boundary. Returns ``"continue"`` or raises.

        Raises ``LeaseLost`` if the lease is gone, :class:`PauseRequested`, :class:`CancelRequested`
        or :class:`StopRequested` for those directives. On ``wait`` (an approval is pending) it blocks,
        long-polling, until the directive changes (or ``wait_timeout`` passes, then returns ``"wait"``).
        With ``refresh`` (default) it heartbeats first, so a pause issued a moment ago is seen; if the
        server is unreachable it falls back to the last directive the background thread saw.
        """
        if refresh and not self.lease_lost:
            with contextlib.suppress(ControlPlaneError):
                self._beat()
        if self._lease_lost is not None:
            raise self._lease_lost
        d = self.directive
        if d == Directive.WAIT:
            d = self.wait_for_directive(timeout=wait_timeout, current=Directive.WAIT)
            if self._lease_lost is not None:
                raise self._lease_lost
        if d in _INTERRUPTS:
            raise _INTERRUPTS[Directive(d)](self.directive_reason)
        return d

    def wait_for_directive(
        self, wait_s: float = 20.0, *, timeout: float | None = None, current: str | None = None
    ) -> str:
        """Block (heartbeat long-poll with ``wait_s``) until the directive differs from ``current``
        (default: the latest seen) or ``timeout`` seconds pass; return the directive then."""
        start = current if current is not None else self.directive
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            w = wait_s if deadline is None else min(wait_s, deadline - time.monotonic())
            if w <= 0:
                return self.directive
            t0 = time.monotonic()
            hb = self._beat(wait_s=w)
            if hb.directive != start:
                return hb.directive
            # a server that answers at once (no long-poll) must not turn this into a busy loop
            pause = min(w, 1.0) - (time.monotonic() - t0)
            if pause > 0:
                time.sleep(pause)

    def get_run(self) -> dict[str, Any]:
        """The run as the server has it now (goal, input, versions, state, …)."""
        return self.client.get_run(self.run_id)

    # -- steps, effects, history ------------------------------------------------------------------

    @contextlib.contextmanager
    def step(self, name: str) -> Iterator[None]:
        """A step boundary: checks the directive, records ``step_started``, runs the body, records
        ``step_completed`` (not recorded if the body raises). Also a decorator: ``@ctx.step("reserve")``
        makes every call of the function a boundary.

        A step whose effect was already authorized on the previous outcome (``fx.then(...)``) does
        not check the directive: that authorization, a moment ago, found the run running under our
        lease, and the effect is in flight from then on (a pause lets in-flight work finish). The
        directive is honoured at the boundary after it."""
        if not self.declared_ahead:
            self.check_directive()
        for counted in [k for k in self._declared if k[0] == name]:
            del self._declared[counted]
        prev, self.current_step = self.current_step, name
        self.event("step_started", {"step": name, "attempt": self.attempt.number})
        try:
            yield
        finally:
            self.current_step = prev
        self.event("step_completed", {"step": name, "attempt": self.attempt.number})

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
    ) -> EffectScope:
        """Declare an external side effect; see :mod:`controlplane_sdk.effects` for the contract.

        ``key`` (the idempotency key) must be stable across attempts. By default it is the call's
        identity: ``"{run_id}:{step}:{tool}:{action}"`` for the first such effect in this execution
        of the step, ``…:2``, ``…:3`` for the next ones (so two intended charges in one step are two
        effects, and a step executed again after a resume replays the same keys). Pass ``key=`` when
        the identity is something else: an id your agent keeps across attempts (an order line, a
        model's tool-call id), or a step whose effects do not come in a fixed order.
        ``step`` defaults to the enclosing ``ctx.step(...)``. ``approval_id`` cites the granted approval
        when this action needed one (the server denies it with ``approval_required`` otherwise).
        ``checkpoint``: the step's state once this effect has committed, written with its outcome in
        one round trip (as ``ctx.checkpoint(step, state)`` right after the effect would be; the SDK
        makes that call itself if the server does not take checkpoints with outcomes).
        """
        step = step or self.current_step
        if not step:
            raise ValueError("effect() needs step= (or run it inside `with ctx.step(name):`)")
        counted = None
        if key is None:
            key, counted = default_key(self.run_id, step, tool, action, self._declared)
        return EffectScope(
            self,
            counted=counted,
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
        )

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
    ) -> Callable[[Callable[..., R]], Callable[..., R]]:
        """A decorator: each call of the function is an effect (see :mod:`controlplane_sdk.tools`)."""
        return governed(
            self, tool, action, key=key, step=step, compensate=compensate,
            irreversible=irreversible, unknown_on=unknown_on,
        )  # fmt: skip

    def checkpoint(self, step: str, state: dict[str, Any]) -> int:
        """Write a durable boundary *after* ``step``; a resume or redrive starts from here. Returns seq."""
        d = self.client.checkpoint(self.run_id, self.fencing_token, step, state)
        self.state = dict(state)
        seq = d.get("seq")
        self.last_checkpoint_seq = int(seq) if seq is not None else self.last_checkpoint_seq
        return self.last_checkpoint_seq or 0

    def _checkpoint_written(
        self, step: str, state: dict[str, Any], answer: dict[str, Any] | None
    ) -> None:
        """An outcome carried the step's checkpoint: note it, or write it separately if the server
        did not take it (an older server answers without ``checkpoint``); a refusal is what a
        separate checkpoint call would have raised."""
        try:
            written = carried_checkpoint(answer)
        except LeaseLost as err:
            self._mark_lease_lost(err)
            raise
        if written is None:
            self.checkpoint(step, state)
            return
        self.state = dict(state)
        seq = written.get("seq")
        self.last_checkpoint_seq = int(seq) if seq is not None else self.last_checkpoint_seq

    def _count(self, counted: tuple[str, str, str]) -> None:
        """An effect under a default key was declared: the next one takes the next position."""
        self._declared[counted] = self._declared.get(counted, 0) + 1

    @property
    def declared_ahead(self) -> bool:
        """An effect was authorized on the previous outcome and waits for its ``ctx.effect(...)``."""
        return self._ahead.authorized

    def _hold_ahead(self, body: JSON, answer: EffectDecision | ApiError) -> None:
        self._not_dispatched(
            self._ahead.hold(body, answer), "another declaration rode on a later outcome"
        )

    def _take_ahead(self, body: JSON) -> EffectDecision | None:
        """The decision the previous outcome carried for exactly this declaration (raised if it was
        a refusal), or ``None``: declare it now. An ahead declaration for anything else is settled."""
        use, unused = self._ahead.take(body)
        self._not_dispatched(unused, "the agent declared another effect instead")
        return use

    def _settle_ahead(self, why: str) -> None:
        self._not_dispatched(self._ahead.drop(), why)

    def _not_dispatched(self, decision: EffectDecision | None, why: str) -> None:
        """An effect authorized ahead that the agent will not dispatch is recorded ``failed`` with
        ``not_dispatched``: true (the world never saw its key), so it leaves nothing unresolved."""
        if decision is None or self.lease_lost:
            return
        log.warning(
            "run %s: effect %s declared ahead was not dispatched (%s)",
            self.run_id,
            decision.idempotency_key,
            why,
        )
        try:
            self.client.record_outcome(
                decision.id,
                self.fencing_token,
                "failed",
                detail={"not_dispatched": True, "reason": why},
            )
        except ControlPlaneError as err:
            log.error("run %s: effect %s left in flight: %s", self.run_id, decision.id, err)

    def event(self, kind: str, data: dict[str, Any] | None = None) -> None:
        """Append one history event (e.g. ``message``)."""
        self.client.append_events(self.run_id, self.fencing_token, [Event(kind, data or {})])

    def record_assumption(
        self,
        key: str,
        value: Any,
        max_age_s: float | None = None,
        checker: str | None = None,
        meta: dict[str, Any] | None = None,
    ) -> None:
        """Record a fact the run relies on (price, stock, policy version) so resume can revalidate it:
        by age (``max_age_s``) or by a checker registered on the server (``checker`` name)."""
        ev = self.client.assumption_event(
            key, value, max_age_s=max_age_s, checker=checker, meta=meta
        )
        self.client.append_events(self.run_id, self.fencing_token, [ev])

    def set_timer(
        self, name: str, fire_at: _dt.datetime | str | None = None, *, in_s: float | None = None
    ) -> str:
        """Set a timer (keeps running while paused). Give ``fire_at`` or ``in_s``. Returns ``fire_at``."""
        if fire_at is None:
            if in_s is None:
                raise ValueError("set_timer needs fire_at or in_s")
            fire_at = _dt.datetime.now(_dt.UTC) + _dt.timedelta(seconds=in_s)
        when = fire_at.isoformat() if isinstance(fire_at, _dt.datetime) else str(fire_at)
        self.client.append_events(
            self.run_id, self.fencing_token, [self.client.timer_event(name, when)]
        )
        return when

    # -- approvals --------------------------------------------------------------------------------

    def request_approval(
        self,
        tool: str,
        action: str,
        args: dict[str, Any] | None,
        reason: str,
        deadline_s: float | None = None,
        required_role: str | None = None,
    ) -> str:
        """Request a planned human approval for ``tool:action`` with exactly these ``args``; returns its
        id. The run's directive becomes ``wait``. Once approved, declare the effect with the same
        ``args`` and ``approval_id=`` this id."""
        return self.client.request_approval(
            self.run_id,
            self.fencing_token,
            tool=tool,
            action=action,
            args=args,
            reason=reason,
            deadline_s=deadline_s,
            required_role=required_role,
        ).id

    def await_approval(
        self, approval_id: str, timeout: float | None = None, *, wait_s: float = 20.0
    ) -> Approval:
        """Block until the approval is decided (or ``timeout``) and return it; ``.approved`` says yes.

        Long-polls the heartbeat while the directive is ``wait``. It does not raise on pause/cancel:
        it returns the approval as it stands (maybe still ``pending``) and the next
        :meth:`check_directive` raises.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        latest: Approval | None = None
        while True:
            with self._lock:
                raw = self._approval
            if raw and str(raw.get("id")) == str(approval_id):
                latest = self.client.parse_approval(raw)
                if not latest.pending:
                    return latest
            if self.directive != Directive.WAIT:
                latest = (
                    self.client.find_approval(self.client.get_run(self.run_id), approval_id)
                    or latest
                )
                if latest and not latest.pending:
                    return latest
                if self.directive in _INTERRUPTS or self.lease_lost:
                    break
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                break
            self.wait_for_directive(
                wait_s, timeout=wait_s if remaining is None else min(wait_s, remaining)
            )
        return latest or Approval(id=str(approval_id), status="pending")

    # -- end of the attempt -----------------------------------------------------------------------

    def finish(
        self, outcome: str = "succeeded", failure_class: str | None = None, error: str | None = None
    ) -> dict[str, Any]:
        """End the attempt (``succeeded`` or ``failed`` + failure class) and stop heartbeating."""
        self._settle_ahead(f"the attempt ended ({outcome})")
        try:
            return self.client.finish(
                self.run_id, self.fencing_token, outcome, failure_class=failure_class, error=error
            )
        finally:
            self.finished = True
            self.stop_heartbeat()

    def release(self, reason: str = "") -> bool:
        """Stop heartbeating and hand the lease back: the acknowledgement of a pause or cancel at a
        step boundary. Returns whether the server accepted it (errors are logged, not raised)."""
        self._settle_ahead("the worker stopped at a boundary")
        self.stop_heartbeat()
        if self.lease_lost:
            return False
        try:
            self.client.release_lease(self.lease.id, self.fencing_token, reason)
            return True
        except ControlPlaneError as err:
            log.warning("run %s: lease release not accepted (%s)", self.run_id, err)
            return False


class Worker:
    """Claims runs for one agent under one worker identity.

    ``versions`` are sent with every claim (code/model/tool versions this worker runs);
    ``heartbeat_interval`` overrides the default of ``ttl_s / 3``.
    """

    def __init__(
        self,
        client: Client,
        worker_name: str,
        agent: str,
        *,
        versions: dict[str, Any] | None = None,
        heartbeat_interval: float | None = None,
    ) -> None:
        self.client = client
        self.worker_name = worker_name
        self.agent = agent
        self.versions = versions or {}
        self.heartbeat_interval = heartbeat_interval

    def claim(self, run_id: str, *, heartbeat: bool = True) -> RunContext:
        """Claim ``run_id`` (new attempt) and start heartbeating. Raises ``LeaseHeld``/``NotClaimable``."""
        c = self.client.claim(run_id, self.worker_name, self.versions)
        ctx = RunContext(
            self.client, c, self.worker_name, heartbeat_interval=self.heartbeat_interval
        )
        if heartbeat:
            ctx.start_heartbeat()
        return ctx

    def claim_next(self, wait_s: float = 20.0, *, heartbeat: bool = True) -> RunContext | None:
        """Wait up to ``wait_s`` for this agent's next claimable run and claim it (long-poll);
        ``None`` if none came. Raises ``NotFound`` against a server without ``/work/claim``."""
        c = self.client.claim_next(self.worker_name, [self.agent], self.versions, wait_s)
        if c is None:
            return None
        ctx = RunContext(
            self.client, c, self.worker_name, heartbeat_interval=self.heartbeat_interval
        )
        if heartbeat:
            ctx.start_heartbeat()
        return ctx

    def queued_runs(self, state: str = "queued") -> list[dict[str, Any]]:
        """Runs of this agent waiting for a worker."""
        return self.client.list_runs(agent=self.agent, state=state)
