"""The purchasing agent written with the OpenAI Agents SDK and governed by its adapter.

The demo has no network and no model key, so the model is a small deterministic policy behind the
SDK's own ``ScriptedModel``: it reads the conversation and asks for the next tool (reserve, charge,
notify), then answers. Everything else is the real Agents SDK: function tools, ``needs_approval``
(above ``APPROVAL_THRESHOLD``: a control-plane approval), ``Runner`` and ``RunState`` -- which the
adapter stores as the run's checkpoint, so a paused run resumes in another process. Tool call ids are
derived from the run, as a provider's would be stable inside one ``RunState``.
"""

from __future__ import annotations

import time
from typing import Any

from agents import Agent, set_tracing_disabled
from agents.testing import ModelStep, ScriptedModel, assistant_message, function_call

from controlplane_sdk import RunContext
from controlplane_sdk.adapters import current_effect
from controlplane_sdk.adapters.openai_agents import govern_tool, run_agent
from world.client import WorldTimeout

from .common import env_float, read_world, world_client

AGENT = "oa-purchasing"
set_tracing_disabled(
    True
)  # the SDK would export traces to OpenAI; the demo has no key and no network
PLAN = ("reserve", "charge", "notify")


def policy(run_id: str, inp: dict[str, Any], amount: float):
    """The next move given what the tools have answered so far (one per plan step)."""
    args = {
        "reserve": {"sku": inp["sku"], "qty": int(inp.get("qty", 1))},
        "charge": {"amount": amount},
        "notify": {"to": inp.get("email") or "customer@example.com"},
    }

    def next_move(call: Any) -> list[Any]:
        time.sleep(env_float("DEMO_STEP_SECONDS", 0.0))  # a model thinking
        items = call.input if isinstance(call.input, list) else []
        done = sum(1 for i in items if _kind(i) == "function_call_output")
        if done >= len(PLAN):
            return [assistant_message(f"order {inp.get('order') or run_id} placed")]
        tool = PLAN[done]
        return [function_call(tool, args[tool], call_id=f"{run_id[:8]}-{tool}")]

    return ScriptedModel([ModelStep.respond(next_move) for _ in range(len(PLAN) + 2)])


def _kind(item: Any) -> str:
    return str(item.get("type") if isinstance(item, dict) else getattr(item, "type", ""))


def purchase(ctx: RunContext) -> None:
    inp = ctx.get_run()["input"]
    order = inp.get("order") or ctx.run_id
    with world_client() as world:
        item = read_world(f"read {inp['sku']}", lambda: world.get_item(inp["sku"]))
        amount = round(float(item["price"]) * int(inp.get("qty", 1)), 2)

        def key() -> str:
            return current_effect().idempotency_key

        def reserve(sku: str, qty: int) -> str:
            """Reserve stock for the order."""
            return str(world.reserve(sku, qty, key(), order=order).get("id"))

        def charge(amount: float) -> str:
            """Charge the customer's card."""
            card = inp.get("card") or "4242424242424242"
            return str(world.charge(amount, key(), card=card, order=order).get("id"))

        def notify(to: str) -> str:
            """Tell the customer the order is on its way."""
            return str(world.enqueue_notification(to, f"order {order} shipped", key()).get("id"))

        tools: list[Any] = [
            govern_tool(ctx, reserve, tool="inventory", action="reserve",
                        compensate={"tool": "inventory", "action": "release"},
                        unknown_on=(WorldTimeout,)),
            govern_tool(ctx, charge, tool="payments", action="charge",
                        compensate={"tool": "payments", "action": "refund"},
                        needs_approval=amount > env_float("APPROVAL_THRESHOLD", 200.0),
                        unknown_on=(WorldTimeout,)),
            # a timeout may have queued the message: unknown (reconciled), never failed (sent again)
            govern_tool(ctx, notify, tool="notifications", action="enqueue", irreversible=True,
                        unknown_on=(WorldTimeout,)),
        ]  # fmt: skip
        agent = Agent(
            name="buyer",
            instructions="Buy what the customer ordered: reserve, charge, notify.",
            tools=tools,
            model=policy(ctx.run_id, inp, amount),
        )
        run_agent(ctx, agent, f"order {order}: {inp.get('qty', 1)} x {inp['sku']}")
