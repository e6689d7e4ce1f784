"""Whether PostgreSQL refused this process a moment ago: the memory behind the fast refusal.

While the database is unreachable, a request whose checkout has to wait for the pool (no idle
connection) would wait the pool's whole checkout timeout, and Django asks twice: ~20 s before the
caller learns anything (docs/operations/faults.md, the database link cut). The backend
(``core/pg/backend/base.py``) refuses such a checkout at once instead, but only while a refusal is
fresh: every failed connection attempt (the pool's own reconnections, the readiness probe's
connection, HAProxy asks every 0.5-1 s) renews it, every successful one forgets it, and on its own
it is forgotten after ``DB_DOWN_MEMORY_S`` seconds (5 by default).

Whoever must act on a refusal the moment it happens (the backend's pools fail the checkouts
already waiting in their queues, the ASGI handler's sync-view gate the requests waiting for a slot:
controlplane/gate.py) registers with ``on_refusal``: each ``note_refused`` calls them.

The bound matters: a memory kept "until the next new connection" left a healthy process refusing
every checkout that had to wait, because a pool with idle connections opens none
(``tests/controlplane/test_pg_refusal_memory.py``).
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from typing import Protocol

DB_DOWN_MEMORY_S = float(os.environ.get("DB_DOWN_MEMORY_S", "5"))

_lock = threading.Lock()
_refused_at: float | None = None
_why = ""


class Listener(Protocol):
    def refused(self, why: str) -> None: ...


_listeners: weakref.WeakSet[Listener] = weakref.WeakSet()


def note_refused(why: object) -> None:
    """A connection attempt to PostgreSQL failed just now (renews the memory)."""
    global _refused_at, _why
    with _lock:
        _refused_at, _why = (
            time.monotonic(),
            str(why).strip().splitlines()[0][:200] if str(why).strip() else repr(why),
        )
        listeners, text = list(_listeners), _why
    for listener in listeners:
        listener.refused(refused_recently() or text)


def on_refusal(listener: Listener) -> None:
    """Call ``listener.refused(why)`` after each ``note_refused`` (held weakly: a pool closed and
    dropped stops listening with no unregistering)."""
    with _lock:
        _listeners.add(listener)


def note_reached() -> None:
    """A connection attempt succeeded: the database answers, forget any refusal."""
    global _refused_at
    with _lock:
        _refused_at = None


def refused_recently(memory_s: float | None = None) -> str | None:
    """The last refusal's text if one happened within ``memory_s`` (``DB_DOWN_MEMORY_S``), else None."""
    at = _refused_at
    if at is None:
        return None
    age = time.monotonic() - at
    if age > (DB_DOWN_MEMORY_S if memory_s is None else memory_s):
        return None
    return f"{_why} ({age:.1f} s ago)"


def is_unreachable(exc: BaseException) -> bool:
    """Whether a database error says PostgreSQL did not answer (a connection refused, lost or shut
    down: SQLSTATE class 08 or 57P, or no SQLSTATE at all), not that a query of ours failed."""
    sqlstate = getattr(exc.__cause__, "sqlstate", None) or getattr(exc, "sqlstate", None)
    return not sqlstate or sqlstate.startswith(("08", "57P"))


def nothing_applied(connection: object) -> bool:
    """Whether the request on this thread's ``connection`` certainly changed nothing in the database:
    no COMMIT was sent and no statement that could write ran outside a transaction since the request
    started. Only the PostgreSQL backend keeps that record; without it the answer is "unknown"."""
    return getattr(connection, "maybe_applied", True) is False
