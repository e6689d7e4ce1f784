"""HTTP client for the control plane's worker protocol (docs/concepts/worker-protocol.md).

The calls themselves (paths, bodies, answers, retries) are written once, without I/O, in
``_core.py``; this client sends them on a blocking ``httpx.Client`` and :class:`AsyncClient`
(``aio.py``) awaits the very same calls. The runtime (``runtime.py``, ``effects.py``, ``loop.py``)
only uses the typed methods below. (Operator calls — interventions, reconciliation — are in
``operator_calls.py``.)

Retries: transient failures (connection errors, timeouts, 502/503/504) are retried with a small
exponential backoff **only** for calls that are safe to repeat: reads, heartbeat, outcome recording,
checkpoint, and effect declaration (the server dedupes a declaration by idempotency key + request
fingerprint and answers a repeat with the recorded effect). ``create_run``, ``claim``, ``append_events``,
``request_approval`` and ``finish`` are sent once; a transport failure there raises
:class:`ServerUnreachable` and the caller decides -- unless a draining replica refused it unread
(``X-Controlplane-Draining``): it did nothing, so every call is sent again then.
"""

from __future__ import annotations

import datetime as _dt
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

import httpx

from . import _core as core
from ._core import API_PREFIX, Backoff, Op, effect_attempt_id
from .errors import ApiError
from .models import Approval, Claim, EffectDecision, Event, HeartbeatReply
from .operator_calls import OperatorCalls

__all__ = ["Client", "API_PREFIX", "effect_attempt_id"]

log = logging.getLogger("controlplane_sdk")

JSON = dict[str, Any]
T = TypeVar("T")
_items = core.items  # kept for callers of the old private name


