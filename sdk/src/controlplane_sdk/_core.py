"""The worker protocol without I/O: every call's request, its retries and backoff, and what its
answer means, written once for :class:`~controlplane_sdk.Client` and
:class:`~controlplane_sdk.AsyncClient` (so their semantics cannot drift apart).

A call is a generator (an :data:`Op`): it yields :class:`Try` (send this request; the client sends
back the ``httpx.Response``, or the ``httpx.TransportError`` the try ended in) and :class:`Backoff`
(wait this long; sent back ``None``), and returns the call's result. A client is then one small
driver loop, blocking or awaited (``Client._run``, ``AsyncClient._run``); a call that needs a second
request (a declaration whose answer was lost in transit reads the ledger) simply yields again.

This module is the **one place** that knows the protocol's paths, bodies and field names
(docs/concepts/worker-protocol.md).
"""

from __future__ import annotations

import json
import logging
import math
import random
import uuid
from collections.abc import Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

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
from .tracing import traceparent

log = logging.getLogger("controlplane_sdk")

API_PREFIX = "/api/v1"
RETRY_STATUSES = frozenset({502, 503, 504})
DRAINING_HEADER = "X-Controlplane-Draining"  # the server's "refused unread, send it again"
# The worker protocol this SDK speaks, sent on every call: a server that does not speak it answers
# 400 protocol_version_unsupported naming both versions instead of misreading the call.
PROTOCOL_HEADER = "X-Controlplane-Protocol"
PROTOCOL_VERSION = 1
MAX_WAIT_S = 60.0  # the server refuses longer heartbeat long-polls
JSON = dict[str, Any]
T = TypeVar("T")


@dataclass(frozen=True)
class Try:
    """Send this request once; the driver sends back the response or the transport error."""

    method: str
    path: str
    content: bytes | None
    params: dict[str, Any] | None
    headers: dict[str, str]
    timeout: float | None  # None: the client's default


@dataclass(frozen=True)
class Backoff:
    """Wait ``seconds`` before the next try."""

    seconds: float


Answer = httpx.Response | httpx.TransportError | None
Op = Generator[Try | Backoff, Answer, T]


def root_url(base_url: str) -> str:
    """The server root of ``base_url`` (a trailing ``/api/v1`` is accepted too)."""
    return base_url.rstrip("/").removesuffix(API_PREFIX)


def default_headers(token: str, agent: str) -> dict[str, str]:
    return {
        "Authorization": f"Bearer {token}",
        "Accept": "application/json",
        "User-Agent": agent,
        PROTOCOL_HEADER: str(PROTOCOL_VERSION),
    }


def default_key(
    run_id: str, step: str, tool: str, action: str, declared: Mapping[tuple[str, str, str], int]
) -> tuple[str, tuple[str, str, str]]:
    """An effect's default idempotency key, the call's identity: ``run:step:tool:action`` for the
    first such effect in this execution of the step, ``…:2``, ``…:3`` for the next ones
    (``declared`` counts those declared so far). Returns the key and what to count it under."""
    counted = (step, tool, action)
    position = declared.get(counted, 0) + 1
    key = f"{run_id}:{step}:{tool}:{action}" + (f":{position}" if position > 1 else "")
    return key, counted


# -- the answers ------------------------------------------------------------------------------------


def items(data: Any) -> list[JSON]:
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


def decode(resp: httpx.Response) -> Any:
    """The answer's JSON, or the exception its error answer means."""
    try:
        data = resp.json() if resp.content else {}
    except ValueError:
        data = None
    if resp.status_code >= 400:
        raise error_from_response(resp.status_code, data, resp.text)
    if data is None:
        raise ApiError(resp.status_code, "bad_response", resp.text[:500])
    return data


def decode_obj(resp: httpx.Response) -> JSON:
    data = decode(resp)
    if not isinstance(data, dict):
        raise ApiError(
            resp.status_code, "bad_response", f"expected a JSON object, got {type(data).__name__}"
        )
    return data


def effect_attempt_id(effect: Mapping[str, Any]) -> str | None:
    """The attempt an effect belongs to (``attempt_id``, ``attempt: {id}`` or ``attempt: id``)."""
    v = effect.get("attempt_id", effect.get("attempt"))
    if isinstance(v, Mapping):
        v = v.get("id")
    return None if v is None else str(v)


