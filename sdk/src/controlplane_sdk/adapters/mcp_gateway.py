"""An MCP gateway: an MCP server in front of real MCP tool servers, serving one run. Every
``tools/call`` is declared as an effect of the caller's run before it reaches the tool server, so any
MCP-speaking agent is governed with no code change.

    gateway = McpGateway(ctx, {"payments": payments_server_or_url})
    async with gateway:                       # connects to every upstream tool server
        await gateway.serve_stdio()           # or: mcp.Client(gateway.server) in-process

* Tools are listed as ``<upstream>__<tool>``; a call is declared as tool ``<upstream>``, action
  ``<tool>``, args the call's arguments, under the run's authority grants.
* A paused, cancelled or stopped run answers the call with a tool error that says so; nothing reaches
  the tool server.
* A call the server says needs approval (``approval_required``) requests one and waits for the
  decision; a rejection is a tool error.
* The tool server's result becomes the outcome: ``committed``, ``failed`` (an error result), or
  ``unknown`` (timeout or a broken connection: the call may have happened; reconcile before retrying).
* The same call again (same arguments) is a replay: the recorded result is returned, the tool server
  is not called twice.
"""

from __future__ import annotations

import asyncio
import re
from contextlib import AsyncExitStack
from typing import Any

import mcp.types as types
from mcp import Client
from mcp.server import Server

from ..errors import ControlPlaneError, EffectDenied
from ..runtime import RunContext
from . import args_digest, recorded

SEP = "__"


def canonical_name(name: str) -> str:
    """The server takes tool and action names in one form only (lowercase a-z 0-9 _ . -, see the
    server's docs/security/hardening.md, "Names"): an MCP tool ``getWeather`` is declared
    ``getweather``; the upstream is still called by its own name."""
    text = re.sub(r"[^a-z0-9_.\-]", "_", name.casefold()).lstrip("_.-")
    return text[:100] or "tool"


_STOPS = ("pause", "cancel", "stop")


def _error(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=True)


def _text(result: types.CallToolResult) -> str:
    return "\n".join(c.text for c in result.content if isinstance(c, types.TextContent))


class McpGateway:
    def __init__(
        self,
        ctx: RunContext,
        upstreams: dict[str, Any],
        *,
        call_timeout_s: float = 30.0,
        approval_timeout_s: float | None = None,
    ) -> None:
        self.ctx = ctx
        self.upstreams = upstreams
        self.call_timeout_s = call_timeout_s
        self.approval_timeout_s = approval_timeout_s
        self.clients: dict[str, Client] = {}
        self._stack = AsyncExitStack()
        self.server: Server[Any] = Server(
            "controlplane-gateway", on_list_tools=self._list_tools, on_call_tool=self._call_tool
        )

    async def __aenter__(self) -> McpGateway:
        for name, target in self.upstreams.items():
            self.clients[name] = await self._stack.enter_async_context(Client(target))
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._stack.aclose()

    async def serve_stdio(self) -> None:
        from mcp.server.stdio import stdio_server

        async with stdio_server() as (read, write):
            await self.server.run(read, write, self.server.create_initialization_options())

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
            return _error(f"unknown tool {params.name!r}")
        args = dict(params.arguments or {})
        directive = await asyncio.to_thread(self.ctx.refresh)
        if directive in _STOPS:
            reason = self.ctx.directive_reason or "by an operator"
            return _error(f"the run is {directive}d ({reason}): {params.name} was not called")
        try:
            return await self._governed(client, upstream, name, args)
        except EffectDenied as denied:
            return _error(f"the control plane denied {params.name}: {denied.reason}")
        except ControlPlaneError as err:
            return _error(f"the control plane refused {params.name}: {err}")

    async def _governed(
        self, client: Client, upstream: str, name: str, args: dict[str, Any]
    ) -> types.CallToolResult:
        key = f"{self.ctx.run_id}:mcp:{upstream}:{name}:{args_digest(args)}"
        approval_id: str | None = None
        while True:
            scope = self.ctx.effect(
                canonical_name(upstream), canonical_name(name), key=key, step=f"mcp:{upstream}{SEP}{name}", args=args,
                unknown_on=(TimeoutError, asyncio.TimeoutError, OSError), approval_id=approval_id,
            )  # fmt: skip
            try:
                await asyncio.to_thread(scope.__enter__)
                break
            except EffectDenied as denied:
                if denied.reason != "approval_required" or approval_id is not None:
                    raise
                approval_id, outcome = await self._approval(
                    canonical_name(upstream), canonical_name(name), args
                )
                if approval_id is None:
                    return _error(f"{upstream}{SEP}{name}: the approval was {outcome}")
        if scope.already_done:
            return types.CallToolResult(
                content=[types.TextContent(type="text", text=str(recorded(scope, "text", "")))],
                is_error=False,
            )
        try:
            result = await asyncio.wait_for(client.call_tool(name, args), self.call_timeout_s)
        except BaseException as exc:
            await asyncio.to_thread(scope.__exit__, type(exc), exc, exc.__traceback__)
            if isinstance(exc, Exception):
                return _error(f"{upstream}{SEP}{name}: outcome unknown ({type(exc).__name__})")
            raise
        detail = {"text": _text(result)[:4000]}
        if result.is_error:
            scope.failed(detail=detail)
        else:
            scope.committed(detail=detail)
        await asyncio.to_thread(scope.__exit__, None, None, None)
        return result

    async def _approval(
        self, upstream: str, name: str, args: dict[str, Any]
    ) -> tuple[str | None, str]:
        """Request the approval the server demands for exactly this call and wait for it."""
        approval_id = await asyncio.to_thread(
            self.ctx.request_approval, upstream, name, args, f"MCP call {upstream}{SEP}{name}"
        )
        approval = await asyncio.to_thread(
            self.ctx.await_approval, approval_id, self.approval_timeout_s
        )
        return (approval_id if approval.approved else None), approval.outcome()
