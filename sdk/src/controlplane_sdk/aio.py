"""``AsyncClient``: the worker protocol for agents written with asyncio, on ``httpx.AsyncClient``.

The same calls as :class:`~controlplane_sdk.Client`, not a copy of them: both drive the calls of
``_core.py`` (request, retries, backoff, what the answer means), this one awaiting each try and
backoff on the event loop instead of blocking a thread.

    async with AsyncClient("http://localhost:8000", token) as cp:
        claim = await cp.claim_next("worker-1", ["purchasing"], wait_s=20)

:class:`~controlplane_sdk.aio_loop.AsyncWorker` and ``AsyncRunContext`` are the async runtime
(``async with ctx.step(...)``, ``async with ctx.effect(...)``, a heartbeat task).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import httpx

from . import _core as core
from ._core import API_PREFIX, Backoff, Op
from .errors import ApiError
from .models import Approval, Claim, EffectDecision, Event, HeartbeatReply

if TYPE_CHECKING:
    from .client import Client

__all__ = ["AsyncClient"]

log = logging.getLogger("controlplane_sdk")
JSON = dict[str, Any]
T = TypeVar("T")


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
        self.base_url, self.timeout = core.root_url(base_url), timeout
        self.retries, self.backoff, self._sleep = max(0, retries), backoff, sleep
        self._p = core.Protocol(timeout=timeout, retries=retries, backoff=backoff)
        self._http = httpx.AsyncClient(
            base_url=self.base_url + API_PREFIX,
            timeout=timeout,
            transport=transport,
            headers=core.default_headers(token, "controlplane-sdk/0.2 asyncio"),
        )

    @classmethod
    def like(cls, client: Client) -> AsyncClient:
        """An async client to the same server with the same token and settings as ``client`` (and
        its transport, if that serves async requests too, as ``httpx.MockTransport`` does)."""
        transport = client._transport
        return cls(
            client.base_url,
            client._token,
            timeout=client.timeout,
            retries=client.retries,
            backoff=client.backoff,
            transport=transport if isinstance(transport, httpx.AsyncBaseTransport) else None,
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _run(self, op: Op[T]) -> T:
        """Drive one call of ``_core`` to its result: await its tries and its backoffs."""
        got: core.Answer = None
        try:
            while True:
                step = op.send(got)
                if isinstance(step, Backoff):
                    await self._sleep(step.seconds)
                    got = None
                    continue
                try:
                    got = await self._http.request(
                        step.method, step.path, content=step.content, params=step.params,
                        headers=step.headers,
                        timeout=httpx.USE_CLIENT_DEFAULT if step.timeout is None else step.timeout,
                    )  # fmt: skip
                except httpx.TransportError as exc:
                    got = exc
        except StopIteration as done:
            return done.value

    async def _call(self, method: str, path: str, body: Any = None, **kw: Any) -> JSON:
        return await self._run(self._p.call(method, path, body, **kw))

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
        body: JSON = {"agent": agent, "goal": goal, "input": input or {}}
        body |= {"authority": list(authority or []), **extra}
        return await self._run(self._p.create_run(body))

    async def get_run(self, run_id: str) -> JSON:
        return await self._run(self._p.get_run(run_id))

    async def list_runs(
        self, *, agent: str | None = None, state: str | None = None, **filters: Any
    ) -> list[JSON]:
        return await self._run(self._p.list_runs({"agent": agent, "state": state, **filters}))

    async def list_effects(self, run_id: str) -> list[JSON]:
        return await self._run(self._p.list_effects(run_id))

    async def get_history(self, run_id: str) -> list[JSON]:
        return await self._run(self._p.get_history(run_id))

    # -- lease -----------------------------------------------------------------------------------

    async def claim(self, run_id: str, worker: str, versions: JSON | None = None) -> Claim:
        return await self._run(self._p.claim(run_id, worker, versions))

    async def claim_next(
        self,
        worker: str,
        agents: Sequence[str] = (),
        versions: JSON | None = None,
        wait_s: float = 20.0,
    ) -> Claim | None:
        return await self._run(self._p.claim_next(worker, agents, versions, wait_s))

    async def heartbeat(
        self, lease_id: str, fencing_token: int, wait_s: float | None = None
    ) -> HeartbeatReply:
        return await self._run(self._p.heartbeat(lease_id, fencing_token, wait_s))

    async def release_lease(self, lease_id: str, fencing_token: int, reason: str = "") -> JSON:
        return await self._run(self._p.release_lease(lease_id, fencing_token, reason))

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
        """As :meth:`Client.declare_effect` (the same refusals raised, the same adoption of our own
        declaration whose answer was lost in transit)."""
        body = core.declaration_body(
            fencing_token, step=step, tool=tool, action=action, idempotency_key=idempotency_key,
            args=args, compensation=compensation, irreversible=irreversible,
            approval_id=approval_id,
        )  # fmt: skip
        return await self._run(self._p.declare_effect(run_id, body, attempt_id))

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
        body = core.outcome_body(fencing_token, status, external_ref, detail, checkpoint)
        return await self._run(self._p.record_outcome(effect_id, body))

    async def record_outcome_and_declare(
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
        """As :meth:`Client.record_outcome_and_declare`: the outcome carrying the next declaration."""
        body = core.outcome_body(fencing_token, status, external_ref, detail, checkpoint)
        op = self._p.record_outcome_and_declare(run_id, effect_id, body, next_effect, attempt_id)
        return await self._run(op)

    # -- history, checkpoints, approvals, finish ------------------------------------------------

    async def checkpoint(self, run_id: str, fencing_token: int, step: str, state: JSON) -> JSON:
        return await self._run(self._p.checkpoint(run_id, fencing_token, step, state))

    async def append_events(
        self, run_id: str, fencing_token: int, events: Iterable[Event | Mapping[str, Any]]
    ) -> JSON:
        return await self._run(self._p.append_events(run_id, fencing_token, events))

    async def request_approval(
        self, run_id: str, fencing_token: int, *, tool: str, action: str, args: JSON | None,
        reason: str, deadline_s: float | None = None, required_role: str | None = None,
    ) -> Approval:  # fmt: skip
        body = core.approval_body(
            fencing_token, tool, action, args, reason, deadline_s, required_role
        )
        return await self._run(self._p.request_approval(run_id, body))

    async def finish(
        self,
        run_id: str,
        fencing_token: int,
        outcome: str,
        *,
        failure_class: str | None = None,
        error: str | None = None,
    ) -> JSON:
        body = core.finish_body(fencing_token, outcome, failure_class, error)
        return await self._run(self._p.finish(run_id, body))

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
        body = core.intervention_body(kind, reason, scope, options, override_reason)
        return await self._run(self._p.intervene(run_id, body))

    async def decide_approval(
        self, run_id: str, approval_id: str, approve: bool, reason: str
    ) -> JSON:
        kind = "approve" if approve else "reject"
        return await self.intervene(run_id, kind, reason, options={"approval_id": approval_id})

    async def preview_intervention(
        self,
        run_id: str,
        kind: str,
        reason: str,
        scope: str = "run",
        options: JSON | None = None,
        override_reason: str | None = None,
    ) -> JSON:
        """``POST /runs/{id}/interventions/preview`` (``scope``: ``run`` or ``tree``)."""
        body = core.intervention_body(kind, reason, scope, options, override_reason)
        return await self._call("POST", f"/runs/{run_id}/interventions/preview", body, retry=True)

    async def get_intervention(self, intervention_id: str) -> JSON:
        """``GET /interventions/{id}``: receipt and job results."""
        return await self._call("GET", f"/interventions/{intervention_id}", retry=True)

    async def reconcile_effect(
        self,
        effect_id: str,
        outcome: str,
        evidence: str,
        reason: str,
        external_ref: str | None = None,
    ) -> JSON:
        """``POST /effects/{id}/reconcile`` with evidence (operator; not retried)."""
        body = {"outcome": outcome, "evidence": evidence, "reason": reason,
                "external_ref": external_ref or ""}  # fmt: skip
        return await self._call("POST", f"/effects/{effect_id}/reconcile", body, retry=False)
