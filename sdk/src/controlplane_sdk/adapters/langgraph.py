"""Govern a LangGraph graph: its checkpoints, its tools and its interrupts live in the control plane.

    from controlplane_sdk.adapters.langgraph import ControlPlaneSaver, governed_tool, run_graph

    def agent(ctx):                                     # a run_agent_loop run function
        saver = ControlPlaneSaver(ctx)                  # graph checkpoints -> control-plane checkpoints
        charge = governed_tool(ctx, "payments", "charge")(charge_card)
        graph = build_graph(charge).compile(checkpointer=saver)
        run_graph(ctx, graph, {"order": ctx.get_run()["input"]})

* Every graph checkpoint is written as a control-plane checkpoint whose ``step`` names the node(s)
  that run next (``langgraph next: charge``), so a resume's revalidation report says which node
  runs again *from its start* (LangGraph re-executes an interrupted node from the top). A run
  claimed by another process starts from that checkpoint: :class:`ControlPlaneSaver` loads it, and
  ``run_graph`` continues the graph.
* A governed tool checks the run's directive before each call (a paused or cancelled run stops at the
  next tool call, before anything escapes) and declares the call as an effect whose idempotency key is
  the call's identity: the LangGraph task that makes it (the graph step, the node, a ``Send``'s
  index: the same when the node runs again after a resume, a lease move or a recovery, in any
  process, even when the checkpoint it ran from was never stored) and the call's position among
  that task's calls of the tool. Two identical calls are two effects; a
  node executed again replays its calls. Pass ``key=`` (a function of the call's arguments) when the
  identity is something else, e.g. an order line id.
* ``interrupt(payload)`` inside a node becomes a control-plane approval (payload: ``tool``, ``action``,
  ``args``, ``reason``); the graph resumes with ``{"approved": bool, "approval_id": id}`` once an
  approver decides in the console.
"""

from __future__ import annotations

import base64
import functools
from collections.abc import Callable, Sequence
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import ChannelVersions, Checkpoint, CheckpointMetadata
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command

from ..runtime import RunContext
from . import effect_in_progress, recorded

STATE_KEY = "langgraph"
BRANCH_PREFIX = "branch:to:"


def next_nodes(checkpoint: Checkpoint) -> list[str]:
    """The nodes a checkpoint will run next: LangGraph triggers each through a ``branch:to:NODE``
    channel written in the step that produced the checkpoint."""
    updated = checkpoint.get("updated_channels") or list(checkpoint.get("channel_values", {}))
    if "__start__" in updated:
        return ["__start__"]
    return sorted(c.removeprefix(BRANCH_PREFIX) for c in updated if c.startswith(BRANCH_PREFIX))


class ControlPlaneSaver(InMemorySaver):
    """An in-memory saver that writes every checkpoint through to the run's control-plane checkpoints
    and starts from the one the claim handed over (so a new process continues the same graph)."""

    def __init__(self, ctx: RunContext, *, thread_id: str | None = None) -> None:
        super().__init__()
        self.ctx = ctx
        self.thread_id = thread_id or ctx.run_id
        stored = (ctx.state or {}).get(STATE_KEY)
        if stored:
            self._restore(stored)

    @property
    def config(self) -> dict[str, Any]:
        return {"configurable": {"thread_id": self.thread_id}}

    def _restore(self, stored: dict[str, Any]) -> None:
        def typed(v: list[str]) -> tuple[str, bytes]:
            return v[0], base64.b64decode(v[1])

        ns, cid = stored["checkpoint_ns"], stored["checkpoint_id"]
        self.storage[self.thread_id][ns][cid] = (
            typed(stored["checkpoint"]),
            typed(stored["metadata"]),
            stored.get("parent_id"),
        )
        for channel, version, kind, data in stored.get("blobs", []):
            self.blobs[(self.thread_id, ns, channel, version)] = typed([kind, data])

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        saved = super().put(config, checkpoint, metadata, new_versions)
        conf = saved["configurable"]
        ns, cid = conf.get("checkpoint_ns", ""), conf["checkpoint_id"]
        stored_cp, stored_md, parent = self.storage[self.thread_id][ns][cid]

        def plain(t: tuple[str, bytes]) -> list[str]:
            return [t[0], base64.b64encode(t[1]).decode()]

        # The channel values live in blobs keyed by version; carry the ones this checkpoint points at.
        versions = checkpoint.get("channel_versions", {})
        blobs = [
            [ch, v, *plain(self.blobs[(self.thread_id, ns, ch, v)])]
            for ch, v in versions.items()
            if (self.thread_id, ns, ch, v) in self.blobs
        ]
        nodes = next_nodes(checkpoint)
        # The server reads a checkpoint as "after step X": say which node runs next from its start.
        step = f"langgraph next: {'+'.join(nodes)}" if nodes else "langgraph end"
        state = {
            STATE_KEY: {
                "checkpoint_ns": ns,
                "checkpoint_id": cid,
                "parent_id": parent,
                "checkpoint": plain(stored_cp),
                "metadata": plain(stored_md),
                "blobs": blobs,
                "next": nodes,
            }
        }
        self.ctx.checkpoint(step, state)
        return saved

    def has_checkpoint(self) -> bool:
        return any(self.storage[self.thread_id].values())


