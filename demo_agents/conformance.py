"""The demo agents under the SDK's conformance kit (``python -m controlplane_sdk.conformance
demo_agents.conformance:purchasing``; also ``lg_purchasing``, ``oa_purchasing``).

Each builder runs the demo agent's own code unchanged, with two things the kit needs swapped in
for the length of a run: the demo world becomes the kit's tool stand-in (every world write goes to
``tools.call`` with the effect's idempotency key, a stand-in timeout is the world's ambiguous
``WorldTimeout``), and the demo's human pacing is off. The purchasing agent's address check is a
child run; the kit's control plane has no other worker, so the parent's wait runs the child
(``address-verifier``, its own code) inline, as the next worker to claim it would.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import Any

from controlplane_sdk import RunContext, Worker, run_one
from world.client import WorldTimeout

from . import address_verifier, lg_purchasing, oa_purchasing
from . import purchasing as sdk_purchasing

RUN_INPUT = {
    "sku": "sku-1",
    "qty": 1,
    "email": "kit@example.com",
    "address": "1 Main St, 10115 Berlin",
}
_NO_PACING = {"DEMO_STEP_SECONDS": "0", "DEMO_DISPATCH_SECONDS": "0", "APPROVAL_THRESHOLD": "1000"}


class StandInWorld:
    """The demo world's client surface, answered by the kit's tool stand-in."""

    def __init__(self, tools: Any) -> None:
        self.tools = tools

    def __enter__(self) -> StandInWorld:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def close(self) -> None:
        return None

    def get_item(self, sku: str) -> dict[str, Any]:
        return {"sku": sku, "price": 20.0, "stock": 10}

    def perform(self, system: str, action: str, args: dict[str, Any], key: str) -> dict[str, Any]:
        try:
            return dict(self.tools.call(system, action, args, idempotency_key=key))
        except TimeoutError as exc:  # accepted, then no answer: the world's ambiguous timeout
            raise WorldTimeout(str(exc)) from exc

    def reserve(self, sku: str, qty: int, key: str, order: str | None = None) -> dict[str, Any]:
        return self.perform("inventory", "reserve", {"sku": sku, "qty": qty, "order": order}, key)

    def charge(self, amount: float, key: str, **kw: Any) -> dict[str, Any]:
        return self.perform("payments", "charge", {"amount": amount, **kw}, key)

    def enqueue_notification(self, to: str, message: str, key: str) -> dict[str, Any]:
        return self.perform("notifications", "enqueue", {"to": to, "message": message}, key)


@contextlib.contextmanager
def _swapped(module: Any, tools: Any, **more: Any) -> Iterator[None]:
    """The module's world and pacing swapped for the kit's, restored after the run."""
    saved_env = {k: os.environ.get(k) for k in _NO_PACING}
    saved = {name: getattr(module, name) for name in ("world_client", *more)}
    os.environ.update(_NO_PACING)
    module.world_client = lambda: StandInWorld(tools)
    for name, value in more.items():
        setattr(module, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(module, name, value)
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


_wait_for_child = sdk_purchasing._wait_for_child  # the agent's own wait, before the swap


def _child_inline(ctx: RunContext, child_id: str, timeout: float) -> dict[str, Any]:
    """The parent's wait for its address check: a boundary, then the child run executed here."""
    ctx.check_directive()
    if ctx.client.get_run(child_id).get("state") not in ("succeeded", *sdk_purchasing.CHILD_DEAD):
        child = Worker(ctx.client, "kit-child-worker", address_verifier.AGENT)
        run_one(child.claim(child_id, heartbeat=False), address_verifier.verify)
    return _wait_for_child(ctx, child_id, timeout)


def _builder(module: Any, run: Callable[[RunContext], Any], **more: Any) -> Any:
    def build(tools: Any) -> Callable[[RunContext], Any]:
        def run_fn(ctx: RunContext) -> Any:
            with _swapped(module, tools, **more):
                return run(ctx)

        return run_fn

    build.run_input = RUN_INPUT  # type: ignore[attr-defined]  # the kit creates runs with it
    return build


def _purchase(ctx: RunContext) -> Any:
    return sdk_purchasing.purchase(ctx)


#: the SDK demo agent (six steps, a child run, compensations, an irreversible notification)
purchasing = _builder(sdk_purchasing, _purchase, _wait_for_child=_child_inline)
#: the LangGraph demo agent
lg_purchasing_agent = _builder(lg_purchasing, lambda ctx: lg_purchasing.purchase(ctx))
#: the OpenAI Agents SDK demo agent
oa_purchasing_agent = _builder(oa_purchasing, lambda ctx: oa_purchasing.purchase(ctx))
