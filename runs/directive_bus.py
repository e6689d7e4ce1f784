"""Wake long-polling heartbeats when a run changes, without polling the database in a tight loop.

On PostgreSQL one LISTEN connection per process (per event loop) receives ``pg_notify('cp_runs',
run_id)``, which services send inside the deciding transaction -- so a waiter is woken only after the
decision commits. On SQLite (the embedded demo) there is no NOTIFY: waiters re-check every
``FALLBACK_POLL_S``.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict

from django.db import connection

from core import drain, pg
from runs.work import NOTIFY_CHANNEL

logger = logging.getLogger(__name__)
FALLBACK_POLL_S = 0.25


class RunChangeBus:
    def __init__(self) -> None:
        self._waiters: dict[str, set[asyncio.Event]] = defaultdict(set)
        self._listener: asyncio.Task | None = None
        self._ready = asyncio.Event()  # replaced by a fresh one whenever a listener (re)starts
        # A draining process answers its long-polls now (core/drain.py): wake every waiter.
        drain.on_drain(self.wake_all)

    def wake_all(self) -> None:
        for waiters in list(self._waiters.values()):
            for event in waiters:
                event.set()

    @property
    def uses_notify(self) -> bool:
        return pg.enabled(connection)

    def subscribe(self, run_id: str) -> asyncio.Event:
        event = asyncio.Event()
        self._waiters[run_id].add(event)
        return event

    def subscribe_keys(self, keys: list[str]) -> asyncio.Event:
        """One event woken by any of ``keys`` (a worker waiting for work of several agents)."""
        event = asyncio.Event()
        for key in keys:
            self._waiters[key].add(event)
        return event

    def unsubscribe_keys(self, keys: list[str], event: asyncio.Event) -> None:
        for key in keys:
            self.unsubscribe(key, event)

    def unsubscribe(self, run_id: str, event: asyncio.Event) -> None:
        waiters = self._waiters.get(run_id)
        if waiters is not None:
            waiters.discard(event)
            if not waiters:
                self._waiters.pop(run_id, None)

    async def start(self) -> bool:
        """Ensure the LISTEN task runs; True once it is listening (so no NOTIFY can be missed after)."""
        if not self.uses_notify:
            return False
        if self._listener is None or self._listener.done():
            self._ready = asyncio.Event()
            self._listener = asyncio.create_task(self._listen(dict(connection.settings_dict)))
        try:
            await asyncio.wait_for(self._ready.wait(), timeout=5)
        except TimeoutError:
            return False
        return True

    async def _listen(self, settings_dict: dict) -> None:
        import psycopg

        params = {
            "dbname": settings_dict["NAME"],
            "user": settings_dict.get("USER") or None,
            "password": settings_dict.get("PASSWORD") or None,
            "host": settings_dict.get("HOST") or None,
            "port": settings_dict.get("PORT") or None,
        }
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(
                    autocommit=True, **{k: v for k, v in params.items() if v}
                ) as conn:
                    await conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
                    self._ready.set()
                    async for note in conn.notifies():
                        for event in list(self._waiters.get(note.payload, ())):
                            event.set()
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.warning(
                    "directive listener lost its connection; reconnecting", exc_info=True
                )
                # Wake everyone so they re-read from the database rather than miss a change.
                self.wake_all()
                await asyncio.sleep(0.5)

    async def wait(self, event: asyncio.Event, timeout: float, listening: bool) -> None:
        """Wait until woken or ``timeout``; without NOTIFY, at most FALLBACK_POLL_S before re-checking."""
        if drain.is_draining():
            return  # the caller answers now: this process is about to exit
        step = timeout if listening else min(timeout, FALLBACK_POLL_S)
        try:
            await asyncio.wait_for(event.wait(), timeout=max(step, 0))
        except TimeoutError:
            pass
        event.clear()


_buses: dict[int, RunChangeBus] = {}


def get_bus() -> RunChangeBus:
    """One bus per event loop (tests create several loops; a server has one)."""
    loop = asyncio.get_running_loop()
    bus = _buses.get(id(loop))
    if bus is None:
        bus = _buses[id(loop)] = RunChangeBus()
    return bus
