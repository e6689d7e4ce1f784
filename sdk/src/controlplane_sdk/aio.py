"""``AsyncClient``: the protocol for agents written with asyncio.

Each method is the synchronous :class:`~controlplane_sdk.Client`'s, run on a worker thread, so an
async agent's event loop never blocks on the control plane while the wire format (paths, bodies,
error mapping, retries of idempotent calls) stays in one place. The heartbeat long-poll and the
long-poll for work therefore wait on a thread, not on the loop.

    async with AsyncClient("http://localhost:8000", token) as cp:
        claim = await cp.claim_next("worker-1", ["purchasing"], wait_s=20)
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import Any

from .client import Client

# Every public call of Client (plus OperatorCalls), as a coroutine.
_CALLS = sorted(
    name
    for name in dir(Client)
    if not name.startswith("_")
    and callable(getattr(Client, name))
    and name not in {"close", "parse_approval", "assumption_event", "timer_event"}
)


class AsyncClient:
    def __init__(self, base_url: str, token: str, **kw: Any) -> None:
        self.sync = Client(base_url, token, **kw)

    def __getattr__(self, name: str) -> Callable[..., Awaitable[Any]]:
        if name not in _CALLS:
            raise AttributeError(name)
        method = getattr(self.sync, name)

        @functools.wraps(method)
        async def call(*args: Any, **kwargs: Any) -> Any:
            return await asyncio.to_thread(method, *args, **kwargs)

        return call

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(_CALLS))

    async def aclose(self) -> None:
        await asyncio.to_thread(self.sync.close)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
