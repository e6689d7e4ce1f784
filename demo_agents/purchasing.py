"""The purchasing agent (docs/operator/scenarios.md, "the run"). SDK only.

Input: ``{"sku": "sku-1", "qty": 2, "address": "1 Main St, 10115 Berlin, DE", "email": "c@example.com",
"card": "4242424242424242" (optional), "order": "..." (optional, defaults to the run id)}``.

Steps (each a ``ctx.step`` boundary where pause/cancel/stop directives are honoured, each followed by a
checkpoint carrying the accumulated state, so a resume or redrive restarts at the next boundary and
skips what is already in ``ctx.state``):

1. ``assumptions`` -- read price and stock; record them as assumptions (checkers ``price`` and ``stock``,
   keys ``price:<sku>`` / ``stock:<sku>``) so a resume can revalidate them against the world.
2. ``reserve``   -- effect ``inventory:reserve``, compensation ``inventory:release``.
3. ``verify_address`` -- delegates to a child run of ``address-verifier`` holding the delegated grant
   ``address:verify``; any worker executes it. The child's id is checkpointed at once, so a resumed
   parent waits for the same child instead of starting another; the parent polls the child's state with
   directive checks in between and gives up after ``CHILD_TIMEOUT_S`` (failure ``child_timeout``).
4. ``label``     -- effect ``shipping:create_label``, compensation ``shipping:void_label``.
5. ``charge``    -- effect ``payments:charge``, compensation ``payments:refund``. Above
   ``APPROVAL_THRESHOLD`` (default 200) a planned approval boundary: the agent requests approval for
   exactly these args, waits (the run is ``awaiting_approval``), then declares citing the approval.
   The server enforces the same boundary: the demo registers ``payments:charge amount>200 approver``
   for this agent (seed_demo), so a charge above 200 without an approval is denied
   ``approval_required`` whatever the worker does. Keep the two numbers in step.
6. ``notify``    -- effect ``notifications:enqueue`` declared **irreversible**: a customer who was told
   cannot be untold, and the world sends a queued notification within seconds (its cancel is then
   refused ``already_sent``). So a compensation plan calls it out as irreversible instead of trying a
   cancel that would usually fail and end the compensation ``partially_failed``.

Every world call carries the effect's idempotency key. A world timeout (the call may have committed)
is recorded ``unknown`` and the run fails with ``world_timeout``; a refusal is recorded ``failed``
and the run fails with e.g. ``payment_declined`` / ``out_of_stock`` (see :mod:`demo_agents.common`).
"""

from __future__ import annotations

import time
from typing import Any

from controlplane_sdk import RunContext

from .common import (
    SHUTDOWN,
    VERSIONS,
    AgentFailure,
    WorkerShutdown,
    env_float,
    perform,
    read_world,
    think,
    world_client,
    world_effect,
)

AGENT = "purchasing"
CHILD_AGENT = "address-verifier"
DEFAULT_CARD = "4242424242424242"
#: states in which a child will not get to ``succeeded`` without an operator
CHILD_DEAD = {"failed", "cancelled", "compensating", "compensated", "closed"}


def approval_threshold() -> float:
    return env_float("APPROVAL_THRESHOLD", 200.0)