def governed_tool(
    ctx: RunContext,
    tool: str,
    action: str,
    *,
    key: Callable[..., str] | None = None,
    compensate: dict[str, Any] | None = None,
    irreversible: bool = False,
    unknown_on: tuple[type[BaseException], ...] = (TimeoutError,),
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Wrap a tool function: directive check, then declare -> call -> outcome. A replayed call (an
    earlier attempt committed it) returns the recorded result instead of calling the world again."""

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def governed(*args: Any, **kwargs: Any) -> Any:
            ctx.check_directive()
            approval_id = kwargs.pop("approval_id", None)
            # Called with keywords only (the usual tool call), the declared args are those keywords,
            # so an approval requested for the same dict matches the declaration's digest.
            call = dict(kwargs) if not args else {"args": list(args), "kwargs": kwargs}
            k = key(*args, **kwargs) if key else call_identity(ctx, tool, action)
            with ctx.effect(
                tool,
                action,
                key=k,
                step=ctx.current_step or f"tool:{tool}:{action}",
                args=call,
                compensate=compensate,
                irreversible=irreversible,
                unknown_on=unknown_on,
                approval_id=approval_id,
            ) as fx:
                if fx.already_done:
                    return recorded(fx, "result")
                with effect_in_progress(fx):
                    result = fn(*args, **kwargs)
                fx.committed(detail={"result": result})
                return result

        return governed

    return wrap


def _task_id() -> str | None:
    """The LangGraph task running this code, named by what a re-execution keeps: the graph step,
    the node path (subgraph nodes joined by ``|``) and, for a ``Send``, its index -- never
    LangGraph's task id, which hashes the checkpoint's id, a uuid6 minted when the checkpoint is
    written. A new attempt whose checkpoint never reached the control plane (LangGraph writes it
    while the next node already runs) re-creates it under a new id, and a key built on the task id
    made that replay a new effect (the conformance kit saw the reservation done twice)."""
    try:
        from langgraph.config import get_config

        config = get_config()
    except (RuntimeError, KeyError):
        return None
    meta, conf = config.get("metadata") or {}, config.get("configurable") or {}
    ns = str(conf.get("checkpoint_ns") or meta.get("langgraph_checkpoint_ns") or "")
    if not ns:
        return None
    nodes = "|".join(part.partition(":")[0] for part in ns.split("|"))
    path: tuple[Any, ...] = tuple(meta.get("langgraph_path") or ())
    push = f":send{path[1]}" if len(path) > 1 and path[0] == "__pregel_push" else ""
    return f"s{meta.get('langgraph_step', '')}:{nodes}{push}"


def _positions(ctx: RunContext) -> dict[tuple[str, str, str], int]:
    counts = getattr(ctx, "_langgraph_positions", None)
    if counts is None:
        counts = {}
        ctx._langgraph_positions = counts  # type: ignore[attr-defined]
    return counts


def call_identity(ctx: RunContext, tool: str, action: str) -> str:
    """The idempotency key of a governed call: its task and its position among that task's calls
    of ``tool:action`` (outside a graph task: the step, or the run, and the position there)."""
    where = _task_id() or ctx.current_step or "run"
    counts = _positions(ctx)
    n = counts[(where, tool, action)] = counts.get((where, tool, action), 0) + 1
    return f"{ctx.run_id}:lg:{where}:{tool}:{action}:{n}"


def interrupts_of(graph: Any, config: dict[str, Any]) -> Sequence[Any]:
    return graph.get_state(config).interrupts


def run_graph(
    ctx: RunContext,
    graph: Any,
    graph_input: Any,
    *,
    saver: ControlPlaneSaver | None = None,
    approval_timeout: float | None = None,
) -> Any:
    """Run (or continue) the graph under the run's control; returns the final graph state.

    A graph that already has a checkpoint (a resumed or redriven run) continues from it with no new
    input. Each ``interrupt()`` becomes a control-plane approval; the run waits for the decision and the
    graph resumes with it. Directives raise at the next governed tool call or approval boundary."""
    saver = saver or graph.checkpointer
    # Any other checkpointer needs a thread too (LangGraph refuses a config without one).
    config = (
        saver.config
        if isinstance(saver, ControlPlaneSaver)
        else {"configurable": {"thread_id": ctx.run_id}}
    )
    resumed = isinstance(saver, ControlPlaneSaver) and saver.has_checkpoint()
    pending = list(interrupts_of(graph, config)) if resumed else []
    # Each invocation executes its tasks from their start: their calls count from the first again.
    _positions(ctx).clear()
    result = None if pending else graph.invoke(None if resumed else graph_input, config)
    while True:
        pending = list(interrupts_of(graph, config))
        if not pending:
            return result if result is not None else graph.get_state(config).values
        decision = _ask(ctx, pending[0].value, approval_timeout)
        _positions(ctx).clear()
        result = graph.invoke(Command(resume=decision), config)


def _ask(ctx: RunContext, payload: Any, timeout: float | None) -> dict[str, Any]:
    """One interrupt -> one approval request; blocks until decided (directives raise meanwhile)."""
    p = payload if isinstance(payload, dict) else {"reason": str(payload)}
    args = p.get("args")
    approval_id = ctx.request_approval(
        str(p.get("tool", "langgraph")),
        str(p.get("action", "interrupt")),
        args if isinstance(args, dict) else {},
        p.get("reason") or "the graph asked for a human decision",
    )
    approval = ctx.await_approval(approval_id, timeout=timeout)
    if approval.pending:
        ctx.check_directive()  # paused or cancelled while waiting: raise the directive
        raise TimeoutError(f"approval {approval_id} not decided within {timeout}s")
    # The status too: "timed_out" or "superseded" is no approver's rejection, and must not read as one.
    return {
        "approved": bool(approval.approved),
        "approval_id": approval_id,
        "status": approval.status,
    }
