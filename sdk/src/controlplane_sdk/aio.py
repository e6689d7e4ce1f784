"""``AsyncClient``: the worker protocol for agents written with asyncio, on ``httpx.AsyncClient``.

The same calls, bodies, answers, error mapping and retry rules as :class:`~controlplane_sdk.Client`
(the bodies and answers are built by ``Client``'s shared static builders, so the wire format stays
in ``client.py``); only the waiting differs: a heartbeat long-poll or a retry's backoff awaits on
the event loop instead of blocking a thread.

    async with AsyncClient("http://localhost:8000", token) as cp:
        claim = await cp.claim_next("worker-1", ["purchasing"], wait_s=20)

:class:`~controlplane_sdk.aio_runtime.AsyncWorker` and ``AsyncRunContext`` are the async runtime
(``async with ctx.step(...)``, ``async with ctx.effect(...)``, a heartbeat task).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

import httpx

from .client import API_PREFIX, Client, _items
from .errors import EffectUnresolved
from .models import Approval, Claim, EffectDecision, Event, HeartbeatReply

__all__ = ["AsyncClient"]

log = logging.getLogger("controlplane_sdk")
JSON = dict[str, Any]


class AsyncClient:
    """Asynchronous client for ``/api/v1`` (see the module docstring). ``transport`` takes an
    ``httpx.AsyncBaseTransport`` (e.g. ``FakeControlPlane().transport()`` in tests)."""

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        timeout: float = 10.0,
        retries: int = 3,
        backoff: float = 0.2,
        transport: httpx.AsyncBaseTransport | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        root = base_url.rstrip("/").removesuffix(API_PREFIX)
        self.base_url, self.timeout = root, timeout
        self.retries, self.backoff, self._sleep = max(0, retries), backoff, sleep
        self._http = httpx.AsyncClient(
            base_url=root + API_PREFIX,
            timeout=timeout,
            transport=transport,
            headers={
                "Authorization": f"Bearer {token}",
                "Accept": "application/json",
                "User-Agent": "controlplane-sdk/0.2 asyncio",
            },
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- plumbing (the same rules as Client._send) ---------------------------------------------------

    async def _send(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        params: Mapping[str, Any] | None = None,
        retry: bool,
        timeout: float | None = None,
    ) -> tuple[httpx.Response, bool]:
        headers, content, clean = Client.request_parts(body, params)
        tries, lost = 1 + self.retries, False
        for i in range(tries):
            try:
                resp = await self._http.request(
                    method, path, content=content, params=clean, headers=headers,
                    timeout=timeout if timeout is not None else httpx.USE_CLIENT_DEFAULT,
                )  # fmt: skip
            except httpx.TransportError as exc:
                lost = True
                Client.retry_or_raise(method, path, i, tries, exc, retry)
            else:
                if not Client.retry_or_raise(method, path, i, tries, resp, retry):
                    return resp, lost
            await self._sleep(Client.retry_delay(self.backoff, i))
        raise AssertionError("unreachable")  # pragma: no cover

    async def _call(self, method: str, path: str, body: Any = None, **kw: Any) -> JSON:
        resp, _ = await self._send(method, path, body, **kw)
        return Client._decode_obj(resp)

    async def _call_any(self, method: str, path: str, body: Any = None, **kw: Any) -> Any:
        resp, _ = await self._send(method, path, body, **kw)
        return Client._decode(resp)

    # -- runs ------------------------------------------------------------------------------------

    async def create_run(
        self,
        agent: str,
        goal: str,
        input: JSON | None = None,
        *,
        authority: Sequence[JSON] | None = None,
        **extra: Any,
    ) -> JSON:
        body = {
            "agent": agent,
            "goal": goal,
            "input": input or {},
            "authority": list(authority or []),
            **extra,
        }
        return await self._call("POST", "/runs", body, retry=False)

    async def get_run(self, run_id: str) -> JSON:
        return await self._call("GET", f"/runs/{run_id}", retry=True)

    async def list_runs(
        self, *, agent: str | None = None, state: str | None = None, **filters: Any
    ) -> list[JSON]:
        params = {"agent": agent, "state": state, **filters}
        return _items(await self._call_any("GET", "/runs", params=params, retry=True))

    async def list_effects(self, run_id: str) -> list[JSON]:
        return _items(await self._call_any("GET", f"/runs/{run_id}/effects", retry=True))

    async def get_history(self, run_id: str) -> list[JSON]:
        d = await self._call_any("GET", f"/runs/{run_id}/history", retry=True)
        return _items(d.get("events"))

    # -- lease -----------------------------------------------------------------------------------

    async def claim(self, run_id: str, worker: str, versions: JSON | None = None) -> Claim:
        body = {"worker": worker, "versions": versions or {}}
        d = await self._call("POST", f"/runs/{run_id}/claim", body, retry=False)
        return Client._claim_from(run_id, d)

    async def claim_next(
        self,
        worker: str,
        agents: Sequence[str] = (),
        versions: JSON | None = None,
        wait_s: float = 20.0,
    ) -> Claim | None:
        body = {
            "worker": worker,
            "agents": list(agents),
            "versions": versions or {},
            "wait_s": wait_s,
        }
        d = await self._call(
            "POST", "/work/claim", body, retry=False, timeout=self.timeout + wait_s
        )
        claim = d.get("claim")
        return None if not claim else Client._claim_from(str(claim["run_id"]), claim)

    async def heartbeat(
        self, lease_id: str, fencing_token: int, wait_s: float | None = None
    ) -> HeartbeatReply:
        body, wait = Client.heartbeat_body(fencing_token, wait_s)
        timeout = self.timeout + wait if wait else None
        path = f"/leases/{lease_id}/heartbeat"
        return Client.heartbeat_from(
            await self._call("POST", path, body, retry=True, timeout=timeout)
        )

    async def release_lease(self, lease_id: str, fencing_token: int, reason: str = "") -> JSON:
        body = {"fencing_token": fencing_token, "reason": reason}
        return await self._call("POST", f"/leases/{lease_id}/release", body, retry=True)

    # -- effects ---------------------------------------------------------------------------------

    async def declare_effect(
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
        """As :meth:`Client.declare_effect` (same refusals raised, same adoption of our own
        declaration whose answer was lost in transit)."""
        body = Client.declaration_body(
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
        resp, lost = await self._send("POST", f"/runs/{run_id}/effects", body, retry=True)
        try:
            d: Any = Client._decode_obj(resp)
        except EffectUnresolved as exc:
            d = exc
        ledger = await self.list_effects(run_id) if lost else []
        return Client._decision(
            resp.status_code, d, lost, idempotency_key, attempt_id, lambda: ledger
        )

    async def record_outcome(
        self,
        effect_id: str,
        fencing_token: int,
        status: str,
        *,
        external_ref: str | None = None,
        detail: Any = None,
        checkpoint: tuple[str, JSON] | None = None,
    ) -> JSON:
        body = Client.outcome_body(fencing_token, status, external_ref, detail, checkpoint)
        return await self._call("POST", f"/effects/{effect_id}/outcome", body, retry=True)

    # -- history, checkpoints, approvals, finish ------------------------------------------------

    async def checkpoint(self, run_id: str, fencing_token: int, step: str, state: JSON) -> JSON:
        body = {"fencing_token": fencing_token, "step": step, "state": state}
        return await self._call("POST", f"/runs/{run_id}/checkpoints", body, retry=True)

    async def append_events(
        self, run_id: str, fencing_token: int, events: Iterable[Event | Mapping[str, Any]]
    ) -> JSON:
        body = Client.events_body(fencing_token, events)
        return await self._call("POST", f"/runs/{run_id}/events", body, retry=False)

    async def request_approval(
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
        body = Client.approval_body(
            fencing_token, tool, action, args, reason, deadline_s, required_role
        )
        d = await self._call("POST", f"/runs/{run_id}/approvals", body, retry=False)
        return Client.parse_approval(d)

    async def finish(
        self,
        run_id: str,
        fencing_token: int,
        outcome: str,
        *,
        failure_class: str | None = None,
        error: str | None = None,
    ) -> JSON:
        body = Client.finish_body(fencing_token, outcome, failure_class, error)
        return await self._call("POST", f"/runs/{run_id}/finish", body, retry=False)

    # -- operator calls ----------------------------------------------------------------------------

    async def intervene(
        self,
        run_id: str,
        kind: str,
        reason: str,
        scope: str = "run",
        options: JSON | None = None,
        override_reason: str | None = None,
    ) -> JSON:
        body = Client._intervention_body(kind, reason, scope, options, override_reason)
        return await self._call("POST", f"/runs/{run_id}/interventions", body, retry=False)

    async def decide_approval(
        self, run_id: str, approval_id: str, approve: bool, reason: str
    ) -> JSON:
        kind = "approve" if approve else "reject"
        return await self.intervene(run_id, kind, reason, options={"approval_id": approval_id})
