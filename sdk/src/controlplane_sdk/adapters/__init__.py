"""Adapters that govern agents written with other frameworks, with no rewrite of the agent:

* :mod:`controlplane_sdk.adapters.langgraph` -- a checkpointer that stores graph checkpoints as
  control-plane checkpoints, governed tools, ``interrupt()`` mapped to approvals.
* :mod:`controlplane_sdk.adapters.openai_agents` -- function tools wrapped so every call is a declared
  effect; ``needs_approval`` tools become control-plane approvals; ``RunState`` is the checkpoint.
* :mod:`controlplane_sdk.adapters.mcp_gateway` -- an MCP server in front of real MCP tool servers: every
  ``tools/call`` is a declared effect of the caller's run.

Each imports its framework lazily: install the extra (``pip install 'controlplane-sdk[langgraph]'``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

from ..effects import ScopeBase

_current: ContextVar[ScopeBase | None] = ContextVar("controlplane_effect", default=None)


def current_effect() -> ScopeBase:
    """The declared effect of the governed tool call in progress: a tool that talks to an external
    system sends ``current_effect().idempotency_key`` with its request, so a replay cannot do it twice."""
    fx = _current.get()
    if fx is None:
        raise RuntimeError("current_effect() is only available inside a governed tool call")
    return fx


def recorded(fx: ScopeBase, field: str, default: Any = None) -> Any:
    """What an earlier attempt recorded for a replayed effect (its outcome detail's ``field``): the
    adapters answer a replayed tool call with it instead of calling the tool again."""
    detail = fx.result if isinstance(fx.result, dict) else {}
    return detail.get(field, default)


@contextlib.contextmanager
def effect_in_progress(fx: ScopeBase) -> Iterator[ScopeBase]:
    token = _current.set(fx)
    try:
        yield fx
    finally:
        _current.reset(token)
