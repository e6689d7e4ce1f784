"""Govern an OpenAI Agents SDK agent: every function-tool call is a declared effect, a paused or
cancelled run stops at the next tool call, ``needs_approval`` tools are control-plane approvals, and the
SDK's serialised ``RunState`` is the run's checkpoint (so another process can resume it).

    from controlplane_sdk.adapters.openai_agents import govern_tool, run_agent

    def agent_run(ctx):                                    # a run_agent_loop run function
        charge = govern_tool(ctx, charge_card, tool="payments", action="charge", needs_approval=True)
        agent = Agent(name="buyer", instructions="...", tools=[charge])
        run_agent(ctx, agent, ctx.get_run()["goal"])

How a stop happens: ``on_tool_start`` hooks run beside the tool and cannot stop it, so the adapter
wraps the tool itself. Every governed call is first held at a boundary (the tool's ``needs_approval``
check turns it into an interruption): the adapter writes the ``RunState`` as a checkpoint (step
``openai-agents next: <tool>``: the call that will run when the run resumes), asks the directive --
raising on pause/cancel/stop -- and only then lets the call through. A resumed run, in any process,
loads that state and lets the held call through: it is declared then, under a key derived from the
run and the model's tool call id, which the ``RunState`` keeps, so a replay cannot charge twice.

The agent runs on an event loop, and so do the adapter's control-plane calls: give an
:class:`~controlplane_sdk.AsyncRunContext` (``AsyncWorker`` + ``arun_one``), or a sync
``RunContext`` (``run_agent_loop``), whose attempt the adapter then carries on the loop with an
``AsyncClient`` for the length of the agent run (the sync context's heartbeat thread keeps the
lease; its state, checkpoint sequence and a lost lease are written back when the run returns).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Callable
from typing import Any

from agents import Agent, FunctionTool, Runner, RunState, function_tool
from agents.exceptions import UserError
from agents.tool_context import ToolContext

from ..aio import AsyncClient
from ..aio_runtime import AsyncRunContext
from ..errors import ControlPlaneError
from ..runtime import RunContext
from . import effect_in_progress, recorded

STATE_KEY = "openai_agents"
_STOPS = ("pause", "cancel", "stop")


class Governance:
    """What the adapter remembers for one run: the tool calls waiting at their boundary (and whether
    each needs a human approval), and the approval each approved call cites when it is declared."""

    def __init__(self, ctx: RunContext | AsyncRunContext) -> None:
        self.ctx = ctx
        #: the async context the calls go through while an agent runs (see ``_on_the_loop``)
        self.host: AsyncRunContext | None = ctx if isinstance(ctx, AsyncRunContext) else None
        self.asks: dict[str, bool] = {}  # call id -> the tool needs a human approval
        self.approvals: dict[str, str] = {}  # call id -> approval id
        self.tools: dict[str, tuple[str, str]] = {}  # function tool name -> (tool, action)


def _governance(ctx: RunContext | AsyncRunContext) -> Governance:
    gov = getattr(ctx, "_openai_agents", None)
    if gov is None:
        gov = Governance(ctx)
        setattr(ctx, "_openai_agents", gov)  # noqa: B010 (a run context has no slot for it)
    return gov


def govern_tool(
    ctx: RunContext | AsyncRunContext,
    fn: Callable[..., Any] | FunctionTool,
    *,
    tool: str,
    action: str,
    needs_approval: bool = False,
    compensate: dict[str, Any] | None = None,
    irreversible: bool = False,
    unknown_on: tuple[type[BaseException], ...] = (TimeoutError,),
) -> FunctionTool:
    """A function tool whose every call is governed by the run (see the module docstring).

    Pass a plain function: its exceptions then reach the adapter, which records ``failed`` (or
    ``unknown`` for ``unknown_on``: the call may have happened) and stops the run. A ready-made
    ``FunctionTool`` keeps its own error handling (an error string for the model is a committed call)."""
    ft = fn if isinstance(fn, FunctionTool) else function_tool(fn, failure_error_function=None)
    gov = _governance(ctx)
    gov.tools[ft.name] = (tool, action)
    inner = ft.on_invoke_tool

    async def boundary(_run_ctx: Any, _params: dict[str, Any], call_id: str) -> bool:
        # Every governed call stops at a boundary first: the adapter checkpoints the RunState there
        # and asks for the directive, so the call cannot start once a pause has committed.
        gov.asks[call_id] = needs_approval
        return True

    async def invoke(tool_ctx: ToolContext[Any], raw_args: str) -> Any:
        # The boundary check asked the server a moment ago; the declaration below is refused by the
        # server anyway if a pause committed since (run_paused), so no second round trip here.
        host = gov.host
        if host is None:
            raise RuntimeError("a governed tool runs inside run_agent / arun_agent")
        await host.check_directive(refresh=False)
        call_id = tool_ctx.tool_call_id
        scope = host.effect(
            tool,
            action,
            key=f"{host.run_id}:{call_id}",
            step=host.current_step or f"openai-agents:{ft.name}",
            args=json.loads(raw_args or "{}"),
            compensate=compensate,
            irreversible=irreversible,
            unknown_on=unknown_on + (asyncio.TimeoutError,),
            approval_id=gov.approvals.get(call_id),
        )
        await scope.__aenter__()
        if scope.already_done:
            return recorded(scope, "result", "")
        try:
            with effect_in_progress(scope):  # the tool reads current_effect().idempotency_key
                result = await inner(tool_ctx, raw_args)
        except BaseException as exc:
            await scope.__aexit__(type(exc), exc, exc.__traceback__)
            exc._controlplane_governed = True  # type: ignore[attr-defined]  # see _run
            raise
        scope.committed(detail={"result": result if isinstance(result, str) else str(result)})
        await scope.__aexit__(None, None, None)
        return result

    return dataclasses.replace(ft, on_invoke_tool=invoke, needs_approval=boundary)


async def arun_agent(
    ctx: RunContext | AsyncRunContext,
    agent: Agent[Any],
    agent_input: str | list[Any],
    **runner_kwargs: Any,
) -> Any:
    """Run the agent (or continue it from the run's stored ``RunState``); returns the final output.

    Each tool call is a durable boundary: the ``RunState`` (the call not yet made) is written as a
    checkpoint, then the directive is asked; a pause, cancel or stop raises there. A tool that needs
    approval gets a control-plane approval; the others go ahead."""
    if isinstance(ctx, AsyncRunContext):
        return await _arun(ctx, agent, agent_input, **runner_kwargs)
    return await _on_the_loop(ctx, agent, agent_input, **runner_kwargs)


async def _on_the_loop(
    ctx: RunContext, agent: Agent[Any], agent_input: str | list[Any], **runner_kwargs: Any
) -> Any:
    """A sync context's attempt carried on the loop: an async twin on the same lease and fencing
    token for the agent run, whatever it learnt written back to ``ctx`` after."""
    gov = _governance(ctx)
    client = AsyncClient.like(ctx.client)
    twin = AsyncRunContext(client, ctx.claim_result, ctx.worker_name)
    twin.state, twin.last_checkpoint_seq = dict(ctx.state), ctx.last_checkpoint_seq
    twin.current_step, twin.directive = ctx.current_step, ctx.directive
    setattr(twin, "_openai_agents", gov)  # noqa: B010
    gov.host = twin
    try:
        return await _arun(twin, agent, agent_input, **runner_kwargs)
    finally:
        gov.host = None
        ctx.state, ctx.last_checkpoint_seq = twin.state, twin.last_checkpoint_seq
        if twin._lease_lost is not None:
            ctx._mark_lease_lost(twin._lease_lost)
        await client.aclose()


async def _arun(
    ctx: AsyncRunContext, agent: Agent[Any], agent_input: str | list[Any], **runner_kwargs: Any
) -> Any:
    gov = _governance(ctx)
    stored = (ctx.state or {}).get(STATE_KEY)
    run_input: Any = agent_input
    if stored:
        state = await RunState.from_json(agent, stored["state"])
        await _let_through(ctx, gov, state, state.get_interruptions(), stored.get("asks", {}))
        run_input = state
    while True:
        result = await _run(agent, run_input, **runner_kwargs)
        if not result.interruptions:
            final = result.final_output
            await ctx.checkpoint("openai-agents end", {"final_output": str(final)})
            return final
        state = result.to_state()
        asks = {i.call_id: gov.asks.get(i.call_id, False) for i in result.interruptions}
        first = result.interruptions[0]
        await ctx.checkpoint(
            f"openai-agents next: {first.tool_name or first.name}",
            {STATE_KEY: {"state": state.to_json(), "asks": asks}},
        )
        await ctx.check_directive()  # raises the pause / cancel / stop
        await _let_through(ctx, gov, state, result.interruptions, asks)
        run_input = state


async def _let_through(
    ctx: AsyncRunContext, gov: Governance, state: RunState, items: list[Any], asks: dict[str, bool]
) -> None:
    for item in items:
        if asks.get(item.call_id, False):
            await _decide(ctx, gov, state, item)
        else:
            state.approve(item)  # held only at its boundary, which the directive check passed


async def _run(agent: Agent[Any], run_input: Any, **kw: Any) -> Any:
    """Runner.run, with our own errors unwrapped: the Agents SDK wraps an exception raised by a tool in
    ``UserError``; a directive, a denial or a governed tool's failure must reach the run loop as is."""
    try:
        return await Runner.run(agent, run_input, **kw)
    except UserError as err:
        cause = err.__cause__
        governed = getattr(cause, "_controlplane_governed", False)
        if cause is not None and (isinstance(cause, ControlPlaneError) or governed):
            raise cause from None  # the outcome is recorded; the run loop classifies the failure
        raise


async def _decide(ctx: AsyncRunContext, gov: Governance, state: RunState, item: Any) -> None:
    """A tool that needs approval: one control-plane approval for exactly this call's arguments."""
    args = json.loads(item.arguments or "{}") if isinstance(item.arguments, str) else {}
    approval_id = await ctx.request_approval(
        *gov.tools.get(item.tool_name or item.name or "", ("tool", "call")),
        args,
        f"the agent wants to call {item.tool_name or item.name}",
    )
    approval = await ctx.await_approval(approval_id)
    if approval.pending:
        await ctx.check_directive()
        raise TimeoutError(f"approval {approval_id} was not decided")
    if approval.approved:
        gov.approvals[item.call_id] = approval_id
        state.approve(item)
    else:
        state.reject(item)


def run_agent(ctx: RunContext, agent: Agent[Any], agent_input: str | list[Any], **kw: Any) -> Any:
    """Synchronous :func:`arun_agent`, for ``run_agent_loop`` run functions."""
    return asyncio.run(arun_agent(ctx, agent, agent_input, **kw))
