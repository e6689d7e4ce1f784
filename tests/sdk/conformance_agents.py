"""Minimal agents for the conformance kit (``python -m controlplane_sdk.conformance``): one written
with the SDK, one with the LangGraph adapter, one with the OpenAI Agents SDK adapter, and one that
misbehaves (it ignores directives and invents a fresh key per attempt), which the kit must fail."""

from __future__ import annotations

import operator
import os
import uuid
from typing import Annotated, Any, TypedDict

from controlplane_sdk import RunContext
from controlplane_sdk.conformance import ToolStandIn

PLAN = [
    ("reserve", "inventory", "reserve", {"sku": "sku-1"}, "release"),
    ("label", "shipping", "create_label", {"to": "ada"}, "void"),
    ("charge", "payments", "charge", {"amount": 42}, "refund"),
    ("notify", "notifications", "enqueue", {"email": "ada@example.com"}, None),
]


def sdk(tools: ToolStandIn, plan: list[Any] = PLAN):
    """A purchasing agent with the plain SDK: a step per call, a checkpoint after each."""

    def run(ctx: RunContext) -> None:
        for step, tool, action, args, undo in plan:
            if step in ctx.state:
                continue
            with ctx.step(step):
                with ctx.effect(
                    tool, action, args=args, irreversible=undo is None,
                    compensate={"tool": tool, "action": undo} if undo else None,
                ) as fx:  # fmt: skip
                    if not fx.already_done:
                        done = tools.call(tool, action, args, idempotency_key=fx.idempotency_key)
                        fx.committed(done["id"])
            ctx.checkpoint(step, {**ctx.state, step: fx.external_ref or "done"})

    return run


#: the same plan with tools no live server knows (``kit.inventory``…): against a live control plane
#: the server's own reconcilers (the demo world's) would otherwise ask the world about keys only the
#: kit's stand-in has seen
OFFWORLD = [(step, f"kit.{tool}", action, args, undo) for step, tool, action, args, undo in PLAN]


def sdk_offworld(tools: ToolStandIn):
    """:func:`sdk` on the :data:`OFFWORLD` tools (for ``--url``)."""
    return sdk(tools, OFFWORLD)


class Order(TypedDict):
    log: Annotated[list, operator.add]


def langgraph(tools: ToolStandIn, plan: list[Any] = PLAN):
    """The same purchase as a LangGraph graph: a node per call, governed tools, graph checkpoints
    stored as the run's checkpoints."""
    from langgraph.graph import END, START, StateGraph

    from controlplane_sdk.adapters import current_effect
    from controlplane_sdk.adapters.langgraph import ControlPlaneSaver, governed_tool, run_graph

    def run(ctx: RunContext) -> Any:
        g = StateGraph(Order)
        prev = START
        for step, tool, action, args, undo in plan:

            def call(tool=tool, action=action, **kw: Any) -> str:
                return tools.call(tool, action, kw, idempotency_key=current_effect().idempotency_key)["id"]  # fmt: skip

            governed = governed_tool(
                ctx, tool, action, irreversible=undo is None,
                compensate={"tool": tool, "action": undo} if undo else None,
            )(call)  # fmt: skip
            g.add_node(step, lambda s, governed=governed, args=args: {"log": [governed(**args)]})
            g.add_edge(prev, step)
            prev = step
        g.add_edge(prev, END)
        graph = g.compile(checkpointer=ControlPlaneSaver(ctx))
        return run_graph(ctx, graph, {"log": []})

    return run


def reckless(tools: ToolStandIn):
    """Ignores directives (no step boundaries) and makes a new key each attempt."""

    def run(ctx: RunContext) -> None:
        for step, tool, action, args, _ in PLAN:
            key = f"{step}-{uuid.uuid4().hex}"
            with ctx.effect(tool, action, key=key, step=step, args=args) as fx:
                tools.call(tool, action, args, idempotency_key=fx.idempotency_key)

    return run


def openai_agents(tools: ToolStandIn, plan: list[Any] = PLAN):
    """The same purchase with the OpenAI Agents SDK and a scripted model that, like a real one,
    answers from the conversation: its next move is the plan's next call after the tool results it
    has seen (so a run resumed from its stored RunState continues, not restarts)."""
    os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")  # no exporting traces to OpenAI
    from agents import Agent
    from agents.testing import ScriptedModel, assistant_message, function_call

    from controlplane_sdk.adapters import current_effect
    from controlplane_sdk.adapters.openai_agents import govern_tool, run_agent

    class PlanModel(ScriptedModel):
        async def get_response(self, system_instructions, input, *args, **kwargs):
            seen = sum(
                1 for i in (input if isinstance(input, list) else [])
                if isinstance(i, dict) and i.get("type") == "function_call_output"
            )  # fmt: skip
            step = (
                [function_call(plan[seen][0], plan[seen][3], call_id=f"call-{plan[seen][0]}")]
                if seen < len(plan)
                else [assistant_message("bought")]
            )
            return await ScriptedModel([step]).get_response(
                system_instructions, input, *args, **kwargs
            )

    def dispatch(step: str, **args: Any) -> str:
        _, tool, action, _, _ = next(p for p in plan if p[0] == step)
        return tools.call(tool, action, args, idempotency_key=current_effect().idempotency_key)[
            "id"
        ]

    def reserve(sku: str) -> str:
        """Reserve stock."""
        return dispatch("reserve", sku=sku)

    def label(to: str) -> str:
        """Create a shipping label."""
        return dispatch("label", to=to)

    def charge(amount: int) -> str:
        """Charge the card."""
        return dispatch("charge", amount=amount)

    def notify(email: str) -> str:
        """Queue the customer's notification."""
        return dispatch("notify", email=email)

    def run(ctx: RunContext) -> Any:
        fns = {"reserve": reserve, "label": label, "charge": charge, "notify": notify}
        governed = [
            govern_tool(
                ctx, fns[step], tool=tool, action=action, irreversible=undo is None,
                compensate={"tool": tool, "action": undo} if undo else None,
            )
            for step, tool, action, _args, undo in plan
        ]  # fmt: skip
        agent = Agent(name="buyer", instructions="buy", tools=governed, model=PlanModel([]))
        return run_agent(ctx, agent, "buy sku-1")

    return run


