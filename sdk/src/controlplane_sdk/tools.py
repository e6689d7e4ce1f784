"""The decorator form of an effect, for tools where it reads better than a ``with`` block::

    @ctx.tool("payments", "charge", compensate={"tool": "payments", "action": "refund"})
    def charge(amount: int, *, idempotency_key: str) -> dict:
        return payments_api.charge(amount, idempotency_key=idempotency_key)

    with ctx.step("charge"):
        receipt = charge(amount=42)      # declared, dispatched, its outcome recorded

Each call is one effect of the enclosing step: its keyword arguments are the effect's ``args``;
the function gets ``idempotency_key=`` if it takes that parameter; its return value is recorded
with the ``committed`` outcome (``detail: {"result": …}``) and returned again, without calling the
function, when the call is a replay. An exception records ``failed`` (or ``unknown`` for a timeout,
see :mod:`controlplane_sdk.effects`) and propagates. Keys are the call's identity (step, tool,
action, position in the step), as for ``ctx.effect``; ``key=`` (a function of the call's keyword
arguments) names it yourself.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast

from .effects import RunHost

__all__ = ["governed", "agoverned"]

R = TypeVar("R")


def governed(
    ctx: RunHost,
    tool: str,
    action: str,
    *,
    key: Callable[..., str] | None = None,
    step: str | None = None,
    compensate: dict[str, Any] | None = None,
    irreversible: bool = False,
    unknown_on: tuple[type[BaseException], ...] = (),
) -> Callable[[Callable[..., R]], Callable[..., R]]:
    """A decorator: every call of the function is a declared effect (see the module docstring)."""

    def wrap(fn: Callable[..., R]) -> Callable[..., R]:
        takes_key = "idempotency_key" in inspect.signature(fn).parameters

        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> R:
            if args:
                raise TypeError(f"{fn.__name__}: a governed tool takes keyword arguments only")
            with ctx.effect(
                tool,
                action,
                key=key(**kwargs) if key else None,
                args=dict(kwargs),
                step=step,
                compensate=compensate,
                irreversible=irreversible,
                unknown_on=unknown_on,
            ) as fx:
                if fx.already_done:
                    recorded = fx.result if isinstance(fx.result, dict) else {}
                    return cast(R, recorded.get("result"))
                if takes_key:
                    kwargs["idempotency_key"] = fx.idempotency_key
                result = fn(**kwargs)
                fx.committed(detail={"result": result})
                return result

        return call

    return wrap


def agoverned(
    ctx: Any,
    tool: str,
    action: str,
    *,
    key: Callable[..., str] | None = None,
    step: str | None = None,
    compensate: dict[str, Any] | None = None,
    irreversible: bool = False,
    unknown_on: tuple[type[BaseException], ...] = (),
) -> Callable[[Callable[..., Awaitable[R]]], Callable[..., Awaitable[R]]]:
    """:func:`governed` for ``async def`` tools on an ``AsyncRunContext``: each awaited call is a
    declared effect (``async with ctx.effect(...)``), a replay returns the recorded result."""

    def wrap(fn: Callable[..., Awaitable[R]]) -> Callable[..., Awaitable[R]]:
        takes_key = "idempotency_key" in inspect.signature(fn).parameters

        @functools.wraps(fn)
        async def call(*args: Any, **kwargs: Any) -> R:
            if args:
                raise TypeError(f"{fn.__name__}: a governed tool takes keyword arguments only")
            async with ctx.effect(
                tool, action, key=key(**kwargs) if key else None, args=dict(kwargs), step=step,
                compensate=compensate, irreversible=irreversible, unknown_on=unknown_on,
            ) as fx:  # fmt: skip
                if fx.already_done:
                    recorded = fx.result if isinstance(fx.result, dict) else {}
                    return cast(R, recorded.get("result"))
                if takes_key:
                    kwargs["idempotency_key"] = fx.idempotency_key
                result = await fn(**kwargs)
                fx.committed(detail={"result": result})
                return result

        return call

    return wrap