class Client(OperatorCalls):
    """Synchronous client for ``/api/v1``.

    ``base_url`` is the server root (``http://localhost:8000``); a trailing ``/api/v1`` is accepted too.
    ``token`` is the worker's (or operator's) bearer token. ``timeout`` is the per-request timeout in
    seconds; heartbeat long-polls add their ``wait_s`` to it. ``retries``/``backoff`` tune the retry of
    idempotent calls; ``transport`` lets tests inject ``httpx.MockTransport``.

    The client is thread-safe (one ``httpx.Client`` shared by the heartbeat thread and the agent).
    """

    # The bodies and answers, for callers that build or read them themselves (the asyncio
    # runtime, adapters): one definition each, in _core.
    request_parts = staticmethod(core.request_parts)
    retry_or_raise = staticmethod(core.retry_or_raise)
    retry_delay = staticmethod(core.retry_delay)
    heartbeat_body = staticmethod(core.heartbeat_body)
    heartbeat_from = staticmethod(core.heartbeat_from)
    declaration_body = staticmethod(core.declaration_body)
    outcome_body = staticmethod(core.outcome_body)
    approval_body = staticmethod(core.approval_body)
    finish_body = staticmethod(core.finish_body)
    events_body = staticmethod(core.events_body)
    assumption_event = staticmethod(core.assumption_event)
    timer_event = staticmethod(core.timer_event)
    parse_approval = staticmethod(core.parse_approval)
    find_approval = staticmethod(core.find_approval)
    _claim_from = staticmethod(core.claim_from)
    _decode = staticmethod(core.decode)
    _decode_obj = staticmethod(core.decode_obj)

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        timeout: float = 10.0,
        retries: int = 3,
        backoff: float = 0.2,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.base_url = core.root_url(base_url)
        self.timeout = timeout
        self.retries = max(0, retries)
        self.backoff = backoff
        self._token, self._transport = token, transport  # for AsyncClient.like(self)
        self._sleep = sleep
        self._p = core.Protocol(timeout=timeout, retries=retries, backoff=backoff)
        self._http = httpx.Client(
            base_url=self.base_url + API_PREFIX,
            timeout=timeout,
            transport=transport,
            headers=core.default_headers(token, "controlplane-sdk/0.2"),
        )

    # -- plumbing -------------------------------------------------------------------------------

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self, op: Op[T]) -> T:
        """Drive one call of ``_core`` to its result: send its tries, sleep its backoffs."""
        got: core.Answer = None
        try:
            while True:
                step = op.send(got)
                if isinstance(step, Backoff):
                    self._sleep(step.seconds)
                    got = None
                    continue
                try:
                    got = self._http.request(
                        step.method, step.path, content=step.content, params=step.params,
                        headers=step.headers,
                        timeout=httpx.USE_CLIENT_DEFAULT if step.timeout is None else step.timeout,
                    )  # fmt: skip
                except httpx.TransportError as exc:
                    got = exc
        except StopIteration as done:
            return done.value

    def _send(
        self, method: str, path: str, body: Any = None, **kw: Any
    ) -> tuple[httpx.Response, bool]:
        """Send one logical call; returns ``(response, a_try_failed_in_transit)``."""
        return self._run(self._p.send(method, path, body, **kw))

    def _call_any(self, method: str, path: str, body: Any = None, *, retry: bool, **kw: Any) -> Any:
        return self._run(self._p.call_any(method, path, body, retry=retry, **kw))

    def _call(self, method: str, path: str, body: Any = None, *, retry: bool, **kw: Any) -> JSON:
        return self._run(self._p.call(method, path, body, retry=retry, **kw))

    # -- runs -----------------------------------------------------------------------------------

    def create_run(
        self,
        agent: str,
        goal: str,
        input: JSON | None = None,
        *,
        parent_run_id: str | None = None,
        versions: JSON | None = None,
        authority: Sequence[JSON] | None = None,
        deadline: str | _dt.datetime | None = None,
        **extra: Any,
    ) -> JSON:
        """``POST /runs`` → the new run (``{"id", "state": "queued", …}``). Not retried."""
        body = {
            "agent": agent,
            "goal": goal,
            "input": input or {},
            "parent_run_id": parent_run_id,
            "versions": versions or {},
            "authority": list(authority or []),
            "deadline": deadline,
            **extra,
        }
        return self._run(self._p.create_run(body))

    def get_run(self, run_id: str) -> JSON:
        """``GET /runs/{id}``."""
        return self._run(self._p.get_run(run_id))

    def list_runs(
        self, *, agent: str | None = None, state: str | None = None, **filters: Any
    ) -> list[JSON]:
        """``GET /runs?agent=…&state=…`` → list of runs (bare list or ``{"items": [...]}`` accepted)."""
        return self._run(self._p.list_runs({"agent": agent, "state": state, **filters}))

    def get_history(self, run_id: str) -> list[JSON]:
        """``GET /runs/{id}/history`` → the run's events, oldest first (``kind``, ``data``, …)."""
        return self._run(self._p.get_history(run_id))

    def list_effects(self, run_id: str) -> list[JSON]:
        """``GET /runs/{id}/effects`` → the run's ledger."""
        return self._run(self._p.list_effects(run_id))

    # -- lease ----------------------------------------------------------------------------------

    def claim(self, run_id: str, worker: str, versions: JSON | None = None) -> Claim:
        """``POST /runs/{id}/claim``: take the lease for a new attempt. Raises ``LeaseHeld``/``NotClaimable``."""
        return self._run(self._p.claim(run_id, worker, versions))

    def claim_next(
        self,
        worker: str,
        agents: Sequence[str] = (),
        versions: JSON | None = None,
        wait_s: float = 20.0,
    ) -> Claim | None:
        """``POST /work/claim``: the oldest claimable run of ``agents`` (default: every agent the token
        may act for), claimed for ``worker``; waits up to ``wait_s`` for one (long-poll). ``None`` if
        none became claimable in time. Raises ``NotFound`` against a server without the endpoint."""
        return self._run(self._p.claim_next(worker, agents, versions, wait_s))

    def heartbeat(
        self, lease_id: str, fencing_token: int, wait_s: float | None = None
    ) -> HeartbeatReply:
        """``POST /leases/{id}/heartbeat``; with ``wait_s`` the server may hold the request until the
        directive changes (long-poll). Raises ``LeaseLost`` when the lease is gone."""
        return self._run(self._p.heartbeat(lease_id, fencing_token, wait_s))

    def release_lease(self, lease_id: str, fencing_token: int, reason: str = "") -> JSON:
        """``POST /leases/{id}/release`` (step 8 of docs/concepts/worker-protocol.md): acknowledge a
        pause/cancel at a step boundary and hand the lease back, so the run is not treated as orphaned."""
        return self._run(self._p.release_lease(lease_id, fencing_token, reason))

    # -- effects --------------------------------------------------------------------------------

    def declare_effect(
        self,
        run_id: str,
        fencing_token: int,
        *,
        step: str,
        tool: str,
        action: str,
        idempotency_key: str,
        args: JSON | None = None,
        compensation: JSON | None = None,
        irreversible: bool = False,
        approval_id: str | None = None,
        attempt_id: str | None = None,
    ) -> EffectDecision:
        """``POST /runs/{id}/effects``: ask for authority *before* dispatching.

        Returns an :class:`EffectDecision` (``authorized`` or ``replayed`` + ``committed``). Raises
        ``EffectDenied`` (nothing may be dispatched), ``IdempotencyKeyReused`` (same key, other args),
        ``EffectUnresolved`` (an earlier effect with this key is ``in_flight``/``unknown``) or
        ``EffectAlreadyFailed`` (it is recorded ``failed``: use a new key to try again).
        ``approval_id`` cites a granted approval for an action that required one.

        Retried on transient errors. If a try was lost in transit and the server then says the key is
        unresolved, the SDK checks the ledger: an ``in_flight`` effect with this key owned by
        ``attempt_id`` (our own attempt) is our declaration whose response was lost, and is adopted
        (``adopted=True``) instead of raising.
        """
        body = core.declaration_body(
            fencing_token, step=step, tool=tool, action=action, idempotency_key=idempotency_key,
            args=args, compensation=compensation, irreversible=irreversible,
            approval_id=approval_id,
        )  # fmt: skip
        return self._run(self._p.declare_effect(run_id, body, attempt_id))

    def record_outcome(
        self,
        effect_id: str,
        fencing_token: int,
        status: str,
        *,
        external_ref: str | None = None,
        detail: Any = None,
        checkpoint: tuple[str, JSON] | None = None,
        next_effect: JSON | None = None,
    ) -> JSON:
        """``POST /effects/{id}/outcome`` with ``committed``/``failed``/``unknown``. Always accepted by
        the server (flagged ``late``/``stale_lease`` when after pause or from a fenced-out lease).

        Fewer round trips, when the server supports them: ``checkpoint=(step, state)`` writes the
        step's checkpoint in the outcome's transaction (the answer's ``"checkpoint"``: the checkpoint
        written, or an error object if it was refused: the outcome is recorded anyway);
        ``next_effect`` (a ``declare_effect`` body: step, tool, action, idempotency_key, args, …) is
        the next declaration on the same run, decided right after (the answer's ``"next"``, with the
        ``http_status`` a separate declaration would have had). A server that does not know them
        answers without those keys: the caller then makes the separate calls."""
        body = core.outcome_body(fencing_token, status, external_ref, detail, checkpoint)
        if next_effect is not None:
            body["next"] = {"fencing_token": fencing_token, "args": {}, **next_effect}
        return self._run(self._p.record_outcome(effect_id, body))

    def record_outcome_and_declare(
        self,
        run_id: str,
        effect_id: str,
        fencing_token: int,
        status: str,
        next_effect: JSON,
        *,
        external_ref: str | None = None,
        detail: Any = None,
        checkpoint: tuple[str, JSON] | None = None,
        attempt_id: str | None = None,
    ) -> tuple[JSON, EffectDecision | ApiError | None]:
        """:meth:`record_outcome` carrying ``next_effect`` (a :meth:`declaration_body`): one round trip
        for this effect's outcome (and checkpoint) and the next declaration on the same run.

        Returns ``(outcome answer, next)``: ``next`` is what :meth:`declare_effect` would have
        returned (an :class:`EffectDecision`) or raised (the exception, returned, not raised: the
        outcome is recorded either way), or ``None`` when the server did not decide it (an older
        server, or one that refused the carried body itself): then declare separately."""
        body = core.outcome_body(fencing_token, status, external_ref, detail, checkpoint)
        op = self._p.record_outcome_and_declare(run_id, effect_id, body, next_effect, attempt_id)
        return self._run(op)

    # -- history, checkpoints, approvals, finish ------------------------------------------------

    def checkpoint(self, run_id: str, fencing_token: int, step: str, state: JSON) -> JSON:
        """``POST /runs/{id}/checkpoints`` → ``{"seq", …}``."""
        return self._run(self._p.checkpoint(run_id, fencing_token, step, state))

    def append_events(
        self, run_id: str, fencing_token: int, events: Iterable[Event | Mapping[str, Any]]
    ) -> JSON:
        """``POST /runs/{id}/events`` with ``[{"kind", "data"}, …]``. Not retried (no dedupe key)."""
        return self._run(self._p.append_events(run_id, fencing_token, events))

    def request_approval(
        self,
        run_id: str,
        fencing_token: int,
        *,
        tool: str,
        action: str,
        args: JSON | None,
        reason: str,
        deadline_s: float | None = None,
        required_role: str | None = None,
    ) -> Approval:
        """``POST /runs/{id}/approvals`` → a pending :class:`Approval`. Not retried."""
        body = core.approval_body(
            fencing_token, tool, action, args, reason, deadline_s, required_role
        )
        return self._run(self._p.request_approval(run_id, body))

    def finish(
        self,
        run_id: str,
        fencing_token: int,
        outcome: str,
        *,
        failure_class: str | None = None,
        error: str | None = None,
    ) -> JSON:
        """``POST /runs/{id}/finish``: end the attempt ``succeeded`` or ``failed``. Not retried."""
        body = core.finish_body(fencing_token, outcome, failure_class, error)
        return self._run(self._p.finish(run_id, body))