def mcp_gateway(tools: ToolStandIn, plan: list[Any] = PLAN):
    """An unmodified MCP client agent behind the MCP gateway: the tool server (an in-process
    ``mcp`` server) does the stand-in's calls with the idempotency key the gateway sends; the agent
    only sees MCP results. A stand-in timeout is a tool server that took the call and never
    answered: the gateway's connection to it times out (at once here, where a real one would after
    the gateway's ``call_timeout_s``, which is long: a slow call -- the kit pausing the run or
    letting its lease expire while the call is held -- is waited for, as the kit expects). A killed
    worker takes the gateway's whole process down with the call in flight."""
    import asyncio

    from mcp import Client as McpClient
    from mcp.server.mcpserver import Context, MCPServer
    from mcp.server.mcpserver.exceptions import ToolError

    from controlplane_sdk import CancelRequested, PauseRequested
    from controlplane_sdk.adapters.mcp_gateway import KEY_META, UPSTREAM_KEY_META, McpGateway
    from controlplane_sdk.conformance import WorkerKilled

    killed: list[BaseException] = []
    NO_ANSWER = "conformance kit: accepted, never answered"

    def tool_fn(tool: str, action: str):
        async def call(ctx):
            key = (ctx.request_context.meta or {}).get(UPSTREAM_KEY_META)
            try:
                return tools.call(tool, action, {"via": "mcp"}, idempotency_key=str(key))["id"]
            except TimeoutError:
                raise ToolError(NO_ANSWER) from None  # accepted, never answered
            except WorkerKilled as exc:
                killed.append(exc)
                await asyncio.sleep(3600)  # the process dies around it
            raise AssertionError("unreachable")

        call.__annotations__ = {"ctx": Context, "return": str}  # real types, for mcp's schema
        return call

    class Upstream:
        """The gateway's connection to a tool server: a call the server took and never answered
        times out (a ``TimeoutError`` the gateway records as ``unknown``)."""

        def __init__(self, inner: Any) -> None:
            self.inner = inner

        async def call_tool(self, name: str, args: Any, **kw: Any) -> Any:
            result = await self.inner.call_tool(name, args, **kw)
            if result.is_error and any(NO_ANSWER in getattr(c, "text", "") for c in result.content):
                raise TimeoutError(f"{name}: the tool server never answered (injected)")
            return result

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)

    def tool_servers() -> dict[str, MCPServer]:
        """One MCP server per tool (the gateway declares ``<server>:<tool>``: inventory:reserve)."""
        servers: dict[str, MCPServer] = {}
        for _step, tool, action, _args, _undo in plan:
            server = servers.setdefault(tool, MCPServer(tool))
            server.add_tool(tool_fn(tool, action), name=action)
        return servers

    async def calls(client: Any) -> BaseException | None:
        """The agent's calls; what stops it (raised after the MCP session closes, so it reaches
        the run loop as itself, not inside the session's exception group)."""
        for step, tool, action, _args, _undo in plan:
            # the call's own identity (the agent's step), so a restarted agent's repeat is a replay
            meta = {KEY_META: f"order-1:{step}"}
            call = asyncio.create_task(client.call_tool(f"{tool}__{action}", {}, meta=meta))
            while not call.done() and not killed:
                await asyncio.sleep(0.01)
            if killed:
                call.cancel()
                return killed[0]
            result = call.result()
            text = result.content[0].text if result.content else ""
            if result.is_error and "already done by an earlier attempt" not in text:
                if "paused" in text:
                    return PauseRequested(text)
                if "cancel" in text:
                    return CancelRequested(text)
                return RuntimeError(text)
        return None

    async def agent(ctx: RunContext) -> None:
        gw = McpGateway(ctx, tool_servers(), call_timeout_s=120, watch_interval_s=0.05)
        async with gw, McpClient(gw.server) as client:
            gw.clients = {name: Upstream(c) for name, c in gw.clients.items()}
            stop = await calls(client)
            if stop is None:
                await (
                    gw.finish()
                )  # under the attempt the gateway holds now (it may have re-claimed)
        if stop is not None:
            raise stop

    def run(ctx: RunContext) -> None:
        killed.clear()
        asyncio.run(agent(ctx))

    return run


def langgraph_offworld(tools: ToolStandIn):
    """:func:`langgraph` on the :data:`OFFWORLD` tools (for ``--url``)."""
    return langgraph(tools, OFFWORLD)


def openai_agents_offworld(tools: ToolStandIn):
    """:func:`openai_agents` on the :data:`OFFWORLD` tools (for ``--url``)."""
    return openai_agents(tools, OFFWORLD)


def mcp_gateway_offworld(tools: ToolStandIn):
    """:func:`mcp_gateway` on the :data:`OFFWORLD` tools (for ``--url``)."""
    return mcp_gateway(tools, OFFWORLD)
