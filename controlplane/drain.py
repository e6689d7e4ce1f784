"""The ASGI side of a graceful drain (core/drain.py says what a drain is; docs/operations/drain.md).

:class:`DrainGate` sits in front of the whole application and

* counts the HTTP requests in flight, so the server can wait until they have all been answered;
* once the drain has started, answers every new request (the probes excepted) with a 503 whose body
  is ``{"error": "draining"}`` and whose ``X-Controlplane-Draining`` header tells a client, or the
  proxy, that the call did nothing and may be sent again, to another replica;
* adds ``Connection: close`` and ``X-Controlplane-Reconnect: 1`` to every answer given while
  draining (the long-polls woken by the drain among them), so no client keeps a socket to a process
  about to exit;
* refuses a new WebSocket handshake (the server closes the open ones with 1012, controlplane/serve.py).
"""

from __future__ import annotations

import asyncio
import json
import time

from controlplane.answer import DRAINING_HEADER, RECONNECT_HEADER, send_json
from controlplane.health import PATHS
from core import drain

_REFUSAL = json.dumps(
    {
        "error": "draining",
        "detail": "this replica is shutting down and did nothing with the call: send it again",
    }
).encode()


class DrainGate:
    def __init__(self, app) -> None:
        self.app = app
        self.in_flight = 0
        self._idle: asyncio.Event | None = None

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            return await self._http(scope, receive, send)
        if scope["type"] == "websocket":
            return await self._websocket(scope, receive, send)
        return await self.app(scope, receive, send)

    async def _http(self, scope, receive, send):
        if drain.is_draining() and scope["path"] not in PATHS:
            return await _refuse(send)
        self.in_flight += 1
        try:
            await self.app(scope, receive, _closing_when_draining(send))
        finally:
            self.in_flight -= 1
            if self.in_flight == 0 and self._idle is not None:
                self._idle.set()

    async def _websocket(self, scope, receive, send):
        if drain.is_draining():
            # Refuse the handshake: the browser's socket retries, on a replica that is staying.
            await receive()  # websocket.connect
            return await send({"type": "websocket.close"})
        await self.app(scope, receive, send)

    async def wait_idle(self, timeout: float) -> bool:
        """Wait until no HTTP request is in flight, at most ``timeout`` s; whether that happened."""
        deadline = time.monotonic() + timeout
        while self.in_flight:
            self._idle = asyncio.Event()
            try:
                await asyncio.wait_for(self._idle.wait(), max(deadline - time.monotonic(), 0))
            except TimeoutError:
                return self.in_flight == 0
        return True


def _closing_when_draining(send):
    async def wrapped(message):
        if message["type"] == "http.response.start" and drain.is_draining():
            headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"connection"]
            headers += [(b"connection", b"close"), (RECONNECT_HEADER, b"1")]
            message = {**message, "headers": headers}
        await send(message)

    return wrapped


async def _refuse(send) -> None:
    await send_json(
        send,
        503,
        _REFUSAL,
        (b"retry-after", b"0"),
        (b"connection", b"close"),
        (DRAINING_HEADER, b"1"),
        (RECONNECT_HEADER, b"1"),
    )
