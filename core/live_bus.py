"""The embedded default's channel layer: in-memory for this process's sockets, a SQLite file between
processes. Under `make run` the console's sockets live in the web process, but the Celery worker and
beat write facts too (recovery, revalidation, reconcile answers, compensation, fleet waves); with
channels' in-memory layer alone their hints never left their process (issue 18).

How it works (docs/concepts/architecture.md, "Live pages"): a ``group_send`` is delivered at once to
this process's own members (channels' InMemoryChannelLayer) and, when another process is listening,
written as one row to the bus file (``var/live-bus.sqlite3``, WAL). A process whose sockets joined a
group starts one poller thread that reads the rows other processes wrote every ``poll_s`` (50 ms)
and hands them to its sockets' event loop; it also marks itself listening, so a process with no
sockets (the worker) writes rows only while a web process reads them, and the web process writes
none while it is the only listener. Groups in ``round_trip_groups`` (the heartbeat) always travel
through the file, even to this process's own sockets, so a page that hears the heartbeat knows the
whole path works.

Why not a package: channels-postgres needs PostgreSQL (the embedded default is SQLite; PostgreSQL
deployments run channels-redis); channels-lite and channels-sqlite are alpha or single-release
projects that store one row per channel per message in the application database and serve even
in-process sends by polling it -- every protocol hint would then contend for the demo database's
single writer lock. Only hints travel here; the pages re-render from the database.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sqlite3
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from channels.layers import InMemoryChannelLayer

logger = logging.getLogger(__name__)

SCHEMA = """
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT, at REAL NOT NULL, origin TEXT NOT NULL,
    grp TEXT NOT NULL, body TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS listeners (origin TEXT PRIMARY KEY, pid INTEGER, seen REAL NOT NULL);
