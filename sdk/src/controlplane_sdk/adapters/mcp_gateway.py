"""An MCP gateway: an MCP server in front of real MCP tool servers, serving one run. Every
``tools/call`` is declared as an effect of the run before it reaches the tool server, so any
MCP-speaking agent is governed with no code change.

    gateway = McpGateway(ctx, {"payments": "http://127.0.0.1:9001/mcp"})  # or a Server, or stdio params
    async with gateway:                       # connects to every upstream tool server
        await gateway.serve_stdio()           # or serve_http(port=...), or mcp.Client(gateway.server)

or, as a process: ``controlplane-mcp-gateway --run RUN_ID --upstream
payments=http://127.0.0.1:9001/mcp --http 8765`` (``python -m
controlplane_sdk.adapters.mcp_serve``; see that module).

* Tools are listed as ``<upstream>__<tool>``; a call is declared as tool ``<upstream>``, action
  ``<tool>``, args the call's arguments, under the run's authority grants (scope
  ``"<upstream>:<tool>"``).
* Pause and resume: a call made while the run is paused is declared anyway, so the control plane
  refuses it and audits the refusal; the client gets a tool error saying the run is paused and why
  (or, with ``pause_wait_s``, the call waits up to that long for the resume). The gateway hands the
  lease back at the first moment no call is in flight, so the run reaches ``paused``; once an
  operator resumes it, the gateway claims the run again (a new attempt) and calls go through.
* A gateway process that died: start another for the same run; it claims the run once the old lease
  has expired and recovery has queued it again (``claim_wait_s``).
* Call identity: a call's idempotency key is the client's ``_meta["controlplane/key"]`` if it sends
  one, else the call's position among the run's calls of that tool (``…:payments__charge:3``). Two
  identical calls are two effects. A call retried after the gateway died takes the position of the
  one that was in flight, so it is a replay (or, if its outcome is unknown, refused until an
  operator reconciles it), never a second dispatch.
* The tool server receives the effect's idempotency key with each call, in
  ``_meta["controlplane/idempotency_key"]``: a tool that talks to an external system passes it on,
  so a replay cannot do it twice and reconciliation can ask about it.
* A call the server says needs approval (``approval_required``) requests one and waits for the
  decision; a rejection is a tool error.
* The tool server's whole result (content and ``structuredContent``) is the outcome: ``committed``,
  ``failed`` (an error result), or ``unknown`` (timeout or a broken connection: the call may have
  happened). A replayed call returns that recorded result; the tool server is not called twice.
"""

from __future__ import annotations

import asyncio
import logging
import re
from contextlib import AsyncExitStack
from typing import Any, cast

import mcp.types as types
from mcp import Client
from mcp.server import Server

from ..aio import AsyncClient
from ..aio_runtime import AsyncRunContext
from ..client import Client as SyncControlPlane
from ..errors import (
    ClaimRefused,
    ControlPlaneError,
    EffectAlreadyFailed,
    EffectDenied,
    EffectUnresolved,
    IdempotencyKeyReused,
    LeaseLost,
    OutcomeNotRecorded,
)
from ..runtime import RunContext
from .mcp_results import PAUSED, error, plain, positions, refusal_text, replayed

__all__ = ["McpGateway", "KEY_META", "UPSTREAM_KEY_META", "SEP"]

log = logging.getLogger("controlplane_sdk.mcp")

SEP = "__"


def canonical_name(name: str) -> str:
    """The server takes tool and action names in one form only (lowercase a-z 0-9 _ . -, see the
    server's docs/security/hardening.md, "Names"): an MCP tool ``getWeather`` is declared
    ``getweather``; the upstream is still called by its own name."""
    text = re.sub(r"[^a-z0-9_.\-]", "_", name.casefold()).lstrip("_.-")
    return text[:100] or "tool"


