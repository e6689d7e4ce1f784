"""HTTP client for the control plane's worker protocol (docs/concepts/worker-protocol.md).

This module is the **one place** that knows the worker protocol's paths, request bodies and response
field names; the runtime (``runtime.py``, ``effects.py``, ``loop.py``) only uses the typed methods below.
(Operator calls — interventions, reconciliation — are in ``operator_calls.py``.)

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
import json
import logging
import math
import random
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import httpx

from ._util import json_default, now_iso
from .errors import (
    ApiError,
    EffectAlreadyFailed,
    EffectDenied,
    EffectUnresolved,
    InvalidRequest,
    ServerUnreachable,
    error_from_response,
)
from .models import (
    Approval,
    Attempt,
    Checkpoint,
    Claim,
    EffectDecision,
    Event,
    HeartbeatReply,
    Lease,
)
from .operator_calls import OperatorCalls
from .tracing import traceparent

__all__ = ["Client", "API_PREFIX"]

log = logging.getLogger("controlplane_sdk")

API_PREFIX = "/api/v1"
RETRY_STATUSES = frozenset({502, 503, 504})
DRAINING_HEADER = "X-Controlplane-Draining"  # the server's "refused unread, send it again"
MAX_WAIT_S = 60.0  # the server refuses longer heartbeat long-polls
JSON = dict[str, Any]


def _sid(v: Any) -> str:
    return str(v)


def _items(data: Any) -> list[JSON]:
    """Lists may come bare or wrapped (``items``/``results``/``runs``/``effects``)."""
    if isinstance(data, dict):
        data = next(
            (
                data[k]
                for k in ("items", "results", "runs", "effects", "data")
                if isinstance(data.get(k), list)
            ),
            [],
        )
    return [x for x in data if isinstance(x, dict)] if isinstance(data, list) else []


def effect_attempt_id(effect: Mapping[str, Any]) -> str | None:
    """The attempt an effect belongs to (``attempt_id``, ``attempt: {id}`` or ``attempt: id``)."""
    v = effect.get("attempt_id", effect.get("attempt"))
    if isinstance(v, Mapping):
        v = v.get("id")
    return None if v is None else str(v)


def _own_in_flight(
    ledger: Callable[[], list[JSON]],
    key: str,
    effect_id: Any,
    attempt_id: str | None,
    known: JSON | None = None,
) -> JSON | None:
    """Our own attempt's in-flight effect with this key (a declaration whose answer was lost)."""
    if attempt_id is None:
        return None
    candidates = [known] if known and effect_attempt_id(known) else ledger()
    for e in candidates:
        if e.get("idempotency_key") != key or (
            effect_id is not None and str(e.get("id")) != str(effect_id)
        ):
            continue
        if e.get("status") == "in_flight" and effect_attempt_id(e) == str(attempt_id):
            return e
    return None


