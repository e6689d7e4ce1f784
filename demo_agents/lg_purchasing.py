"""The purchasing agent written as a LangGraph graph and governed by the LangGraph adapter: no
control-plane calls in its nodes beyond the governed tools, the checkpointer and ``interrupt()``.

Input as :mod:`demo_agents.purchasing` (``sku``, ``qty``, ``email``, ``order``, ``card``). Nodes:
``price`` (reads the world, records the price as an assumption) -> ``reserve`` -> ``approve`` (an
``interrupt()`` above ``APPROVAL_THRESHOLD``: a control-plane approval) -> ``charge`` -> ``notify``.
Each graph step is a control-plane checkpoint naming the node that runs next; each tool call a
declared effect carrying its idempotency key to the world. ``DEMO_STEP_SECONDS`` paces the nodes
like a model thinking, so an operator can watch and pause at human speed.
"""

from __future__ import annotations

import time
from typing import Any, TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.types import interrupt

from controlplane_sdk import RunContext
from controlplane_sdk.adapters import current_effect
from controlplane_sdk.adapters.langgraph import ControlPlaneSaver, governed_tool, run_graph
from world.client import WorldTimeout

from .common import AgentFailure, env_float, read_world, world_client

AGENT = "lg-purchasing"
DEFAULT_CARD = "4242424242424242"


class Order(TypedDict, total=False):
    price: float
    reservation: str
    approval_id: str | None
    charge: str
    notification: str


def think() -> None:
    time.sleep(env_float("DEMO_STEP_SECONDS", 0.0))


def purchase(ctx: RunContext) -> None:
    inp = ctx.get_run()["input"]
    sku, qty = inp["sku"], int(inp.get("qty", 1))
    order = inp.get("order") or ctx.run_id
    threshold = env_float("APPROVAL_THRESHOLD", 200.0)
    with world_client() as world:

        def key() -> str:
            return current_effect().idempotency_key

        @governed_tool(
            ctx, "inventory", "reserve", unknown_on=(WorldTimeout,),
            compensate={"tool": "inventory", "action": "release"},
        )  # fmt: skip
        def reserve(sku: str, qty: int, order: str) -> str:
            return str(world.reserve(sku, qty, key(), order=order).get("id"))

        @governed_tool(
            ctx, "payments", "charge", unknown_on=(WorldTimeout,),
            compensate={"tool": "payments", "action": "refund"},
        )  # fmt: skip
        def charge(amount: float, card: str, order: str) -> str:
            return str(world.charge(amount, key(), card=card, order=order).get("id"))

        # A timeout may have queued the message: unknown (reconciled), never failed (sent again).
        @governed_tool(
            ctx, "notifications", "enqueue", irreversible=True, unknown_on=(WorldTimeout,)
        )
        def notify(to: str, message: str) -> str:
            return str(world.enqueue_notification(to, message, key()).get("id"))

        def price(state: Order) -> Order:
            think()
            item = read_world(f"read {sku}", lambda: world.get_item(sku))
            ctx.record_assumption(
                f"price:{sku}", float(item["price"]), max_age_s=1800, checker="price",
                meta={"sku": sku, "tolerance_pct": 0},
            )  # fmt: skip
            return {"price": float(item["price"])}

        def charge_args(state: Order) -> dict[str, Any]:
            amount = round(state["price"] * qty, 2)
            return {"amount": amount, "card": inp.get("card") or DEFAULT_CARD, "order": order}

        def approve(state: Order) -> Order:
            args = charge_args(state)
            if args["amount"] <= threshold:
                return {"approval_id": None}
            decision = interrupt(
                {"tool": "payments", "action": "charge", "args": args,
                 "reason": f"charge of {args['amount']} is above {threshold}"}
            )  # fmt: skip
            if not decision.get("approved"):
                if decision.get("status") == "timed_out":  # nobody decided: not a rejection
                    raise AgentFailure("approval_timed_out", "the charge's approval timed out")
                raise AgentFailure("approval_rejected", "the charge was rejected by an approver")
            return {"approval_id": decision["approval_id"]}

        def do_reserve(state: Order) -> Order:
            think()
            return {"reservation": reserve(sku=sku, qty=qty, order=order)}

        def do_charge(state: Order) -> Order:
            think()
            return {"charge": charge(**charge_args(state), approval_id=state.get("approval_id"))}

        def do_notify(state: Order) -> Order:
            think()
            to = inp.get("email") or "customer@example.com"
            return {"notification": notify(to=to, message=f"order {order} is on its way")}

        g = StateGraph(Order)
        for name, node in (
            ("price", price),
            ("reserve", do_reserve),
            ("approve", approve),
            ("charge", do_charge),
            ("notify", do_notify),
        ):
            g.add_node(name, node)
        g.add_edge(START, "price")
        g.add_edge("price", "reserve")
        g.add_edge("reserve", "approve")
        g.add_edge("approve", "charge")
        g.add_edge("charge", "notify")
        g.add_edge("notify", END)
        graph = g.compile(checkpointer=ControlPlaneSaver(ctx))
        run_graph(ctx, graph, {})
