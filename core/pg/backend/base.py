"""Django's PostgreSQL backend (psycopg 3 and its pool), changed in three places so an API host
that lost its database says so within a second or two, and so the caller can tell "did nothing"
from "unknown" (docs/operations/faults.md, fault (d): the database link cut).

1. **Fast refusal.** While a connection attempt failed less than ``DB_DOWN_MEMORY_S`` ago
   (``core/pg/reach.py``), a checkout that would have to wait for the pool is refused at once with
   an ``OperationalError`` instead of waiting the pool's checkout timeout (10 s, and Django asked
   twice: ~20 s). An idle connection is still handed out if there is one. The memory is renewed by
   each failed attempt (the pool's reconnections, the readiness probe) and dropped by a successful
   one or after ``DB_DOWN_MEMORY_S``: a healthy process never keeps refusing. Each failed attempt
   also refuses the checkouts already waiting in the pool's queue, at that moment; otherwise a
   checkout waits once, in the pool's first-come first-served queue (a version that waited in
   0.25 s slices rejoined the back of the queue each time, so later checkouts could starve an
   earlier one past its timeout: ``tests/controlplane/test_pg_pool_fairness.py``).
2. **Idle connections checked only when bytes wait.** A connection idle in the pool is handed out
   unchecked unless its socket is readable: a healthy idle connection has nothing to read, while a
   server's termination notice, a reset or an EOF makes it readable. Then (only then) an empty query
   checks it, and a dead one is discarded instead of failing the request's first statement. No
   round trip for the healthy case. While a refusal is fresh (1.), every idle connection is checked
   by an empty query answered within ``SUSPECT_CHECK_S`` (2 s): on a black-holed link nothing tells
   an idle connection it is dead.
3. **What was sent.** ``maybe_applied`` records whether, since the request started, a COMMIT was
   sent or a statement that could write ran outside a transaction. The API's handler for an
   unreachable database (api/app.py) answers 503 + ``X-Controlplane-Draining: 1`` (the SDK resends,
   on another replica) when nothing was, and 500 "outcome unknown" otherwise.

The connection parameters (``connect_timeout`` 3 s, TCP keepalives, ``tcp_user_timeout`` 10 s) and
the pool's ``reconnect_timeout`` (5 s) are in controlplane/settings.py.
"""

from __future__ import annotations

import select
import time
from functools import lru_cache
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.signals import request_started
from django.db.backends.base.base import NO_DB_ALIAS
from django.db.backends.postgresql import base as postgresql
from django.db.backends.utils import CursorDebugWrapper, CursorWrapper

from core.pg import reach

SUSPECT_CHECK_S = 2.0  # an idle connection's round trip while the database refused a moment ago
_silent = [float("-inf")]  # when an idle connection last got no answer within SUSPECT_CHECK_S
_READ_ONLY = ("SELECT", "SHOW", "SET", "RESET", "EXPLAIN", "BEGIN", "DEALLOCATE")


def _checked_when_bytes_wait(conn: Any) -> None:
    """The pool's ``check``: a round trip only for an idle connection whose socket is readable, or,
    while the database refused a moment ago, a round trip bounded by ``SUSPECT_CHECK_S``: on a
    black-holed link an idle connection has nothing to read and looks healthy, and a request on it
    would wait for TCP to give up (``tcp_user_timeout``) instead of being refused."""
    if conn.closed or conn.broken:
        raise conn.OperationalError("the connection is closed")
    try:
        readable, _, _ = select.select([conn.fileno()], [], [], 0)
    except (OSError, ValueError) as err:
        raise conn.OperationalError(f"the connection's socket is gone: {err}") from err
    if readable:
        from psycopg_pool import ConnectionPool

        ConnectionPool.check_connection(conn)
    elif reach.refused_recently():
        if time.monotonic() - _silent[0] < SUSPECT_CHECK_S * 2:
            # another idle connection got no answer a moment ago: this one shares its link
            conn.close()
            raise conn.OperationalError("an idle connection to the database got no answer just now")
        try:
            _answers_within(conn, SUSPECT_CHECK_S)
        except conn.OperationalError:
            # not a renewal of the refusal memory: on a machine so loaded that a healthy round
            # trip takes longer, only real connection failures and probes keep it alive
            _silent[0] = time.monotonic()
            raise


def _answers_within(conn: Any, timeout: float) -> None:
    """An empty query, its answer awaited at most ``timeout`` s; the connection is closed (so the
    pool replaces it) when none comes."""
    import psycopg
    from psycopg import pq

    pgconn, fd = conn.pgconn, conn.fileno()
    deadline = time.monotonic() + timeout
    try:
        pgconn.send_query(b"")
        while pgconn.flush() != 0:
            if not select.select([], [fd], [], max(deadline - time.monotonic(), 0))[1]:
                raise TimeoutError
        while True:
            if not select.select([fd], [], [], max(deadline - time.monotonic(), 0))[0]:
                raise TimeoutError
            pgconn.consume_input()
            if not pgconn.is_busy():
                break
        failed = [
            result.status.name
            for result in iter(pgconn.get_result, None)
            if result.status not in (pq.ExecStatus.EMPTY_QUERY, pq.ExecStatus.COMMAND_OK)
        ]
    except (TimeoutError, OSError, psycopg.Error) as err:
        conn.close()
        raise conn.OperationalError(
            f"no answer from the database within {timeout:g} s on an idle connection"
        ) from err
    if failed:
        conn.close()
        raise conn.OperationalError(f"the check query on an idle connection failed: {failed}")


