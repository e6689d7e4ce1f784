"""What the demo agents share: configuration, failure classes, and the "declare → call the world →
record the outcome" helper.

Environment (all optional):

=========================  ===================================================================
``CONTROLPLANE_URL``       control plane root (default ``http://127.0.0.1:8000``)
``CONTROLPLANE_TOKEN``     worker bearer token (default: the contents of ``var/demo-worker-token``)
``WORLD_URL``              the demo world (default ``http://127.0.0.1:8100``)
``AGENT_WORLD_TIMEOUT_S``  how long an agent waits for the world (default 2 s: a ``timeout``
                           fault with ``delay_ms`` 3000 is then an ambiguous timeout)
``APPROVAL_THRESHOLD``     purchases above this amount need a human approval (default 200)
``APPROVAL_DEADLINE_S``    deadline of such an approval (default 900 s)
``CHILD_TIMEOUT_S``        how long a purchase waits for its address check (default 120 s)
``DEMO_STEP_SECONDS``      how long an agent "thinks" before each step, like an LLM agent would
                           (default 3 s, jittered 0.5-1.5x; 0 in the tests)
``DEMO_DISPATCH_SECONDS``  how long a declared effect stays in flight before the world is called
                           (default 1.5 s, jittered 0.5-1.5x; 0 in the tests)
=========================  ===================================================================

The two DEMO_* delays exist so that an operator watching `make run` can open a run, see an effect in
flight and pause the run before it is over; they are not part of any protocol.

Outcome mapping (the point of the demo, see ``world.client``): a :class:`~world.client.WorldTimeout`
(sent, no answer: it may have committed) is recorded ``unknown`` -- recovery reconciles it with the
world by idempotency key; any other :class:`~world.client.WorldError` / ``WorldUnavailable`` (the world
refused, or was never reached) is recorded ``failed``. Either way the agent then raises
:class:`AgentFailure`, whose ``failure_class`` the SDK's loop puts on the finished attempt.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

from controlplane_sdk import (
    EffectAlreadyFailed,
    EffectCompensated,
    EffectScope,
    EffectUnresolved,
    RunContext,
)
from world.client import WorldClient, WorldError, WorldTimeout, WorldUnavailable

ROOT = Path(__file__).resolve().parent.parent

#: sent with every claim and run creation; bump when the agents' behaviour changes
VERSIONS: dict[str, Any] = {
    "code": "demo-agents 1.0.0",
    "model": "scripted (no LLM)",
    "tools": {"inventory": "1.0", "shipping": "1.0", "payments": "3.1", "notifications": "1.0"},
    "config_hash": "demo-1",
}
# A deployment bumps tool versions, e.g. AGENT_TOOL_VERSIONS="payments=3.2" (what a resume then sees).
for _pair in filter(None, os.environ.get("AGENT_TOOL_VERSIONS", "").split(",")):
    _tool, _, _version = _pair.partition("=")
    VERSIONS["tools"][_tool.strip()] = _version.strip()


def follow_deployed_versions(every_s: float = 2.0, stop: threading.Event | None = None) -> None:
    """Keep VERSIONS (the very dict the run loop and the traffic send) in step with the versions
    ``manage.py demo_bump_tool_version`` deployed (var/demo-tool-versions.json): a daemon thread."""
    var = os.environ.get("CONTROLPLANE_VAR_DIR") or Path(__file__).resolve().parent.parent / "var"
    path = Path(var) / "demo-tool-versions.json"

    def follow() -> None:
        seen = None
        while stop is None or not stop.is_set():
            try:
                stamp = os.stat(path).st_mtime
                if stamp != seen:
                    with open(path) as f:
                        VERSIONS["tools"].update({str(k): str(v) for k, v in json.load(f).items()})
                    seen = stamp
            except (OSError, ValueError):
                pass  # not deployed (yet), or being written: the next look
            time.sleep(every_s)

    threading.Thread(target=follow, name="deployed-versions", daemon=True).start()


#: set by the worker process on SIGTERM/SIGINT; long waits inside an agent give up when it is set
SHUTDOWN = threading.Event()

#: world error code -> failure class of the run
FAILURE_CLASSES = {
    "card_declined": "payment_declined",
    "amount_over_limit": "payment_declined",
    "insufficient_stock": "out_of_stock",
    "unknown_sku": "unknown_sku",
    "unknown_charge": "unknown_charge",
    "idempotency_key_reused": "idempotency_key_reused",
}


def env_float(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, "") or default)
    except ValueError:
        return default


def controlplane_url() -> str:
    return os.environ.get("CONTROLPLANE_URL") or "http://127.0.0.1:8000"


def controlplane_token() -> str:
    token = os.environ.get("CONTROLPLANE_TOKEN", "").strip()
    if not token:
        path = ROOT / "var" / "demo-worker-token"
        token = path.read_text().strip() if path.exists() else ""
    if not token:
        raise SystemExit(
            "no worker token: set CONTROLPLANE_TOKEN or run `manage.py seed_demo` "
            "(it writes var/demo-worker-token)"
        )
    return token


def world_url() -> str:
    return os.environ.get("WORLD_URL") or "http://127.0.0.1:8100"


def _human_delay(name: str, default: float) -> None:
    """Sleep ``name`` seconds (env, jittered 0.5-1.5x); cut short when the worker is stopping."""
    seconds = env_float(name, default)
    if seconds > 0:
        SHUTDOWN.wait(seconds * random.uniform(0.5, 1.5))


def think() -> None:
    """The agent deciding on its next step (an LLM call, in a real agent). Called *before* a step
    boundary, so a pause issued while it thinks is honoured at that boundary."""
    _human_delay("DEMO_STEP_SECONDS", 3.0)


class DemoWorldClient(WorldClient):
    """``WorldClient`` plus the one read the refunds agent needs."""

    def get_charge(self, charge_id: str) -> dict[str, Any]:
        return self._call("GET", f"/payments/charges/{quote(charge_id, safe='')}")


def world_client() -> DemoWorldClient:
    return DemoWorldClient(world_url(), timeout=env_float("AGENT_WORLD_TIMEOUT_S", 2.0))


class AgentFailure(Exception):
    """The run cannot go on; ``failure_class`` ends up on the failed attempt (``payment_declined``,
    ``world_timeout``, ``approval_rejected``, ...)."""

    def __init__(self, failure_class: str, message: str):
        super().__init__(message)
        self.failure_class = failure_class


class WorkerShutdown(BaseException):
    """The worker process is stopping while a run waits (for a child or an approval).

    Deliberately *not* an ``Exception``: the SDK's loop must not finish the run ``failed`` for it. The
    lease is simply left to expire, exactly as if the worker had disappeared; the control plane then
    detects the orphaned run and recovers it from its last checkpoint.
    """


def read_world(what: str, call: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """A read from the world (no effect). Maps errors to :class:`AgentFailure`."""
    try:
        return call()
    except WorldTimeout as exc:
        raise AgentFailure("world_timeout", f"{what}: no answer from the world ({exc})") from exc
    except WorldUnavailable as exc:
        raise AgentFailure("world_unavailable", f"{what}: {exc}") from exc
    except WorldError as exc:
        raise AgentFailure(FAILURE_CLASSES.get(exc.error, exc.error), f"{what}: {exc}") from exc


@contextlib.contextmanager
def world_effect(
    ctx: RunContext,
    tool: str,
    action: str,
    *,
    args: dict[str, Any],
    compensate: dict[str, Any] | None = None,
    irreversible: bool = False,
    approval_id: str | None = None,
    step: str | None = None,
) -> Iterator[EffectScope]:
    """``ctx.effect(...)`` with the demo's key policy.

    The key is the SDK's stable default ``{run_id}:{step}:{tool}:{action}``, so a resumed, redriven or
    retried attempt re-declares the *same* key: the control plane answers ``replayed`` for a committed
    effect (``fx.already_done``: don't call the world again) and refuses an unresolved one.

    Two exceptions need a fresh key: that key is recorded ``failed`` (e.g. a declined card, then an
    operator retries -- the world stores business refusals under their key too), or its effect was
    compensated (a redrive undid it first: the control plane refuses the key, ``EffectCompensated``,
    and doing it again is a new effect). The ledger is consulted first, so an attempt never opens a
    second key while an earlier one committed (and stands) or is still unresolved; the fresh key is
    ``{base}:try-{attempt number}``.
    """
    step = step or ctx.current_step
    if not step:
        raise ValueError("world_effect needs a step")
    base = f"{ctx.run_id}:{step}:{tool}:{action}"
    kw: dict[str, Any] = dict(
        args=args,
        step=step,
        compensate=compensate,
        irreversible=irreversible,
        approval_id=approval_id,
    )
    with contextlib.ExitStack() as stack:
        try:
            try:
                fx = stack.enter_context(ctx.effect(tool, action, key=base, **kw))
            except (EffectAlreadyFailed, EffectCompensated):
                fx = stack.enter_context(ctx.effect(tool, action, key=_next_key(ctx, base), **kw))
        except EffectUnresolved as exc:
            raise AgentFailure(
                "effect_unresolved",
                f"{tool}:{action} has an unresolved earlier effect ({exc.effect_status}): "
                "it must be reconciled before this step can run again",
            ) from exc
        yield fx


def _next_key(ctx: RunContext, base: str) -> str:
    same = [
        e
        for e in ctx.client.list_effects(ctx.run_id)
        if e.get("decision") in ("authorized", "replayed")
        and (
            e.get("idempotency_key") == base
            or str(e.get("idempotency_key", "")).startswith(base + ":try-")
        )
    ]
    for e in same:  # committed (replay it) or unresolved (the declaration will refuse): reuse it
        if e.get("compensation_status") == "compensated":
            continue  # undone: its key is refused, and it must happen again under a new one
        if e.get("status") in ("committed", "in_flight", "unknown"):
            return str(e["idempotency_key"])
    return f"{base}:try-{ctx.attempt.number}"


def perform(fx: EffectScope, call: Callable[[str], dict[str, Any]]) -> dict[str, Any]:
    """Dispatch a declared effect with its idempotency key and record what the world said.

    Returns the world's result (or, for a replayed effect, what the ledger recorded, without calling the
    world). Raises :class:`AgentFailure` after recording ``unknown`` (no answer) or ``failed``.
    """
    if fx.already_done:
        detail = fx.result if isinstance(fx.result, dict) else {}
        return {**detail, "id": fx.external_ref or detail.get("id")}
    what = f"{fx.tool}:{fx.action} (key {fx.idempotency_key})"
    _human_delay("DEMO_DISPATCH_SECONDS", 1.5)  # declared, in flight: what a pause would land on
    try:
        result = call(fx.idempotency_key)
    except WorldTimeout as exc:
        fx.unknown({"error": "world_timeout", "message": str(exc)[:500]})
        raise AgentFailure(
            "world_timeout",
            f"{what}: sent but no answer -- outcome unknown until reconciled with the world",
        ) from exc
    except WorldUnavailable as exc:
        fx.failed({"error": "world_unavailable", "status": exc.status, "message": str(exc)[:500]})
        raise AgentFailure("world_unavailable", f"{what}: {exc}") from exc
    except WorldError as exc:
        fx.failed(
            {"error": exc.error, "status": exc.status, "injected": exc.injected, "body": exc.body}
        )
        raise AgentFailure(
            FAILURE_CLASSES.get(exc.error, f"{fx.tool}_{exc.error}"), f"{what}: {exc}"
        ) from exc
    fx.committed(external_ref=str(result.get("id") or ""), detail=result)
    return result