class Client(OperatorCalls):
    """Synchronous client for ``/api/v1``.

    ``base_url`` is the server root (``http://localhost:8000``); a trailing ``/api/v1`` is accepted too.
    ``token`` is the worker's (or operator's) bearer token. ``timeout`` is the per-request timeout in
    seconds; heartbeat long-polls add their ``wait_s`` to it. ``retries``/``backoff`` tune the retry of
    idempotent calls; ``transport`` lets tests inject ``httpx.MockTransport``.

    The client is thread-safe (one ``httpx.Client`` shared by the heartbeat thread and the agent).
    """

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
        root = base_url.rstrip("/")
        if root.endswith(API_PREFIX):
            root = root[: -len(API_PREFIX)]
        self.base_url = root
        self.timeout = timeout
        self.retries = max(0, retries)
        self.backoff = backoff
        self._sleep = sleep
        self._http = httpx.Client(
            base_url=root + API_PREFIX,
            timeout=timeout,
            transport=transport,
            headers={
                "Authorization": f"Bearer {token}",
                "Accept": "application/json",
                "User-Agent": "controlplane-sdk/0.1",
            },
        )

    # -- plumbing -------------------------------------------------------------------------------

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _send(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        params: Mapping[str, Any] | None = None,
        retry: bool,
        timeout: float | None = None,
    ) -> tuple[httpx.Response, bool]:
        """Send one logical call; returns ``(response, a_try_failed_in_transit)``."""
        headers, content, clean = self.request_parts(body, params)
        tries, lost = 1 + self.retries, False
        for i in range(tries):
            try:
                resp = self._http.request(
                    method, path, content=content, params=clean, headers=headers,
                    timeout=timeout if timeout is not None else httpx.USE_CLIENT_DEFAULT,
                )  # fmt: skip
            except httpx.TransportError as exc:
                lost = True
                self.retry_or_raise(method, path, i, tries, exc, retry)
            else:
                if not self.retry_or_raise(method, path, i, tries, resp, retry):
                    return resp, lost
            self._sleep(self.retry_delay(self.backoff, i))
        raise AssertionError("unreachable")  # pragma: no cover

    # The retry rules, shared with the asyncio client (aio.py).

    @staticmethod
    def request_parts(
        body: Any, params: Mapping[str, Any] | None
    ) -> tuple[dict[str, str], bytes | None, dict[str, Any] | None]:
        """Headers (a request id shared by the call's tries, the trace), body bytes, params."""
        headers = {"X-Request-ID": uuid.uuid4().hex, "traceparent": traceparent()}
        content = None
        if body is not None:
            content = json.dumps(body, default=json_default).encode()
            headers["Content-Type"] = "application/json"
        clean = {k: v for k, v in (params or {}).items() if v is not None}
        return headers, content, clean or None

    @staticmethod
    def retry_or_raise(
        method: str,
        path: str,
        i: int,
        tries: int,
        got: httpx.Response | httpx.TransportError,
        retry: bool = True,
    ) -> bool:
        """Whether try ``i`` of ``tries`` is to be tried again; a transport failure that is not
        retried raises ``ServerUnreachable``. Retried when ``retry``: transport failures and
        502/503/504. Any call is sent again when a draining replica refused it unread
        (X-Controlplane-Draining, a rolling restart): it did nothing, and behind a load balancer
        the next try reaches another replica."""
        last = i + 1 >= tries
        if isinstance(got, httpx.TransportError):
            if last or not retry:
                raise ServerUnreachable(f"{method} {path}: {type(got).__name__}: {got}") from got
            log.warning("%s %s failed (%s); retrying", method, path, type(got).__name__)
            return True
        if not last and got.headers.get(DRAINING_HEADER) == "1":
            log.warning("%s %s -> %s (draining); retrying", method, path, got.status_code)
            return True
        if retry and got.status_code in RETRY_STATUSES and not last:
            log.warning("%s %s -> %s; retrying", method, path, got.status_code)
            return True
        return False

    @staticmethod
    def retry_delay(backoff: float, i: int) -> float:
        """Exponential backoff with jitter before try ``i + 1``."""
        return backoff * (2**i) * (0.5 + random.random() / 2)

    @staticmethod
    def _decode(resp: httpx.Response) -> Any:
        try:
            data = resp.json() if resp.content else {}
        except ValueError:
            data = None
        if resp.status_code >= 400:
            raise error_from_response(resp.status_code, data, resp.text)
        if data is None:
            raise ApiError(resp.status_code, "bad_response", resp.text[:500])
        return data

    @classmethod
    def _decode_obj(cls, resp: httpx.Response) -> JSON:
        data = cls._decode(resp)
        if not isinstance(data, dict):
            raise ApiError(
                resp.status_code,
                "bad_response",
                f"expected a JSON object, got {type(data).__name__}",
            )
        return data

    def _call_any(self, method: str, path: str, body: Any = None, *, retry: bool, **kw: Any) -> Any:
        resp, _ = self._send(method, path, body, retry=retry, **kw)
        return self._decode(resp)

    def _call(self, method: str, path: str, body: Any = None, *, retry: bool, **kw: Any) -> JSON:
        resp, _ = self._send(method, path, body, retry=retry, **kw)
        return self._decode_obj(resp)

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
        return self._call("POST", "/runs", body, retry=False)

    # The bodies and answers of the calls, shared with the asyncio client (aio.py).

    @staticmethod
    def heartbeat_body(fencing_token: int, wait_s: float | None) -> tuple[JSON, float | None]:
        """The heartbeat's body and its long-poll (capped at the server's limit)."""
        body: JSON = {"fencing_token": fencing_token}
        if wait_s:
            body["wait_s"] = wait_s = min(float(wait_s), MAX_WAIT_S)
        return body, (float(wait_s) if wait_s else None)

    @staticmethod
    def heartbeat_from(d: JSON) -> HeartbeatReply:
        approval, timers = d.get("approval"), d.get("timers_fired")
        return HeartbeatReply(
            directive=str(d.get("directive") or "continue"),
            reason=str(d.get("reason") or ""),
            expires_at=d.get("expires_at"),
            approval=approval if isinstance(approval, dict) else None,
            timers_fired=_items(timers),
            raw=d,
        )

    @staticmethod
    def outcome_body(
        fencing_token: int,
        status: str,
        external_ref: str | None,
        detail: Any,
        checkpoint: tuple[str, JSON] | None,
    ) -> JSON:
        """The body of ``POST /effects/{id}/outcome`` (without ``next``)."""
        if detail is not None and not isinstance(detail, Mapping):
            detail = {"value": detail}  # the server stores an object
        body: JSON = {
            "fencing_token": fencing_token,
            "status": status,
            "external_ref": external_ref or "",
            "detail": dict(detail or {}),
        }
        if checkpoint is not None:
            body["checkpoint"] = {"step": checkpoint[0], "state": dict(checkpoint[1] or {})}
        return body

    @staticmethod
    def approval_body(
        fencing_token: int,
        tool: str,
        action: str,
        args: JSON | None,
        reason: str,
        deadline_s: float | None,
        required_role: str | None,
    ) -> JSON:
        body: JSON = {
            "fencing_token": fencing_token,
            "tool": tool,
            "action": action,
            "args": args or {},
            "reason": reason,
            "deadline_s": None if deadline_s is None else math.ceil(deadline_s),
        }
        if required_role is not None:
            body["required_role"] = required_role
        return body

    @staticmethod
    def finish_body(
        fencing_token: int, outcome: str, failure_class: str | None, error: str | None
    ) -> JSON:
        return {
            "fencing_token": fencing_token,
            "outcome": outcome,
            "failure_class": failure_class or "",
            "error": error or "",
        }

    @staticmethod
    def events_body(fencing_token: int, events: Iterable[Event | Mapping[str, Any]]) -> JSON:
        evs = [
            {"kind": e.kind, "data": e.data}
            if isinstance(e, Event)
            else {"kind": e["kind"], "data": e.get("data") or {}}
            for e in events
        ]
        return {"fencing_token": fencing_token, "events": evs}

    def get_run(self, run_id: str) -> JSON:
        """``GET /runs/{id}``."""
        return self._call("GET", f"/runs/{run_id}", retry=True)

    def list_runs(
        self, *, agent: str | None = None, state: str | None = None, **filters: Any
    ) -> list[JSON]:
        """``GET /runs?agent=…&state=…`` → list of runs (bare list or ``{"items": [...]}`` accepted)."""
        params = {"agent": agent, "state": state, **filters}
        return _items(self._call_any("GET", "/runs", params=params, retry=True))

    def get_history(self, run_id: str) -> list[JSON]:
        """``GET /runs/{id}/history`` → the run's events, oldest first (``kind``, ``data``, …)."""
        return _items(self._call_any("GET", f"/runs/{run_id}/history", retry=True).get("events"))

    def list_effects(self, run_id: str) -> list[JSON]:
        """``GET /runs/{id}/effects`` → the run's ledger."""
        return _items(self._call_any("GET", f"/runs/{run_id}/effects", retry=True))

    # -- lease ----------------------------------------------------------------------------------

    def claim(self, run_id: str, worker: str, versions: JSON | None = None) -> Claim:
        """``POST /runs/{id}/claim``: take the lease for a new attempt. Raises ``LeaseHeld``/``NotClaimable``."""
        d = self._call(
            "POST",
            f"/runs/{run_id}/claim",
            {"worker": worker, "versions": versions or {}},
            retry=False,
        )
        return self._claim_from(run_id, d)

    @staticmethod
    def _claim_from(run_id: str, d: JSON) -> Claim:
        a, le, cp = d.get("attempt") or {}, d.get("lease") or {}, d.get("checkpoint")
        return Claim(
            run_id=str(run_id),
            attempt=Attempt(id=_sid(a.get("id")), number=int(a.get("number") or 0)),
            lease=Lease(
                id=_sid(le.get("id")),
                fencing_token=int(le["fencing_token"]),
                expires_at=le.get("expires_at"),
                ttl_s=le.get("ttl_s"),
            ),
            checkpoint=None
            if not cp
            else Checkpoint(
                seq=int(cp.get("seq") or 0), step=cp.get("step"), state=dict(cp.get("state") or {})
            ),
            directive=str(d.get("directive") or "continue"),
            raw=d,
        )

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
        d = self._call(
            "POST",
            "/work/claim",
            {
                "worker": worker,
                "agents": list(agents),
                "versions": versions or {},
                "wait_s": wait_s,
            },
            retry=False,
            timeout=self.timeout + wait_s,
        )
        claim = d.get("claim")
        return None if not claim else self._claim_from(str(claim["run_id"]), claim)

    def heartbeat(
        self, lease_id: str, fencing_token: int, wait_s: float | None = None
    ) -> HeartbeatReply:
        """``POST /leases/{id}/heartbeat``; with ``wait_s`` the server may hold the request until the
        directive changes (long-poll). Raises ``LeaseLost`` when the lease is gone."""
        body, wait = self.heartbeat_body(fencing_token, wait_s)
        timeout = self.timeout + wait if wait else None
        d = self._call("POST", f"/leases/{lease_id}/heartbeat", body, retry=True, timeout=timeout)
        return self.heartbeat_from(d)

    def release_lease(self, lease_id: str, fencing_token: int, reason: str = "") -> JSON:
        """``POST /leases/{id}/release`` (step 8 of docs/concepts/worker-protocol.md): acknowledge a
        pause/cancel at a step boundary and hand the lease back, so the run is not treated as orphaned."""
        body = {"fencing_token": fencing_token, "reason": reason}
        return self._call("POST", f"/leases/{lease_id}/release", body, retry=True)

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
        body = self.declaration_body(
            fencing_token,
            step=step,
            tool=tool,
            action=action,
            idempotency_key=idempotency_key,
            args=args,
            compensation=compensation,
            irreversible=irreversible,
            approval_id=approval_id,
        )
        resp, lost = self._send("POST", f"/runs/{run_id}/effects", body, retry=True)
        try:
            d: Any = self._decode_obj(resp)
        except EffectUnresolved as exc:
            d = exc
        return self._decision(
            resp.status_code,
            d,
            lost,
            idempotency_key,
            attempt_id,
            lambda: self.list_effects(run_id),
        )

    @staticmethod
    def declaration_body(
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
    ) -> JSON:
        """The body of ``POST /runs/{id}/effects`` (also what an outcome's ``next`` carries)."""
        body: JSON = {
            "fencing_token": fencing_token,
            "step": step,
            "tool": tool,
            "action": action,
            "idempotency_key": idempotency_key,
            "args": args or {},
            "compensation": compensation,
            "irreversible": irreversible,
        }
        if approval_id is not None:
            body["approval_id"] = approval_id
        return body

    @staticmethod
    def _decision(
        status_code: int,
        d: JSON | EffectUnresolved,
        lost: bool,
        idempotency_key: str,
        attempt_id: str | None,
        ledger: Callable[[], list[JSON]],
    ) -> EffectDecision:
        """A declaration's answer (``d``, or the ``EffectUnresolved`` it raised) as a decision, or
        the exception a declaration raises. ``lost``: a try of the call was lost in transit, so an
        unresolved effect of our own attempt with this key may be our own declaration (``ledger``
        reads the run's effects to find it)."""
        adopted = False
        if isinstance(d, EffectUnresolved):
            own = _own_in_flight(ledger, idempotency_key, d.effect_id, attempt_id) if lost else None
            if own is None:
                raise d
            d, adopted = {**own, "decision": "authorized"}, True
        decision = str(d.get("decision") or ("authorized" if status_code == 201 else "replayed"))
        status = str(d.get("status") or "in_flight")
        if decision == "denied":
            raise EffectDenied(status_code, "denied", d.get("detail"), d)
        if decision == "replayed" and status in ("in_flight", "unknown"):
            own = (
                _own_in_flight(ledger, idempotency_key, d.get("id"), attempt_id, d)
                if lost
                else None
            )
            if own is None:
                raise EffectUnresolved(
                    status_code,
                    "effect_unresolved",
                    f"effect {d.get('id')} with this key is {status}",
                    {**d, "effect_id": d.get("id")},
                )
            decision, adopted = "authorized", True
        if decision == "replayed" and status == "failed":
            raise EffectAlreadyFailed(
                status_code,
                "effect_already_failed",
                f"effect {d.get('id')} with this key is recorded failed",
                d,
            )
        return EffectDecision(
            id=_sid(d.get("id")),
            decision=decision,
            status=status,
            idempotency_key=str(d.get("idempotency_key") or idempotency_key),
            external_ref=d.get("external_ref"),
            outcome_detail=d.get("outcome_detail", d.get("detail")),
            adopted=adopted,
            raw=d,
        )

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
        body = self.outcome_body(fencing_token, status, external_ref, detail, checkpoint)
        if next_effect is not None:
            body["next"] = {"fencing_token": fencing_token, "args": {}, **next_effect}
        return self._call("POST", f"/effects/{effect_id}/outcome", body, retry=True)

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
        body = self.outcome_body(fencing_token, status, external_ref, detail, checkpoint)
        body["next"] = {**next_effect, "fencing_token": fencing_token}
        path = f"/effects/{effect_id}/outcome"
        resp, lost = self._send("POST", path, body, retry=True)
        try:
            answer = self._decode_obj(resp)
        except InvalidRequest as err:
            if not str(err.payload.get("field") or "").startswith("next"):
                raise
            # The carried declaration alone was refused (nothing was recorded): the outcome goes
            # alone, and the separate declaration will raise that refusal where the agent expects it.
            del body["next"]
            return self._call("POST", path, body, retry=True), None
        ride = answer.get("next")
        if not isinstance(ride, Mapping) or "http_status" not in ride:
            return answer, None
        code = int(ride["http_status"])

        def ledger() -> list[JSON]:
            return self.list_effects(run_id)

        d = {k: v for k, v in ride.items() if k != "http_status"}
        key = str(next_effect["idempotency_key"])
        try:
            if code >= 400:  # exactly what the separate call's error answer raises
                raise error_from_response(code, d)
            return answer, self._decision(code, d, lost, key, attempt_id, ledger)
        except EffectUnresolved as err:
            try:
                return answer, self._decision(code, err, lost, key, attempt_id, ledger)
            except ApiError as still:
                return answer, still
        except ApiError as err:
            return answer, err

    # -- history, checkpoints, approvals, finish ------------------------------------------------

    def checkpoint(self, run_id: str, fencing_token: int, step: str, state: JSON) -> JSON:
        """``POST /runs/{id}/checkpoints`` → ``{"seq", …}``."""
        body = {"fencing_token": fencing_token, "step": step, "state": state}
        return self._call("POST", f"/runs/{run_id}/checkpoints", body, retry=True)

    def append_events(
        self, run_id: str, fencing_token: int, events: Iterable[Event | Mapping[str, Any]]
    ) -> JSON:
        """``POST /runs/{id}/events`` with ``[{"kind", "data"}, …]``. Not retried (no dedupe key)."""
        body = self.events_body(fencing_token, events)
        return self._call("POST", f"/runs/{run_id}/events", body, retry=False)

    @staticmethod
    def assumption_event(
        key: str,
        value: Any,
        *,
        max_age_s: float | None = None,
        checker: str | None = None,
        meta: JSON | None = None,
        observed_at: str | None = None,
    ) -> Event:
        """History event recording an assumption (``kind: "assumption"``)."""
        return Event(
            "assumption",
            {
                "key": key,
                "value": value,
                "max_age_s": max_age_s,
                "checker": checker,
                "meta": meta or {},
                "observed_at": observed_at or now_iso(),
            },
        )

    @staticmethod
    def timer_event(name: str, fire_at: str) -> Event:
        """History event setting a timer (``kind: "timer_set"``)."""
        return Event("timer_set", {"name": name, "fire_at": fire_at})

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
        body = self.approval_body(
            fencing_token, tool, action, args, reason, deadline_s, required_role
        )
        return self.parse_approval(
            self._call("POST", f"/runs/{run_id}/approvals", body, retry=False)
        )

    @staticmethod
    def parse_approval(d: Mapping[str, Any]) -> Approval:
        decided_by = d.get("decided_by")
        if isinstance(decided_by, Mapping):
            decided_by = decided_by.get("username") or decided_by.get("id")
        return Approval(
            id=_sid(d.get("id")),
            status=str(d.get("status") or "pending"),
            reason=d.get("decision_reason", d.get("reason")),
            decided_by=None if decided_by is None else str(decided_by),
            raw=dict(d),
        )

    @staticmethod
    def find_approval(run: Mapping[str, Any], approval_id: str) -> Approval | None:
        """Find an approval in a run payload (``approvals: [...]`` or ``pending_approval``/``approval``)."""
        pool: list[Any] = list(run.get("approvals") or [])
        pool += [
            run.get(k) for k in ("pending_approval", "approval") if isinstance(run.get(k), Mapping)
        ]
        for a in pool:
            if isinstance(a, Mapping) and str(a.get("id")) == str(approval_id):
                return Client.parse_approval(a)
        return None

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
        body = self.finish_body(fencing_token, outcome, failure_class, error)
        return self._call("POST", f"/runs/{run_id}/finish", body, retry=False)
