"""The sync-view gate: at most ``SYNC_VIEW_CONCURRENCY`` sync views run at once in a process
(controlplane/handler.py says why), and no request waits in it for a database known to be down.

While a connection attempt to PostgreSQL failed less than ``DB_DOWN_MEMORY_S`` ago (core/pg/reach.py,
the memory behind the pool's fast refusal), a request that would have to wait for a slot is refused
at once, and every request waiting for one when a refusal is noted is refused then (the gate listens
to ``reach.on_refusal``, as the pool does: no polling). The answer is the API's "did nothing" 503
(api/app.py): ``database_unavailable`` with ``X-Controlplane-Draining: 1``, so the SDK and the load
balancer send it again, to a host that reaches the database. It certainly did nothing: it never
reached a view.

Why: on a black-holed database link, the slots are held by requests stuck on connections TCP has
not given up on yet (``tcp_user_timeout``, 10 s). The pool refused a request at once only when it
got there; it waited for a slot first, 6-7 s in the faults test (docs/operations/faults.md, the
black hole). A request admitted at once still goes to the pool, which may have an idle connection.
"""

from __future__ import annotations

import asyncio
import json
import weakref
from collections import deque

from controlplane.answer import DRAINING_HEADER, send_json
from core.pg import reach


class DatabaseDown(Exception):
    """The request was refused before it had a slot: the database refused a moment ago."""


class SyncGate:
    """A first-come first-served semaphore for one event loop whose waiters a refusal fails."""

    def __init__(self, limit: int, loop: asyncio.AbstractEventLoop) -> None:
        self.limit = limit
        self._free = limit
        self._waiting: deque[asyncio.Future[None]] = deque()
        self._loop = weakref.ref(loop)  # weak: the handler keeps one gate per loop, weakly keyed
        reach.on_refusal(self)

    async def enter(self) -> None:
        """Take a slot, waiting in turn for one; ``DatabaseDown`` while the database is known down."""
        if self._free and not self._waiting:
            self._free -= 1
            return
        if why := reach.refused_recently():
            raise DatabaseDown(why)
        slot = asyncio.get_running_loop().create_future()
        self._waiting.append(slot)
        try:
            await slot
        except asyncio.CancelledError:
            if slot.done() and not slot.cancelled() and slot.exception() is None:
                self.leave()  # handed a slot as it was cancelled: the next one gets it
            raise
        finally:
            if slot in self._waiting:
                self._waiting.remove(slot)

    def leave(self) -> None:
        """Give the slot back: to the longest waiting request, or to the free ones."""
        while self._waiting:
            slot = self._waiting.popleft()
            if not slot.done():
                slot.set_result(None)
                return
        self._free += 1

    def refused(self, why: str) -> None:
        """``reach.note_refused`` (on any thread): the requests waiting now are refused."""
        loop = self._loop()
        if loop is None or loop.is_closed():
            return
        try:
            loop.call_soon_threadsafe(self._refuse_waiting, why)
        except RuntimeError:  # the loop closed meanwhile
            pass

    def _refuse_waiting(self, why: str) -> None:
        waiting, self._waiting = self._waiting, deque()
        for slot in waiting:
            if not slot.done():
                slot.set_exception(DatabaseDown(why))


async def refuse(send, why: str) -> None:
    """The API's "did nothing" 503 (api/app.py ``database_unavailable``), sent from the event loop."""
    body = json.dumps(
        {
            "error": "database_unavailable",
            "detail": "this replica could not reach the database and did nothing with the call: "
            f"send it again ({why})",
            "field": "",
        }
    ).encode()
    await send_json(send, 503, body, (b"retry-after", b"0"), (DRAINING_HEADER, b"1"))
