"""A pytest plugin (``-p tests.pool_guard``, on in pyproject's addopts): the suite's process shares one
psycopg pool (20 connections) across every test. A thread that ends holding a pool connection (a
race test's thread, an event loop's executor thread, a live server's request thread) never gives it
back, and after twenty such leaks every later test waits 10 s for a connection and fails with
"couldn't get a connection" (CI, stop 27: 31 failed, 170 errors, all after the leaks).

After each test this plugin finds the connections checked out by threads that no longer run, puts
them back in the pool (a dead thread can no longer use them) and reports the test that leaked, so a
leak names its culprit instead of failing tests that come later."""

from __future__ import annotations

import threading
import weakref
from typing import Any

import pytest

_held: dict[int, tuple[Any, threading.Thread, weakref.ref]] = {}
_lock = threading.Lock()
leaks: list[tuple[str, int]] = []


def _wrap(pool_class: type) -> None:
    if getattr(pool_class, "_guarded", False):
        return
    getconn, putconn = pool_class.getconn, pool_class.putconn

    def guarded_getconn(self, timeout=None):
        conn = getconn(self, timeout)
        with _lock:
            _held[id(conn)] = (conn, threading.current_thread(), weakref.ref(self))
        return conn

    def guarded_putconn(self, conn):
        with _lock:
            _held.pop(id(conn), None)
        return putconn(self, conn)

    pool_class.getconn, pool_class.putconn = guarded_getconn, guarded_putconn
    pool_class._guarded = True


def reclaim() -> int:
    """Put back every connection held by a thread that has ended; how many there were."""
    with _lock:
        dead = [(key, entry) for key, entry in _held.items() if not entry[1].is_alive()]
        for key, _ in dead:
            del _held[key]
    for _, (conn, _thread, pool_ref) in dead:
        pool = pool_ref()
        if pool is None:
            continue
        try:
            pool.putconn(conn)
        except Exception:  # a closed pool or a broken connection: nothing to give back
            pass
    return len(dead)


def pytest_configure(config):
    try:
        from core.pg.backend.base import _pool_class
    except Exception:  # no PostgreSQL backend importable: nothing to guard
        return
    _wrap(_pool_class())


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    yield
    count = reclaim()
    if count:
        leaks.append((item.nodeid, count))


def pytest_sessionfinish(session):
    # an xdist worker: its leaks travel to the controller, which prints the summary
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput["pool_guard_leaks"] = leaks


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    leaks.extend(
        tuple(leak) for leak in getattr(node, "workeroutput", {}).get("pool_guard_leaks", ())
    )


def pytest_terminal_summary(terminalreporter):
    if leaks:
        terminalreporter.section("database connections left by ended threads (given back)")
        for nodeid, count in leaks:
            terminalreporter.write_line(f"{count} connection(s): {nodeid}")
