"""core/pg/backend: the fast refusal's memory on a real psycopg pool against the real PostgreSQL.

A checkout that has to wait for a busy pool is refused at once while a connection attempt failed a
moment ago (the database link cut: ~1 s instead of the pool's 10 s checkout timeout, twice), and
only then: a refusal older than ``DB_DOWN_MEMORY_S`` is forgotten even when no new connection is
made. Session 28's first version remembered a refusal until the next *new* connection; a pool with
idle connections makes none, so one failed attempt left a healthy process refusing every checkout
that had to wait (a cascade of ``PoolTimeout`` across the suite). The first test fails on that
version (``DB_DOWN_MEMORY_S=1e9`` reproduces it)."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest
from django.db import connection

from core.pg import reach
from core.pg.backend import base as backend
from core.pg.backend.base import _checked_when_bytes_wait, _pool_class
from tests.deploy.hosts import Forwarder

pytestmark = [pytest.mark.django_db]


@pytest.fixture
def memory(monkeypatch):
    monkeypatch.setattr(reach, "DB_DOWN_MEMORY_S", 0.5)
    reach.note_reached()
    yield
    reach.note_reached()


def _pool(port: int | None = None, size: int = 1, timeout: float = 3.0):
    params = {**connection.get_connection_params(), "autocommit": True, "connect_timeout": 2}
    params.pop("cursor_factory", None)
    params.pop("context", None)
    params.pop("pool", None)
    if port is not None:
        params.update(host="127.0.0.1", port=port)
    pool = _pool_class()(
        kwargs=params,
        min_size=size,
        max_size=size,
        timeout=timeout,
        reconnect_timeout=2,
        check=_checked_when_bytes_wait,
        open=False,
    )
    pool.open(wait=True, timeout=10)
    return pool


def _hold(pool, seconds: float) -> threading.Thread:
    held = threading.Event()

    def hold() -> None:
        with pool.connection() as conn:
            held.set()
            time.sleep(seconds)
            conn.execute("SELECT 1")

    thread = threading.Thread(target=hold)
    thread.start()
    assert held.wait(5)
    return thread


def test_an_old_refusal_is_forgotten_so_a_healthy_busy_pool_makes_a_checkout_wait(
    postgres_only, memory
):
    pool = _pool()
    try:
        reach.note_refused("connection refused (one failed attempt)")
        time.sleep(0.7)  # older than DB_DOWN_MEMORY_S; the pool made no new connection since
        holder = _hold(pool, 0.8)
        started = time.monotonic()
        with pool.connection() as conn:  # must wait for the holder, not be refused
            assert conn.execute("SELECT 1").fetchone() == (1,)
        waited = time.monotonic() - started
        holder.join(5)
        assert 0.3 < waited < 3, waited
    finally:
        pool.close()


def test_a_fresh_refusal_refuses_a_waiting_checkout_at_once_but_hands_out_an_idle_one(
    postgres_only, memory
):
    pool = _pool()
    try:
        holder = _hold(pool, 1.2)
        reach.note_refused("connection refused")
        time.sleep(0.3)
        reach.note_refused("connection refused again")  # a probe renews it (0.3 + 0.5 > 0.5)
        time.sleep(0.3)
        started = time.monotonic()
        with pytest.raises(psycopg.OperationalError, match="unreachable.*refused again"):
            pool.getconn()
        assert time.monotonic() - started < 0.5
        holder.join(5)
        reach.note_refused("connection refused")
        with pool.connection() as conn:  # idle connection: handed out despite the memory
            assert conn.execute("SELECT 1").fetchone() == (1,)
    finally:
        pool.close()


def test_a_cut_link_refuses_within_a_second_or_two_and_heals(postgres_only, memory, monkeypatch):
    monkeypatch.setattr(reach, "DB_DOWN_MEMORY_S", 5.0)
    db = connection.settings_dict
    link = Forwarder((db.get("HOST") or "127.0.0.1", int(db.get("PORT") or 5432)))
    pool = _pool(link.port, size=1, timeout=10)
    try:
        link.cut()  # the idle connection's socket now reads EOF: the check discards it
        started = time.monotonic()
        with pytest.raises(psycopg.OperationalError, match="unreachable"):
            with pool.connection() as conn:
                conn.execute("SELECT 1")
        refused_in = time.monotonic() - started
        assert refused_in < 4, refused_in  # the pool's checkout timeout is 10 s
        link.heal()
        deadline = time.monotonic() + 15
        while True:
            try:
                with pool.connection(timeout=2) as conn:
                    assert conn.execute("SELECT 1").fetchone() == (1,)
                break
            except psycopg.OperationalError:
                assert time.monotonic() < deadline, "the pool did not come back after healing"
                time.sleep(0.2)
    finally:
        pool.close()
        link.cut()


def test_while_refused_an_idle_connection_that_gets_no_answer_is_not_handed_out(
    postgres_only, memory, monkeypatch
):
    """A black-holed link: the idle connection has nothing to read and looks healthy. While a
    refusal is fresh (a probe timed out), the checkout asks it a bounded round trip first, instead
    of handing it out to hang."""
    monkeypatch.setattr(reach, "DB_DOWN_MEMORY_S", 5.0)
    db = connection.settings_dict
    link = Forwarder((db.get("HOST") or "127.0.0.1", int(db.get("PORT") or 5432)))
    pool = _pool(link.port, size=1, timeout=10)
    try:
        with pool.connection() as conn:  # healthy: handed out with no round trip
            assert conn.execute("SELECT 1").fetchone() == (1,)
        link.frozen = True  # bytes vanish both ways
        reach.note_refused("connection timeout expired")  # what the readiness probe notes
        started = time.monotonic()
        with pytest.raises(psycopg.OperationalError, match="unreachable"):
            pool.getconn()
        took = time.monotonic() - started
        assert took < 4, took
        # the bounded round trip said so (not some other failure), so the other idle connections
        # of this link are dropped unasked for a moment
        assert time.monotonic() - backend._silent[0] < 5
        link.frozen = False
        reach.note_reached()
        deadline = time.monotonic() + 20
        while True:
            try:
                with pool.connection(timeout=3) as conn:
                    assert conn.execute("SELECT 1").fetchone() == (1,)
                break
            except psycopg.OperationalError:
                assert time.monotonic() < deadline, "the pool did not come back"
                time.sleep(0.2)
    finally:
        pool.close()
        link.cut()