@lru_cache(maxsize=1)
def _pool_class() -> type:
    from psycopg import OperationalError
    from psycopg_pool import ConnectionPool

    def unreachable(why: str) -> OperationalError:
        return OperationalError(f"the database is unreachable: a connection was refused: {why}")

    class GiveUp(BaseException):
        """An idle connection failed its check while the database refused a moment ago. The pool
        treats a BaseException like a cancellation (the connection is put back, no further try)
        instead of sleeping its ~1 s backoff before a next try the fresh refusal would refuse."""

    class RefusingPool(ConnectionPool):
        """A pool whose checkouts give up at once while the database refused a moment ago, and
        otherwise wait once, in the pool's own FIFO queue: each failed connection attempt (of this
        pool or the readiness probe, ``reach.note_refused``) fails the checkouts waiting then."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            reach.on_refusal(self)

        def getconn(self, timeout: float | None = None) -> Any:
            try:
                return super().getconn(timeout)
            except GiveUp as gave_up:
                raise unreachable(str(gave_up)) from gave_up.__cause__

        def _get_ready_connection(self, timeout: float | None) -> Any:
            # under the pool's lock, the moment a checkout either takes an idle connection or
            # joins the queue: joining it while a refusal is fresh would wait for nothing
            conn = super()._get_ready_connection(timeout)
            if conn is None and (refused := reach.refused_recently()):
                self._maybe_grow_pool()  # an attempt, if there is room, tells when it is back
                self._stats[self._REQUESTS_ERRORS] += 1
                raise unreachable(refused)
            return conn

        def _check_connection(self, conn: Any) -> None:
            try:
                super()._check_connection(conn)
            except Exception as err:
                if refused := reach.refused_recently():
                    raise GiveUp(refused) from err
                raise

        def refused(self, why: str) -> None:
            """A connection attempt failed just now: every checkout waiting in the queue at this
            moment is refused (as the pool's ``close`` fails them: taken under its lock, told
            outside it); the queue keeps its order for those who come after."""
            with self._lock:
                waiting = list(self._waiting)
                self._waiting.clear()
            for pos in waiting:
                pos.fail(unreachable(why))

        def _connect(self, timeout: float | None = None) -> Any:
            try:
                conn = super()._connect(timeout)
            except Exception as err:
                reach.note_refused(err)
                raise
            reach.note_reached()
            return conn

    return RefusingPool


def _reset_on_request(**_: Any) -> None:
    from django.db import connections

    for conn in connections.all(initialized_only=True):
        if isinstance(conn, DatabaseWrapper):
            conn.maybe_applied = False


request_started.connect(_reset_on_request, dispatch_uid="core.pg.backend.reset")


class _Marking:
    db: DatabaseWrapper

    def _execute_with_wrappers(self, sql, params, many, executor):
        db = self.db
        if not db.maybe_applied and db.autocommit and not _read_only(sql):
            db.maybe_applied = True
        return super()._execute_with_wrappers(sql, params, many, executor)


class MarkingCursor(_Marking, CursorWrapper):
    pass


class MarkingDebugCursor(_Marking, CursorDebugWrapper):
    pass


def _read_only(sql: object) -> bool:
    text = sql.decode() if isinstance(sql, bytes) else str(sql)
    return text.lstrip(" \n\t(").upper().startswith(_READ_ONLY)


class DatabaseWrapper(postgresql.DatabaseWrapper):
    maybe_applied = False

    @property
    def pool(self):
        """Django's pool property (django/db/backends/postgresql/base.py), building a
        :class:`RefusingPool` whose ``check`` looks at an idle connection only when bytes wait."""
        pool_options = self.settings_dict["OPTIONS"].get("pool")
        if self.alias == NO_DB_ALIAS or not pool_options:
            return None
        if self.alias not in self._connection_pools:
            if self.settings_dict.get("CONN_MAX_AGE", 0) != 0:
                raise ImproperlyConfigured("Pooling doesn't support persistent connections.")
            options = {**pool_options} if isinstance(pool_options, dict) else {}
            options.setdefault("check", _checked_when_bytes_wait)
            connect_kwargs = self.get_connection_params()
            connect_kwargs["autocommit"] = True  # as Django: it sets the mode itself later on
            pool = _pool_class()(
                kwargs=connect_kwargs, open=False, configure=self._configure_connection, **options
            )
            self._connection_pools.setdefault(self.alias, pool)
        return self._connection_pools[self.alias]

    def _commit(self):
        self.maybe_applied = True  # before it is sent: a cut during COMMIT leaves it unknown
        return super()._commit()

    def make_cursor(self, cursor):
        return MarkingCursor(cursor, self)

    def make_debug_cursor(self, cursor):
        return MarkingDebugCursor(cursor, self)
