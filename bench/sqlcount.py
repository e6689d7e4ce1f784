"""Counts the SQL statements a benchmark server sends to PostgreSQL, whoever sends them.

Installed by ``bench/settings.py`` (the benchmark's servers only, never the product): every
``execute``/``executemany`` of a psycopg 3 cursor, sync or async, ORM or raw, adds to one per-process
counter that ``GET /bench/stats/`` (bench/urls.py) reads. Counting at psycopg's cursor rather than
through Django's ``execute_wrapper`` keeps the count honest if the hot path talks to psycopg directly.
A PL/pgSQL function called once counts once: the statements it runs inside PostgreSQL are the
database's CPU, which the benchmark measures separately. psycopg's implicit ``BEGIN`` and
``COMMIT``/``ROLLBACK`` are not cursor calls and are not counted here; the benchmark reports
transactions from ``pg_stat_database`` instead."""

from __future__ import annotations

import os
import threading
from typing import Any

_lock = threading.Lock()
_count = [0]
_installed = [False]


def _add(n: int) -> None:
    with _lock:
        _count[0] += n


def _batch_size(params_seq: Any) -> int:
    try:
        return len(params_seq)
    except TypeError:  # a generator: count the call once
        return 1


def install() -> None:
    """Wrap psycopg's cursor classes once per process."""
    if _installed[0]:
        return
    import psycopg

    def wrap(cls: Any) -> None:
        execute, executemany = cls.execute, cls.executemany

        def counted_execute(self, *args, **kwargs):
            _add(1)
            return execute(self, *args, **kwargs)

        def counted_executemany(self, query, params_seq, *args, **kwargs):
            params_seq = list(params_seq) if not hasattr(params_seq, "__len__") else params_seq
            _add(_batch_size(params_seq))
            return executemany(self, query, params_seq, *args, **kwargs)

        cls.execute, cls.executemany = counted_execute, counted_executemany

    def async_wrap(cls: Any) -> None:
        execute, executemany = cls.execute, cls.executemany

        async def counted_execute(self, *args, **kwargs):
            _add(1)
            return await execute(self, *args, **kwargs)

        async def counted_executemany(self, query, params_seq, *args, **kwargs):
            params_seq = list(params_seq) if not hasattr(params_seq, "__len__") else params_seq
            _add(_batch_size(params_seq))
            return await executemany(self, query, params_seq, *args, **kwargs)

        cls.execute, cls.executemany = counted_execute, counted_executemany

    # Subclasses (ClientCursor, ServerCursor, Django's own cursors) inherit these methods unless they
    # override them; the ones that do call up to these.
    wrap(psycopg.Cursor)
    async_wrap(psycopg.AsyncCursor)
    _installed[0] = True


def snapshot() -> dict[str, int]:
    with _lock:
        return {"pid": os.getpid(), "statements": _count[0]}