def claim_from(run_id: str, d: JSON) -> Claim:
    a, le, cp = d.get("attempt") or {}, d.get("lease") or {}, d.get("checkpoint")
    return Claim(
        run_id=str(run_id),
        attempt=Attempt(id=str(a.get("id")), number=int(a.get("number") or 0)),
        lease=Lease(
            id=str(le.get("id")),
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


def heartbeat_from(d: JSON) -> HeartbeatReply:
    approval, timers = d.get("approval"), d.get("timers_fired")
    return HeartbeatReply(
        directive=str(d.get("directive") or "continue"),
        reason=str(d.get("reason") or ""),
        expires_at=d.get("expires_at"),
        approval=approval if isinstance(approval, dict) else None,
        timers_fired=items(timers),
        raw=d,
    )


def parse_approval(d: Mapping[str, Any]) -> Approval:
    decided_by = d.get("decided_by")
    if isinstance(decided_by, Mapping):
        decided_by = decided_by.get("username") or decided_by.get("id")
    return Approval(
        id=str(d.get("id")),
        status=str(d.get("status") or "pending"),
        reason=d.get("decision_reason", d.get("reason")),
        decided_by=None if decided_by is None else str(decided_by),
        raw=dict(d),
    )


def find_approval(run: Mapping[str, Any], approval_id: str) -> Approval | None:
    """Find an approval in a run payload (``approvals: [...]`` or ``pending_approval``/``approval``)."""
    pool: list[Any] = list(run.get("approvals") or [])
    pool += [
        run.get(k) for k in ("pending_approval", "approval") if isinstance(run.get(k), Mapping)
    ]
    for a in pool:
        if isinstance(a, Mapping) and str(a.get("id")) == str(approval_id):
            return parse_approval(a)
    return None


# -- the bodies -------------------------------------------------------------------------------------


def heartbeat_body(fencing_token: int, wait_s: float | None) -> tuple[JSON, float | None]:
    """The heartbeat's body and its long-poll (capped at the server's limit)."""
    body: JSON = {"fencing_token": fencing_token}
    if wait_s:
        body["wait_s"] = wait_s = min(float(wait_s), MAX_WAIT_S)
    return body, (float(wait_s) if wait_s else None)


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


def finish_body(
    fencing_token: int, outcome: str, failure_class: str | None, error: str | None
) -> JSON:
    return {
        "fencing_token": fencing_token,
        "outcome": outcome,
        "failure_class": failure_class or "",
        "error": error or "",
    }


def events_body(fencing_token: int, events: Iterable[Event | Mapping[str, Any]]) -> JSON:
    evs = [
        {"kind": e.kind, "data": e.data}
        if isinstance(e, Event)
        else {"kind": e["kind"], "data": e.get("data") or {}}
        for e in events
    ]
    return {"fencing_token": fencing_token, "events": evs}


def intervention_body(
    kind: str, reason: str, scope: str, options: JSON | None, override_reason: str | None
) -> JSON:
    body: JSON = {"kind": kind, "reason": reason, "scope": scope, "options": options or {}}
    if override_reason:
        body["override_reason"] = override_reason
    return body


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


def timer_event(name: str, fire_at: str) -> Event:
    """History event setting a timer (``kind: "timer_set"``)."""
    return Event("timer_set", {"name": name, "fire_at": fire_at})


# -- retries ----------------------------------------------------------------------------------------


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


def retry_or_raise(
    method: str,
    path: str,
    i: int,
    tries: int,
    got: httpx.Response | httpx.TransportError,
    retry: bool,
) -> bool:
    """Whether try ``i`` of ``tries`` is to be tried again; a transport failure that is not retried
    raises ``ServerUnreachable``. Retried when ``retry``: transport failures and 502/503/504. Any
    call is sent again when a draining replica refused it unread (X-Controlplane-Draining, a
    rolling restart): it did nothing, and behind a load balancer the next try reaches another
    replica."""
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


def retry_delay(backoff: float, i: int) -> float:
    """Exponential backoff with jitter before try ``i + 1``."""
    return backoff * (2**i) * (0.5 + random.random() / 2)


class Protocol:
    """The protocol's calls as :data:`Op` generators, with one client's retry settings."""

    def __init__(self, *, timeout: float, retries: int, backoff: float) -> None:
        self.timeout, self.retries, self.backoff = timeout, max(0, retries), backoff

    # -- plumbing -----------------------------------------------------------------------------------

    def send(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        params: Mapping[str, Any] | None = None,
        retry: bool,
        timeout: float | None = None,
    ) -> Op[tuple[httpx.Response, bool]]:
        """One logical call with its retries: ``(response, a_try_failed_in_transit)``."""
        headers, content, clean = request_parts(body, params)
        tries, lost = 1 + self.retries, False
        for i in range(tries):
            got = yield Try(method, path, content, clean, headers, timeout)
            assert got is not None
            if isinstance(got, httpx.TransportError):
                lost = True
            if not retry_or_raise(method, path, i, tries, got, retry):
                assert isinstance(got, httpx.Response)
                return got, lost
            yield Backoff(retry_delay(self.backoff, i))
        raise AssertionError("unreachable")  # pragma: no cover

    def call(self, method: str, path: str, body: Any = None, **kw: Any) -> Op[JSON]:
        resp, _ = yield from self.send(method, path, body, **kw)
        return decode_obj(resp)

    def call_any(self, method: str, path: str, body: Any = None, **kw: Any) -> Op[Any]:
        resp, _ = yield from self.send(method, path, body, **kw)
        return decode(resp)

    # -- runs ---------------------------------------------------------------------------------------

    def create_run(self, body: JSON) -> Op[JSON]:
        return (yield from self.call("POST", "/runs", body, retry=False))

    def get_run(self, run_id: str) -> Op[JSON]:
        return (yield from self.call("GET", f"/runs/{run_id}", retry=True))

    def list_runs(self, params: Mapping[str, Any]) -> Op[list[JSON]]:
        return items((yield from self.call_any("GET", "/runs", params=params, retry=True)))

    def get_history(self, run_id: str) -> Op[list[JSON]]:
        d = yield from self.call_any("GET", f"/runs/{run_id}/history", retry=True)
        return items(d.get("events"))

    def list_effects(self, run_id: str) -> Op[list[JSON]]:
        return items((yield from self.call_any("GET", f"/runs/{run_id}/effects", retry=True)))

    # -- lease --------------------------------------------------------------------------------------

    def claim(self, run_id: str, worker: str, versions: JSON | None) -> Op[Claim]:
        body = {"worker": worker, "versions": versions or {}}
        d = yield from self.call("POST", f"/runs/{run_id}/claim", body, retry=False)
        return claim_from(run_id, d)

    def claim_next(
        self, worker: str, agents: Sequence[str], versions: JSON | None, wait_s: float
    ) -> Op[Claim | None]:
        body: JSON = {"worker": worker, "agents": list(agents), "versions": versions or {}}
        body["wait_s"] = wait_s
        timeout = self.timeout + wait_s
        d = yield from self.call("POST", "/work/claim", body, retry=False, timeout=timeout)
        claim = d.get("claim")
        return None if not claim else claim_from(str(claim["run_id"]), claim)

    def heartbeat(
        self, lease_id: str, fencing_token: int, wait_s: float | None
    ) -> Op[HeartbeatReply]:
        body, wait = heartbeat_body(fencing_token, wait_s)
        timeout = self.timeout + wait if wait else None
        path = f"/leases/{lease_id}/heartbeat"
        return heartbeat_from(
            (yield from self.call("POST", path, body, retry=True, timeout=timeout))
        )

    def release_lease(self, lease_id: str, fencing_token: int, reason: str) -> Op[JSON]:
        body = {"fencing_token": fencing_token, "reason": reason}
        return (yield from self.call("POST", f"/leases/{lease_id}/release", body, retry=True))

    # -- effects ------------------------------------------------------------------------------------

    def declare_effect(self, run_id: str, body: JSON, attempt_id: str | None) -> Op[EffectDecision]:
        """A declaration (``body``: :func:`declaration_body`) as a decision, or the refusal raised;
        see :meth:`Client.declare_effect`."""
        resp, lost = yield from self.send("POST", f"/runs/{run_id}/effects", body, retry=True)
        try:
            d: JSON | EffectUnresolved = decode_obj(resp)
        except EffectUnresolved as exc:
            d = exc
        key = str(body["idempotency_key"])
        return (yield from self.decision(run_id, resp.status_code, d, lost, key, attempt_id))

    def _own_in_flight(
        self,
        run_id: str,
        key: str,
        effect_id: Any,
        attempt_id: str | None,
        known: JSON | None = None,
    ) -> Op[JSON | None]:
        """Our own attempt's in-flight effect with this key (a declaration whose answer was lost);
        reads the run's ledger unless ``known`` says whose the effect is."""
        if attempt_id is None:
            return None
        if known and effect_attempt_id(known):
            candidates = [known]
        else:
            candidates = yield from self.list_effects(run_id)
        for e in candidates:
            if e.get("idempotency_key") != key or (
                effect_id is not None and str(e.get("id")) != str(effect_id)
            ):
                continue
            if e.get("status") == "in_flight" and effect_attempt_id(e) == str(attempt_id):
                return e
        return None

    def decision(
        self,
        run_id: str,
        status_code: int,
        d: JSON | EffectUnresolved,
        lost: bool,
        idempotency_key: str,
        attempt_id: str | None,
    ) -> Op[EffectDecision]:
        """A declaration's answer (``d``, or the ``EffectUnresolved`` it raised) as a decision, or
        the exception a declaration raises. ``lost``: a try of the call was lost in transit, so an
        unresolved effect of our own attempt with this key may be our own declaration."""
        adopted = False
        if isinstance(d, EffectUnresolved):
            own = None
            if lost:
                own = yield from self._own_in_flight(
                    run_id, idempotency_key, d.effect_id, attempt_id
                )
            if own is None:
                raise d
            d, adopted = {**own, "decision": "authorized"}, True
        decision = str(d.get("decision") or ("authorized" if status_code == 201 else "replayed"))
        status = str(d.get("status") or "in_flight")
        if decision == "denied":
            raise EffectDenied(status_code, "denied", d.get("detail"), d)
        if decision == "replayed" and status in ("in_flight", "unknown"):
            own = None
            if lost:
                own = yield from self._own_in_flight(
                    run_id, idempotency_key, d.get("id"), attempt_id, d
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
            id=str(d.get("id")),
            decision=decision,
            status=status,
            idempotency_key=str(d.get("idempotency_key") or idempotency_key),
            external_ref=d.get("external_ref"),
            outcome_detail=d.get("outcome_detail", d.get("detail")),
            adopted=adopted,
            raw=d,
        )

    def record_outcome(self, effect_id: str, body: JSON) -> Op[JSON]:
        return (yield from self.call("POST", f"/effects/{effect_id}/outcome", body, retry=True))

    def record_outcome_and_declare(
        self, run_id: str, effect_id: str, body: JSON, next_effect: JSON, attempt_id: str | None
    ) -> Op[tuple[JSON, EffectDecision | ApiError | None]]:
        """The outcome (``body``) carrying the next declaration; see
        :meth:`Client.record_outcome_and_declare`."""
        body = {**body, "next": {**next_effect, "fencing_token": body["fencing_token"]}}
        path = f"/effects/{effect_id}/outcome"
        resp, lost = yield from self.send("POST", path, body, retry=True)
        try:
            answer = decode_obj(resp)
        except InvalidRequest as err:
            if not str(err.payload.get("field") or "").startswith("next"):
                raise
            # The carried declaration alone was refused (nothing was recorded): the outcome goes
            # alone, and the separate declaration will raise that refusal where the agent expects it.
            del body["next"]
            return (yield from self.call("POST", path, body, retry=True)), None
        ride = answer.get("next")
        if not isinstance(ride, Mapping) or "http_status" not in ride:
            return answer, None
        code = int(ride["http_status"])
        d = {k: v for k, v in ride.items() if k != "http_status"}
        key = str(next_effect["idempotency_key"])
        try:
            if code >= 400:  # exactly what the separate call's error answer raises
                raise error_from_response(code, d)
            return answer, (yield from self.decision(run_id, code, d, lost, key, attempt_id))
        except EffectUnresolved as err:
            try:
                return answer, (yield from self.decision(run_id, code, err, lost, key, attempt_id))
            except ApiError as still:
                return answer, still
        except ApiError as err:
            return answer, err

    # -- history, checkpoints, approvals, finish -------------------------------------------------

    def checkpoint(self, run_id: str, fencing_token: int, step: str, state: JSON) -> Op[JSON]:
        body = {"fencing_token": fencing_token, "step": step, "state": state}
        return (yield from self.call("POST", f"/runs/{run_id}/checkpoints", body, retry=True))

    def append_events(
        self, run_id: str, fencing_token: int, events: Iterable[Event | Mapping[str, Any]]
    ) -> Op[JSON]:
        body = events_body(fencing_token, events)
        return (yield from self.call("POST", f"/runs/{run_id}/events", body, retry=False))

    def request_approval(self, run_id: str, body: JSON) -> Op[Approval]:
        d = yield from self.call("POST", f"/runs/{run_id}/approvals", body, retry=False)
        return parse_approval(d)

    def finish(self, run_id: str, body: JSON) -> Op[JSON]:
        return (yield from self.call("POST", f"/runs/{run_id}/finish", body, retry=False))

    # -- operator calls -----------------------------------------------------------------------------

    def intervene(self, run_id: str, body: JSON, *, preview: bool = False) -> Op[JSON]:
        path = f"/runs/{run_id}/interventions" + ("/preview" if preview else "")
        return (yield from self.call("POST", path, body, retry=preview))
