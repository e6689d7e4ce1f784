"""The refunds agent: a second shape of run, so the console is not one-note. SDK only.

Input: ``{"charge_id": "ch_...", "email": "c@example.com", "reason": "...", "source_run": "<run id>"}``.
Usually created with a run ``deadline`` (the traffic generator sets one).

1. ``lookup``  -- read the charge from the world; record its status as an assumption (age-checked) and
   set a timer ``refund_sla`` (``REFUND_SLA_S``, default 300 s) -- timers keep running while the run is
   paused, and a fired one is reported on the next heartbeat.
2. ``refund``  -- effect ``payments:refund`` with its own idempotency key, declared **irreversible** (no
   compensation: money sent back cannot be un-refunded). A charge that is already refunded is a success
   (``already_refunded``), not a second refund.
3. ``notify``  -- effect ``notifications:enqueue``, declared **irreversible** like the purchase's notice.

If the SLA timer fired before the refund went out, that is recorded as a message in the history.
"""

from __future__ import annotations

from typing import Any

from controlplane_sdk import RunContext

from .common import (
    AgentFailure,
    env_float,
    perform,
    read_world,
    think,
    world_client,
    world_effect,
)

AGENT = "refunds"


def refund(ctx: RunContext) -> None:
    inp: dict[str, Any] = ctx.get_run().get("input") or {}
    charge_id = str(inp.get("charge_id") or "")
    if not charge_id:
        raise AgentFailure("invalid_input", "input.charge_id is required")
    email = str(inp.get("email") or "customer@example.com")
    state: dict[str, Any] = dict(ctx.state)

    with world_client() as world:
        if "charge" not in state:
            think()
            with ctx.step("lookup"):
                charge = read_world(f"look up {charge_id}", lambda: world.get_charge(charge_id))
                ctx.record_assumption(
                    f"charge:{charge_id}",
                    charge.get("status"),
                    max_age_s=3600,
                    meta={"amount": charge.get("amount")},
                )
                sla = ctx.set_timer("refund_sla", in_s=env_float("REFUND_SLA_S", 300))
            state["charge"] = {
                "id": charge_id,
                "amount": charge.get("amount"),
                "status": charge.get("status"),
                "currency": charge.get("currency", "EUR"),
            }
            state["sla_at"] = sla
            ctx.checkpoint("lookup", state)

        if "refund_id" not in state:
            think()
            with ctx.step("refund"):
                args = {"charge_id": charge_id}
                with world_effect(ctx, "payments", "refund", args=args, irreversible=True) as fx:
                    res = perform(fx, lambda key: world.perform("payments", "refund", args, key))
            state["refund_id"] = str(res.get("refund_id") or res.get("id"))
            state["already_refunded"] = bool(res.get("already_refunded"))
            _note_sla(ctx, state)
            ctx.checkpoint("refund", state)

        if "notification_id" not in state:
            think()
            with ctx.step("notify"):
                amount = state["charge"].get("amount")
                args = {
                    "to": email,
                    "message": f"We refunded {amount} {state['charge'].get('currency', 'EUR')} "
                    f"(charge {charge_id}, refund {state['refund_id']}).",
                }
                with world_effect(
                    ctx,
                    "notifications",
                    "enqueue",
                    args=args,
                    irreversible=True,
                ) as fx:
                    res = perform(
                        fx, lambda key: world.perform("notifications", "enqueue", args, key)
                    )
            state["notification_id"] = str(res.get("notification_id") or res.get("id"))
            ctx.checkpoint("notify", state)


def _note_sla(ctx: RunContext, state: dict[str, Any]) -> None:
    for timer in ctx.pop_fired_timers():
        if timer.get("name") == "refund_sla":
            state["sla_missed"] = True
            ctx.event(
                "message",
                {
                    "text": f"refund SLA timer fired before the refund was sent "
                    f"(due {state.get('sla_at')})"
                },
            )