"""
LISTENER_FRESH_S = 5.0  # a listener not seen for this long is gone (killed): nobody to write for
SEEN_EVERY_S = 1.0
KEEP_S = 60.0  # rows older than this are pruned: a hint that old helps nobody
PRUNE_EVERY_S = 30.0
BATCH = 500


def _connect(path: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, timeout=5, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    return conn


class SQLiteBusLayer(InMemoryChannelLayer):
    """channels' in-memory layer plus a cross-process bus. Thread-safe: a ``group_send`` from any
    thread (core.live's sender has its own loop) reaches local sockets on their own loop."""

    thread_safe = True  # core.live.deliver: call it from the sender's loop, not the sockets'

    def __init__(
        self,
        path: str | None = None,
        poll_s: float = 0.05,
        round_trip_groups: tuple[str, ...] | list[str] = (),
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if path is None:
            from django.conf import settings

            path = str(
                getattr(settings, "LIVE_BUS_PATH", Path(settings.VAR_DIR) / "live-bus.sqlite3")
            )
        self.path, self.poll_s = path, poll_s
        self.round_trip = frozenset(round_trip_groups)
        self._reset()
        os.register_at_fork(after_in_child=self._reset)
        with _connect(self.path) as conn:
            conn.executescript(SCHEMA)

    def _reset(self) -> None:
        self.origin = uuid.uuid4().hex
        self._home: asyncio.AbstractEventLoop | None = None
        self._poller: threading.Thread | None = None
        self._local = threading.local()
        self._others_at, self._others = 0.0, False

    # --- this process --------------------------------------------------------------------------
    async def group_add(self, group: str, channel: str) -> None:
        self._bind()
        await super().group_add(group, channel)

    def _bind(self) -> None:
        """The sockets' loop becomes home, and this process starts listening to the bus."""
        if self._home is None or self._home.is_closed():
            self._home = asyncio.get_running_loop()
        if self._poller is None or not self._poller.is_alive():
            # Where to start reading, taken now: a row written right after this group_add (before
            # the thread runs) is read, not skipped.
            last = self._conn().execute("SELECT COALESCE(MAX(id), 0) FROM messages").fetchone()[0]
            self._poller = threading.Thread(
                target=self._poll, args=(last,), name="live-bus", daemon=True
            )
            self._poller.start()

    async def _deliver_here(self, group: str, message: dict[str, Any]) -> None:
        home = self._home
        if home is None or home.is_closed():
            return  # no sockets in this process
        send = InMemoryChannelLayer.group_send(self, group, message)
        if asyncio.get_running_loop() is home:
            await send
        else:
            await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(send, home))

    async def group_send(self, group: str, message: dict[str, Any]) -> None:
        assert isinstance(message, dict), "message is not a dict"
        self.require_valid_group_name(group)
        crossing = group in self.round_trip
        if crossing or self._others_listening():
            await self._publish(group, message)
        if not crossing:
            await self._deliver_here(group, message)

    # --- the bus file --------------------------------------------------------------------------
    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = _connect(self.path)
        return conn

    def _write(self, group: str, body: str) -> None:
        self._conn().execute(
            "INSERT INTO messages (at, origin, grp, body) VALUES (?, ?, ?, ?)",
            (time.time(), self.origin, group, body),
        )

    async def _publish(self, group: str, message: dict[str, Any]) -> None:
        body = json.dumps(message, default=str)
        if self._home is not None and asyncio.get_running_loop() is self._home:
            await asyncio.to_thread(self._write, group, body)  # never block the sockets' loop
        else:
            self._write(group, body)

    def _others_listening(self) -> bool:
        """Is another process reading the bus? Asked at most once a second."""
        now = time.monotonic()
        if now - self._others_at >= SEEN_EVERY_S:
            self._others_at = now
            try:
                row = (
                    self._conn()
                    .execute(
                        "SELECT 1 FROM listeners WHERE origin != ? AND seen > ? LIMIT 1",
                        (self.origin, time.time() - LISTENER_FRESH_S),
                    )
                    .fetchone()
                )
                self._others = row is not None
            except sqlite3.Error:
                logger.warning("live bus %s unreadable", self.path, exc_info=True)
                self._others = False
        return self._others

    def _poll(self, last: int) -> None:
        """This process's one reader: other processes' rows (and round trips) to local sockets."""
        conn = _connect(self.path)
        seen_at = pruned_at = 0.0
        while True:
            try:
                now = time.time()
                if now - seen_at >= SEEN_EVERY_S:
                    seen_at = now
                    conn.execute(
                        "INSERT OR REPLACE INTO listeners (origin, pid, seen) VALUES (?, ?, ?)",
                        (self.origin, os.getpid(), now),
                    )
                if now - pruned_at >= PRUNE_EVERY_S:
                    pruned_at = now
                    conn.execute("DELETE FROM messages WHERE at < ?", (now - KEEP_S,))
                    conn.execute("DELETE FROM listeners WHERE seen < ?", (now - KEEP_S,))
                rows = conn.execute(
                    "SELECT id, origin, grp, body FROM messages WHERE id > ? ORDER BY id LIMIT ?",
                    (last, BATCH),
                ).fetchall()
            except sqlite3.Error:
                logger.warning("live bus %s: read failed", self.path, exc_info=True)
                time.sleep(1.0)
                continue
            mine = [
                (grp, json.loads(body))
                for _, origin, grp, body in rows
                if origin != self.origin or grp in self.round_trip
            ]
            if rows:
                last = rows[-1][0]
            home = self._home
            if mine and home is not None and not home.is_closed():
                asyncio.run_coroutine_threadsafe(self._hand_over(mine), home)
            if len(rows) < BATCH:
                time.sleep(self.poll_s)

    async def _hand_over(self, messages: list[tuple[str, dict[str, Any]]]) -> None:
        for group, message in messages:
            try:
                await InMemoryChannelLayer.group_send(self, group, message)
            except Exception:  # one malformed row must not stop the rest
                logger.debug("live bus message for %s dropped", group, exc_info=True)

    async def flush(self) -> None:
        await super().flush()
        await asyncio.to_thread(self._conn().execute, "DELETE FROM messages")