def purchase(ctx: RunContext) -> None:
    run = ctx.get_run()
    inp: dict[str, Any] = run.get("input") or {}
    sku = str(inp.get("sku") or "sku-1")
    qty = int(inp.get("qty") or 1)
    order = str(inp.get("order") or ctx.run_id)
    email = str(inp.get("email") or "customer@example.com")
    card = str(inp.get("card") or DEFAULT_CARD)
    state: dict[str, Any] = dict(ctx.state)
    if ctx.start_checkpoint is not None:
        ctx.event(
            "message",
            {
                "text": f"resuming after checkpoint {ctx.start_checkpoint.seq} "
                f"({ctx.start_checkpoint.step}); completed: {sorted(state)}"
            },
        )

    with world_client() as world:
        # 1. price and stock, recorded as assumptions ------------------------------------------------
        if "price" not in state:
            think()
            with ctx.step("assumptions"):
                item = read_world(f"read {sku}", lambda: world.get_item(sku))
                price, stock = float(item["price"]), int(item["stock"])
                ctx.record_assumption(
                    f"price:{sku}",
                    price,
                    max_age_s=1800,
                    checker="price",
                    meta={"sku": sku, "tolerance_pct": 0},
                )
                ctx.record_assumption(
                    f"stock:{sku}",
                    stock,
                    max_age_s=1800,
                    checker="stock",
                    meta={"sku": sku, "need": qty},
                )
            state.update(
                sku=sku,
                qty=qty,
                order=order,
                price=price,
                amount=round(price * qty, 2),
                stock_seen=stock,
            )
            ctx.checkpoint("assumptions", state)

        # 2. reserve inventory ------------------------------------------------------------------------
        if "reservation_id" not in state:
            think()
            with ctx.step("reserve"):
                args = {"sku": sku, "qty": qty, "order": order}
                with world_effect(
                    ctx,
                    "inventory",
                    "reserve",
                    args=args,
                    compensate={"tool": "inventory", "action": "release"},
                ) as fx:
                    res = perform(fx, lambda key: world.perform("inventory", "reserve", args, key))
            state["reservation_id"] = str(res.get("reservation_id") or res.get("id"))
            ctx.checkpoint("reserve", state)

        # 3. address verification, delegated to a child run ------------------------------------------
        if "address" not in state:
            think()
            with ctx.step("verify_address"):
                address = _verify_address(ctx, state, inp, order)
            state["address"] = address
            ctx.checkpoint("verify_address", state)

        # 4. shipping label -------------------------------------------------------------------------
        if "label_id" not in state:
            think()
            with ctx.step("label"):
                args = {"order": order, "address": state["address"]}
                with world_effect(
                    ctx,
                    "shipping",
                    "create_label",
                    args=args,
                    compensate={"tool": "shipping", "action": "void_label"},
                ) as fx:
                    res = perform(
                        fx, lambda key: world.perform("shipping", "create_label", args, key)
                    )
            state["label_id"] = str(res.get("label_id") or res.get("id"))
            state["tracking"] = res.get("tracking") or ""
            ctx.checkpoint("label", state)

        # 5. charge the card (approval boundary above the threshold) ---------------------------------
        if "charge_id" not in state:
            amount = float(state["amount"])
            args = {"amount": amount, "currency": "EUR", "card": card, "order": order}
            think()
            with ctx.step("charge"):
                approval_id = None
                if amount > approval_threshold() and not _charge_committed(ctx):
                    approval_id = _approval(ctx, args, amount)
                with world_effect(
                    ctx,
                    "payments",
                    "charge",
                    args=args,
                    approval_id=approval_id,
                    compensate={"tool": "payments", "action": "refund"},
                ) as fx:
                    res = perform(fx, lambda key: world.perform("payments", "charge", args, key))
            state["charge_id"] = str(res.get("charge_id") or res.get("id"))
            ctx.checkpoint("charge", state)

        # 6. customer notification ------------------------------------------------------------------
        if "notification_id" not in state:
            think()
            with ctx.step("notify"):
                args = {
                    "to": email,
                    "message": f"Order {order}: {qty} x {sku} for {state['amount']:.2f} EUR is on its way "
                    f"(tracking {state.get('tracking') or state['label_id']}).",
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


# -- delegation -------------------------------------------------------------------------------------


def _verify_address(ctx: RunContext, state: dict[str, Any], inp: dict[str, Any], order: str) -> str:
    """Start (or find) the child run, checkpoint its id, wait for it; returns the verified address."""
    address = str(inp.get("address") or "1 Main St, 10115 Berlin, DE")
    child_id = state.get("address_child")
    if child_id and ctx.client.get_run(child_id).get("state") in CHILD_DEAD:
        ctx.event(
            "message",
            {"text": f"address check {child_id} ended without success; starting a new one"},
        )
        state.setdefault("failed_address_children", []).append(child_id)
        child_id = None
    if not child_id:
        # A child created by an attempt that died before checkpointing it is adopted, not duplicated.
        skip = set(state.get("failed_address_children", []))
        live = [
            c
            for c in ctx.get_run().get("children", [])
            if c.get("agent") == CHILD_AGENT
            and c.get("state") not in CHILD_DEAD
            and c.get("id") not in skip
        ]
        if live:
            child_id = str(live[0]["id"])
        else:
            child = ctx.client.create_run(
                CHILD_AGENT,
                f"verify the shipping address of order {order}",
                {"address": address, "order": order},
                parent_run_id=ctx.run_id,
                versions=dict(VERSIONS),
                authority=[{"scope": "address:verify", "ttl_s": 3600}],
            )
            child_id = str(child["id"])
        state["address_child"] = child_id
        ctx.checkpoint(
            "delegate_address", state
        )  # a resume waits for this child instead of starting another
        ctx.event("message", {"text": f"waiting for address check {child_id}"})

    child = _wait_for_child(ctx, child_id, env_float("CHILD_TIMEOUT_S", 120.0))
    verdict = ((child.get("checkpoint") or {}).get("state") or {}).get("verdict") or {}
    return str(verdict.get("normalized") or address)


def _wait_for_child(ctx: RunContext, child_id: str, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        ctx.check_directive()  # heartbeats; raises on pause/cancel/stop of this (parent) run
        child = ctx.client.get_run(child_id)
        st = child.get("state")
        if st == "succeeded":
            return child
        if st in CHILD_DEAD:
            failure = (
                next(
                    (
                        a.get("failure_class")
                        for a in reversed(child.get("attempts") or [])
                        if a.get("failure_class")
                    ),
                    "",
                )
                or st
            )
            raise AgentFailure(
                "address_verification_failed", f"address check {child_id} ended {st} ({failure})"
            )
        if SHUTDOWN.is_set():
            raise WorkerShutdown()
        if time.monotonic() > deadline:
            raise AgentFailure(
                "child_timeout", f"address check {child_id} still {st} after {timeout:.0f}s"
            )
        SHUTDOWN.wait(0.5)


# -- approval ---------------------------------------------------------------------------------------


def _charge_committed(ctx: RunContext) -> bool:
    """Did an earlier attempt already commit the charge (crash before the checkpoint, or reconciled)?
    Then its declaration will be replayed and no approval is needed."""
    return any(
        e.get("tool") == "payments"
        and e.get("action") == "charge"
        and e.get("status") == "committed"
        # refunded first by a redrive: undone, so the charge happens again (and asks again)
        and e.get("compensation_status") != "compensated"
        for e in ctx.client.list_effects(ctx.run_id)
    )


def _approval(ctx: RunContext, args: dict[str, Any], amount: float) -> str:
    deadline_s = int(env_float("APPROVAL_DEADLINE_S", 900))
    approval_id = ctx.request_approval(
        "payments",
        "charge",
        args,
        f"charge of {amount:.2f} EUR is over the auto-approve limit of {approval_threshold():.2f} EUR",
        deadline_s,
    )
    ctx.event(
        "message", {"text": f"waiting for approval {approval_id} of a {amount:.2f} EUR charge"}
    )
    give_up = (
        time.monotonic() + deadline_s + 120
    )  # the server times the approval out; this is a backstop
    while True:
        approval = ctx.await_approval(approval_id, timeout=5)
        if not approval.pending:
            break
        if ctx.directive in ("pause", "cancel", "stop") or ctx.lease_lost:
            ctx.check_directive()  # raises the matching interrupt; the loop releases the lease
        if SHUTDOWN.is_set():
            raise WorkerShutdown()
        if time.monotonic() > give_up:
            raise AgentFailure(
                "approval_timed_out", f"approval {approval_id} was not decided in time"
            )
    if not approval.approved:
        ctx.check_directive()  # a cancel or pause that superseded the request is honoured as such
        cls = (
            "approval_rejected" if approval.status == "rejected" else f"approval_{approval.status}"
        )
        raise AgentFailure(
            cls,
            f"charge of {amount:.2f} EUR not approved: {approval.status} {approval.reason or ''}",
        )
    ctx.check_directive()
    return approval_id