#: ``_meta`` entry a client may send with ``tools/call``: the call's own identity (its tool-call id)
KEY_META = "controlplane/key"
#: ``_meta`` entry the gateway sends the tool server with each call: the effect's idempotency key,
#: for the tool to dedupe on and for reconciliation to ask about
UPSTREAM_KEY_META = "controlplane/idempotency_key"
_UNKNOWN_ON = (TimeoutError, asyncio.TimeoutError, OSError)


class McpGateway:
    """An MCP server that governs one run's tool calls (see the module docstring).

    Give ``ctx`` (a claimed :class:`AsyncRunContext`, or a sync :class:`RunContext`, whose attempt
    the gateway then carries on the event loop), or ``client`` (an :class:`AsyncClient`, or a sync
    ``Client`` whose server and token it uses) and ``run_id``: the gateway then claims the run
    itself on entry, waiting up to ``claim_wait_s`` for it to become claimable. Every control-plane
    call is awaited on the loop (``AsyncClient``): no thread is spent on the gateway's calls."""

    def __init__(
        self,
        ctx: AsyncRunContext | RunContext | None,
        upstreams: dict[str, Any],
        *,
        client: AsyncClient | SyncControlPlane | None = None,
        run_id: str | None = None,
        worker_name: str = "mcp-gateway",
        versions: dict[str, Any] | None = None,
        call_timeout_s: float = 30.0,
        approval_timeout_s: float | None = None,
        pause_wait_s: float = 0.0,
        claim_wait_s: float = 60.0,
        watch_interval_s: float = 1.0,
        name: str = "controlplane-gateway",
    ) -> None:
        if ctx is None and (client is None or run_id is None):
            raise ValueError("McpGateway needs a claimed ctx, or client= and run_id=")
        self._sync_ctx = ctx if isinstance(ctx, RunContext) else None
        given = client if client is not None else ctx.client  # type: ignore[union-attr]
        self._own_client = isinstance(given, SyncControlPlane)
        self.client: AsyncClient = (
            AsyncClient.like(given) if isinstance(given, SyncControlPlane) else given
        )
        self.ctx: AsyncRunContext | None = None
        if isinstance(ctx, RunContext):  # its attempt, carried on the loop from here on
            self.ctx = AsyncRunContext(self.client, ctx.claim_result, ctx.worker_name)
        elif ctx is not None:
            self.ctx = ctx
        self.run_id: str = run_id or ctx.run_id  # type: ignore[union-attr]
        self.worker_name = ctx.worker_name if ctx is not None else worker_name
        self.versions = versions or {}
        self.upstreams = upstreams
        self.call_timeout_s = call_timeout_s
        self.approval_timeout_s = approval_timeout_s
        self.pause_wait_s = pause_wait_s
        self.claim_wait_s = claim_wait_s
        self.watch_interval_s = watch_interval_s
        self.clients: dict[str, Client] = {}
        self._stack = AsyncExitStack()
        self._lock = asyncio.Lock()  # one claim or release at a time
        self._in_flight = 0
        self._released = False  # the lease was handed back (pause/cancel acknowledged)
        self._stopped_why = ""  # the operator's reason for the pause/cancel we acknowledged
        self._positions: dict[str, int] = {}  # tool -> position of its next call in the run
        self._watcher: asyncio.Task[None] | None = None
        self.server: Server[Any] = Server(
            name, on_list_tools=self._list_tools, on_call_tool=self._call_tool
        )

    # -- lifecycle ---------------------------------------------------------------------------------

    async def __aenter__(self) -> McpGateway:
        for name, target in self.upstreams.items():
            self.clients[name] = await self._stack.enter_async_context(Client(target))
        if self._sync_ctx is not None and self._sync_ctx._thread is not None:
            self._sync_ctx.stop_heartbeat()  # the loop's heartbeat task takes over
            assert self.ctx is not None
            self.ctx.start_heartbeat()
        if self.ctx is None:
            await self._claim(wait_s=self.claim_wait_s)
        await self._learn_positions()
        self._watcher = asyncio.create_task(self._watch())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
        await self._stack.aclose()
        if self.ctx is not None:
            await self.ctx.stop_heartbeat()
        if self._own_client:
            await self.client.aclose()

    async def serve_stdio(self) -> None:
        from mcp.server.stdio import stdio_server

        async with stdio_server() as (read, write):
            await self.server.run(read, write, self.server.create_initialization_options())

    async def serve_http(
        self, host: str = "127.0.0.1", port: int = 8765, path: str = "/mcp", **uvicorn_kw: Any
    ) -> None:
        """Serve the gateway over MCP's streamable HTTP transport at ``http://host:port/path``."""
        import uvicorn

        app = self.server.streamable_http_app(streamable_http_path=path, host=host)
        config = uvicorn.Config(app, host=host, port=port, log_level="warning", **uvicorn_kw)
        await uvicorn.Server(config).serve()

    async def finish(self, outcome: str = "succeeded", error: str | None = None) -> dict[str, Any]:
        """End the run's attempt (the agent is done). Claims the run again first if a pause and
        resume took it away in between."""
        async with self._lock:
            ctx = await self._holding()
            failure = None if outcome == "succeeded" else "error"
            answer = await ctx.finish(outcome, failure, error)
            given = self._sync_ctx
            if given is not None and given.attempt.id == ctx.attempt.id:
                given.finished = True  # the attempt the caller's run loop holds is ended
            return answer

    # -- the lease ---------------------------------------------------------------------------------

    async def _claim(self, wait_s: float) -> AsyncRunContext | None:
        """Claim the run (a new attempt); wait up to ``wait_s`` while it is not claimable yet."""
        deadline = asyncio.get_running_loop().time() + wait_s
        while True:
            try:
                claim = await self.client.claim(self.run_id, self.worker_name, self.versions)
            except ClaimRefused:
                if asyncio.get_running_loop().time() >= deadline:
                    if self.ctx is None:
                        raise
                    return None
                await asyncio.sleep(min(self.watch_interval_s, 1.0))
                continue
            old, self.ctx = self.ctx, AsyncRunContext(self.client, claim, self.worker_name)
            if old is not None:
                await old.stop_heartbeat()
            self.ctx.start_heartbeat()
            self._released, self._stopped_why = False, ""
            log.info("run %s: claimed (attempt %s)", self.run_id, claim.attempt.number)
            return self.ctx

    async def _holding(self) -> AsyncRunContext:
        """The context of a lease we hold; claims the run again if it was taken away."""
        ctx = self.ctx
        if ctx is not None and not ctx.lease_lost and not self._released:
            return ctx
        fresh = await self._reclaimed()
        if fresh is None:
            raise LeaseLost(409, "lease_lost", "the gateway holds no lease on the run")
        return fresh

    async def _let_go(self, why: str) -> None:
        """Acknowledge a pause or cancel: hand the lease back, so the run reaches paused/cancelled."""
        ctx = self.ctx
        if ctx is None or self._released:
            return
        self._released, self._stopped_why = True, why
        await ctx.release(f"MCP gateway stopped between calls: {why}")

    async def _watch(self) -> None:
        """Between calls: hand the lease back on pause/cancel, claim the run again after resume."""
        while True:
            await asyncio.sleep(self.watch_interval_s)
            try:
                async with self._lock:
                    await self._watch_once()
            except ControlPlaneError as err:
                log.warning("run %s: gateway watch: %s", self.run_id, err)
            except Exception:  # the watch must outlive a surprise, or pauses go unacknowledged
                log.exception("run %s: gateway watch failed; watching on", self.run_id)

    async def _watch_once(self) -> None:
        ctx = self.ctx
        if ctx is None:
            return
        if not self._released and not ctx.lease_lost:
            if ctx.directive in ("pause", "cancel", "stop") and self._in_flight == 0:
                await self._let_go(ctx.directive_reason or f"directive {ctx.directive}")
            return
        state = (await self.client.get_run(self.run_id)).get("state")
        if state == "queued":
            await self._reclaimed()

    # -- call identity -----------------------------------------------------------------------------

    def _prefix(self, tool: str) -> str:
        return f"{self.run_id}:mcp:{tool}:"

    async def _learn_positions(self) -> None:
        """Where each tool's numbering continues, from the ledger: after the last resolved call,
        or at the first call whose outcome the ledger does not know (a retry of that call is then
        the same effect, not a second one)."""
        effects = await self.client.list_effects(self.run_id)
        self._positions = positions(effects, f"{self.run_id}:mcp:")

    def _key(self, tool: str, params: types.CallToolRequestParams) -> tuple[str, bool]:
        """The call's idempotency key and whether it is positional (the gateway numbered it)."""
        own = (params.meta or {}).get(KEY_META)
        if own:
            return f"{self.run_id}:mcp-key:{own}", False
        return f"{self._prefix(tool)}{self._positions.get(tool, 1)}", True

    # -- MCP handlers ------------------------------------------------------------------------------

    async def _list_tools(self, _rc: Any, _params: Any) -> types.ListToolsResult:
        tools = []
        for upstream, client in self.clients.items():
            for tool in (await client.list_tools()).tools:
                tools.append(tool.model_copy(update={"name": f"{upstream}{SEP}{tool.name}"}))
        return types.ListToolsResult(tools=tools)

    async def _call_tool(
        self, _rc: Any, params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        upstream, _, name = params.name.partition(SEP)
        client = self.clients.get(upstream)
        if client is None or not name:
            return error(f"There is no tool {params.name!r} behind this gateway.")
        self._in_flight += 1
        try:
            return await self._call(client, upstream, name, params)
        finally:
            self._in_flight -= 1

    async def _call(
        self, client: Client, upstream: str, name: str, params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        args = dict(params.arguments or {})
        give_up_at = asyncio.get_running_loop().time() + self.pause_wait_s
        for _ in range(50):  # claims, skipped positions, waits: each turn bounded
            ctx = self.ctx
            assert ctx is not None
            if ctx.lease_lost or self._released:
                async with self._lock:
                    ctx = await self._reclaimed() or self.ctx or ctx
            key, positional = self._key(params.name, params)
            try:
                return await self._governed(ctx, client, upstream, name, args, key, positional)
            except (IdempotencyKeyReused, EffectAlreadyFailed):
                if not positional:
                    raise
                # This position was another call (other args) or failed: this call is the next one.
                self._positions[params.name] = self._positions.get(params.name, 1) + 1
            except EffectUnresolved as err:
                return error(
                    f"{params.name} was not called: an earlier call in its place ({err.effect_id}) "
                    f"has an outcome nobody knows yet ({err.effect_status}). An operator must "
                    "reconcile it with the tool first; calling again could do it twice."
                )
            except (EffectDenied, LeaseLost) as denied:
                reason = getattr(denied, "reason", "lease_lost")
                if reason not in ("run_paused", "run_cancelled", "lease_lost"):
                    detail = f" ({denied.detail})" if denied.detail not in (None, "") else ""
                    return error(
                        f"The control plane refused {params.name}: {reason}{detail}. "
                        "It was not called."
                    )
                async with self._lock:
                    if self.ctx is not ctx:
                        continue  # the watcher claimed the run again meanwhile
                    if reason != "lease_lost":
                        await self._let_go(await self._why(ctx) or reason)
                    if await self._reclaimed() is not None:
                        continue  # the run is ours again: declare under the new lease
                    state, refusal = await self._refusal(params.name)
                waiting = state in PAUSED and asyncio.get_running_loop().time() < give_up_at
                if state != "queued" and not waiting:  # queued: resumed a moment ago, claim it
                    return refusal
                await asyncio.sleep(min(self.watch_interval_s, 1.0))
            except ControlPlaneError as err:
                return error(
                    f"The control plane could not authorize {params.name} ({err}). "
                    "It was not called."
                )
        return error(f"{params.name} was not called: the gateway could not get it authorized.")

    async def _operator_reason(self) -> str:
        """The reason the operator gave for the pause or cancel (the run's history has it)."""
        events = await self.client.get_history(self.run_id)
        for e in reversed(events):
            data = e.get("data") or {}
            if e.get("kind") == "state_changed" and data.get("event") in ("pause", "cancel"):
                return str(data.get("reason") or "")
        return self._stopped_why

    async def _why(self, ctx: AsyncRunContext) -> str:
        """The operator's reason for the directive (a heartbeat carries it)."""
        try:
            await ctx.refresh()
        except ControlPlaneError:
            pass
        return ctx.directive_reason

    async def _reclaimed(self) -> AsyncRunContext | None:
        """Claim the run again if it is claimable now (after a resume or a recovery)."""
        fresh = await self._claim(wait_s=0)
        if fresh is not None:
            await self._learn_positions()
        return fresh

    async def _refusal(self, tool: str) -> tuple[str, types.CallToolResult]:
        """The run's state and why a call cannot go through in it, as a tool error."""
        run = await self.client.get_run(self.run_id)
        state = str(run.get("state") or "unknown")
        why = await self._operator_reason() if state in PAUSED | {"cancelling", "cancelled"} else ""
        return state, error(refusal_text(state, tool, why))

    async def _governed(
        self,
        ctx: AsyncRunContext,
        client: Client,
        upstream: str,
        name: str,
        args: dict[str, Any],
        key: str,
        positional: bool,
    ) -> types.CallToolResult:
        label = f"{upstream}{SEP}{name}"
        approval_id: str | None = None
        while True:
            scope = ctx.effect(
                canonical_name(upstream), canonical_name(name), key=key, step=f"mcp:{label}", args=args,
                unknown_on=_UNKNOWN_ON, approval_id=approval_id,
            )  # fmt: skip
            try:
                await scope.__aenter__()
                break
            except EffectDenied as denied:
                if denied.reason != "approval_required" or approval_id is not None:
                    raise
                approval_id, outcome = await self._approval(ctx, upstream, name, args)
                if approval_id is None:  # rejected, timed out or superseded: said as it was
                    return error(f"The approval of {label} was {outcome}. It was not called.")
        if positional:
            self._positions[label] = self._positions.get(label, 1) + 1
        if scope.already_done:
            return replayed(label, scope)
        try:
            meta = cast(types.RequestParamsMeta, {UPSTREAM_KEY_META: scope.idempotency_key})
            call = client.call_tool(name, args, meta=meta)
            result = await asyncio.wait_for(call, self.call_timeout_s)
        except BaseException as exc:
            await scope.__aexit__(type(exc), exc, exc.__traceback__)
            if isinstance(exc, Exception):
                return error(
                    f"{label} may or may not have happened: the tool server did not answer "
                    f"({type(exc).__name__}). Its outcome is recorded as unknown; an operator "
                    "reconciles it before anything retries it."
                )
            raise
        if result.is_error:
            scope.failed(detail={"result": plain(result)})
        else:
            scope.committed(detail={"result": plain(result)})
        try:
            await scope.__aexit__(None, None, None)
        except OutcomeNotRecorded as err:
            # The tool did answer: the client gets its answer; the ledger says in flight until
            # recovery reconciles it (a retry of this call is refused until then, never re-sent).
            log.error("run %s: %s", self.run_id, err)
        return result

    async def _approval(
        self, ctx: AsyncRunContext, upstream: str, name: str, args: dict[str, Any]
    ) -> tuple[str | None, str]:
        """Request the approval the server demands for exactly this call and wait for it: its id if
        approved (else None), and what became of it (Approval.outcome: never "rejected" for a
        timeout)."""
        approval_id = await ctx.request_approval(
            canonical_name(upstream), canonical_name(name), args, f"MCP call {upstream}{SEP}{name}"
        )
        approval = await ctx.await_approval(approval_id, self.approval_timeout_s)
        return (approval_id if approval.approved else None), approval.outcome()
