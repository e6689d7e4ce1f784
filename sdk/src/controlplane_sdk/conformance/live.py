"""A live control plane for the conformance kit (``--url``): the operator controls the scenarios use,
made through the real API (interventions, reconciliation) with an operator token, and the worker's
client with a worker token.

Two faults are the kit's own, as they are against the in-memory control plane: an outcome "lost in
transit" (the worker's transport drops the outcome POST of the named tool's effects, as a SIGKILL
between the call and the outcome would), and an expired lease, which here is real: the kit's
attempts do not heartbeat between boundaries, so the kit waits for the server's lease expiry and
recovery to queue the run again (``LEASE_TTL_S`` plus the recovery scan).
"""

from __future__ import annotations

import json
import time
from typing import Any

import httpx

from ..client import Client
from ..errors import ApiError

__all__ = ["LiveControlPlane"]


class _LosingTransport(httpx.BaseTransport, httpx.AsyncBaseTransport):
    """The worker's transport: drops the outcome of an effect whose tool the kit marked lost.
    Async too, so an agent whose client is async (the MCP gateway's ``AsyncClient.like``) loses
    the same outcomes."""

    def __init__(self, cp: LiveControlPlane) -> None:
        self.cp, self.inner, self.ainner = cp, httpx.HTTPTransport(), httpx.AsyncHTTPTransport()

    def _drops(self, request: httpx.Request) -> bool:
        parts = request.url.path.rstrip("/").split("/")
        return (
            request.method == "POST" and parts[-1] == "outcome" and parts[-2] in self.cp._lost_ids
        )

    def _declares_lost(self, request: httpx.Request) -> bool:
        if request.method != "POST" or not request.url.path.rstrip("/").endswith("/effects"):
            return False
        body = json.loads(request.content or b"{}")
        return bool(
            {(body.get("tool"), body.get("action")), (body.get("tool"), "*")} & self.cp._lost
        )

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if self._drops(request):
            raise httpx.ConnectError("the outcome was lost in transit (conformance kit)")
        resp = self.inner.handle_request(request)
        if self.cp._lost and self._declares_lost(request):
            resp.read()
            self.cp._lost_ids.add(str(resp.json().get("id")))
        return resp

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self._drops(request):
            raise httpx.ConnectError("the outcome was lost in transit (conformance kit)")
        resp = await self.ainner.handle_async_request(request)
        if self.cp._lost and self._declares_lost(request):
            await resp.aread()
            self.cp._lost_ids.add(str(resp.json().get("id")))
        return resp

    def close(self) -> None:
        self.inner.close()

    async def aclose(self) -> None:
        await self.ainner.aclose()


class LiveControlPlane:
    """The scenarios' control plane, live (see the module docstring). One per scenario."""

    def __init__(
        self,
        url: str,
        worker_token: str,
        operator_token: str,
        *,
        agent: str,
        scopes: list[str],
        wait_s: float = 90.0,
    ) -> None:
        self.url, self.agent, self.scopes, self.wait_s = url, agent, scopes, wait_s
        self.claim_wait_s = (
            90.0  # a retried run is claimable after the server's retry backoff (slow when loaded)
        )
        self._worker_token = worker_token
        self.operator = Client(url, operator_token, timeout=20)
        self._lost: set[tuple[Any, Any]] = set()
        self._lost_ids: set[str] = set()

    def client(self) -> Client:
        return Client(self.url, self._worker_token, transport=_LosingTransport(self), backoff=0.05)

    def create_run(self, agent: str, input: dict[str, Any] | None = None) -> str:
        authority = [{"scope": s, "ttl_s": 3600} for s in self.scopes]
        with Client(self.url, self._worker_token) as worker:
            run = worker.create_run(agent, "conformance kit", input or {}, authority=authority)
        return str(run["id"])

    # -- operator controls ----------------------------------------------------------------------------

    def _until(self, what: str, done: Any, run_id: str = "") -> Any:
        deadline = time.monotonic() + self.wait_s
        while time.monotonic() < deadline:
            got = done()
            if got:
                return got
            time.sleep(0.2)
        where = f" (the run is {self.state(run_id)})" if run_id else ""
        raise TimeoutError(
            f"the live control plane: {what} did not happen in {self.wait_s:.0f}s{where}"
        )

    def _intervene(self, run_id: str, kind: str, reason: str) -> dict[str, Any]:
        """Issue the intervention and wait for its job: its effect on the run is in force then."""
        receipt = self.operator.intervene(run_id, kind, reason)
        return dict(
            self._until(
                f"the {kind} intervention's job",
                lambda: (
                    (i := self.operator.get_intervention(str(receipt["id"])))["status"] != "pending"
                    and i
                ),
            )
        )

    def pause(self, run_id: str, reason: str = "paused by the conformance kit") -> None:
        self._intervene(run_id, "pause", reason)

    def resume(self, run_id: str, reason: str = "resumed by the conformance kit") -> None:
        """Raises ``ValueError`` when revalidation blocks the resume (naming the failing checks)."""
        done = self._intervene(run_id, "resume", reason)
        job = (done.get("receipt") or {}).get("job") or {}
        if done.get("status") == "failed" or job.get("outcome") == "blocked":
            report = job.get("report") or {}
            raise ValueError(
                f"resume blocked ({self.state(run_id)}): {report.get('failing') or job}; "
                f"unresolved effects: {self._unresolved(run_id)}"
            )
        self._until("the resumed run to be queued", lambda: self.state(run_id) == "queued", run_id)

    def cancel(self, run_id: str, reason: str = "cancelled by the conformance kit") -> None:
        self._intervene(run_id, "cancel", reason)

    def retry(self, run_id: str, reason: str = "retried by the conformance kit") -> None:
        """Raises ``ValueError`` when the server refuses it (e.g. an effect nobody knows)."""
        try:
            self._intervene(run_id, "retry", reason)
        except ApiError as err:
            raise ValueError(f"retry refused: {err}") from err
        self._until("the retried run to be queued", lambda: self.state(run_id) == "queued", run_id)

    def reconcile(self, effect_id: str, outcome: str, external_ref: str = "") -> None:
        evidence = (
            f"the conformance kit's tool stand-in holds this key as {external_ref or outcome}"
        )
        self.operator.reconcile_effect(
            effect_id, outcome, evidence, "reconciled by the conformance kit", external_ref
        )
        self._lost_ids.discard(effect_id)

    def expire_lease(self, run_id: str) -> None:
        """No heartbeat comes (the kit's attempts beat only at boundaries): wait for the server's
        lease expiry and recovery to queue the run for another worker."""
        self._until("the lease to expire and the run to be queued", lambda: self.state(run_id)
                    in ("queued", "failed", "cancelled", "paused"))  # fmt: skip

    def lose_outcome(self, tool: str, action: str = "*") -> None:
        self._lost.add((tool, action))

    # -- inspection -----------------------------------------------------------------------------------

    def state(self, run_id: str) -> str:
        return str(self.operator.get_run(run_id).get("state"))

    def _unresolved(self, run_id: str) -> list[str]:
        return [f"{e.get('tool')}:{e.get('action')} {e.get('status')}" for e in self.effects(run_id)
                if e.get("status") not in ("committed", "failed", "compensated")]  # fmt: skip

    def effects(self, run_id: str) -> list[dict[str, Any]]:
        effects = [e for e in self.operator.list_effects(run_id) if e.get("decision") != "denied"]
        return sorted(effects, key=lambda e: str(e.get("created_at") or e.get("declared_at") or ""))
