"""core/pg/backend: the refusing pool keeps psycopg_pool's first-come first-served queue, with real
threads on the real PostgreSQL.

Session 29's pool waited in 0.25 s slices, looking at the refusal memory between them; each slice
left the pool's queue and joined it again at its back, so under contention a checkout could be
overtaken by later ones again and again (past its 10 s timeout, on a busy host). The first test
fails on that version: the checkouts were served out of their arrival order. Now a checkout waits
once, and a failed connection attempt refuses the waiting ones (the last two tests)."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest
from django.db import connection

from core.pg import reach
from core.pg.backend.base import _checked_when_bytes_wait, _pool_class
from tests.deploy.hosts import Forwarder

pytestmark = [pytest.mark.django_db]

HOLD_S = 0.3


@pytest.fixture
def memory(monkeypatch):
    monkeypatch.setattr(reach, "DB_DOWN_MEMORY_S", 0.5)
    reach.note_reached()
    yield
    reach.note_reached()


def _pool(size: int, timeout: float = 10.0, port: int | None = None, min_size: int | None = None):
    params = {**connection.get_connection_params(), "autocommit": True, "connect_timeout": 2}
    for key in ("cursor_factory", "context", "pool"):
        params.pop(key, None)
    if port is not None:
        params.update(host="127.0.0.1", port=port)
    pool = _pool_class()(
        kwargs=params,
        min_size=size if min_size is None else min_size,
        max_size=size,
        timeout=timeout,
        reconnect_timeout=2,
        check=_checked_when_bytes_wait,
        open=False,
    )
    pool.open(wait=True, timeout=10)
    return pool


def _waiting(pool) -> int:
    return pool.get_stats().get("requests_waiting", 0)


def _queued(pool, count: int) -> None:
    deadline = time.monotonic() + 5
    while _waiting(pool) < count:
        assert time.monotonic() < deadline, f"{_waiting(pool)} checkouts waiting, not {count}"
        time.sleep(0.002)


def test_contended_checkouts_are_served_in_their_arrival_order(postgres_only, memory):
    """A pool of 2, both connections held; 8 threads join the queue one after another, 30 ms apart
    (each once the previous one is in it: arrivals spread over the old version's 0.25 s slice, so
    its queue was always some rotation of the arrival order), then the two holders let go 0.15 s
    apart and every checkout holds its connection 0.3 s: grants come ~0.15 s apart, each one to
    the longest waiting."""
    pool = _pool(size=2)
    served: list[int] = []
    waited: dict[int, float] = {}
    failed: list[BaseException] = []
    lock = threading.Lock()
    release = [threading.Event(), threading.Event()]

    def holder(i: int, taken: threading.Event) -> None:
        with pool.connection():
            taken.set()
            release[i].wait(10)

    def checkout(i: int) -> None:
        started = time.monotonic()
        try:
            with pool.connection() as conn:
                with lock:
                    served.append(i)
                    waited[i] = time.monotonic() - started
                conn.execute("SELECT 1")
                time.sleep(HOLD_S)
        except BaseException as err:  # reported by the main thread
            failed.append(err)

    try:
        holders = []
        for i in range(2):
            taken = threading.Event()
            holders.append(threading.Thread(target=holder, args=(i, taken)))
            holders[-1].start()
            assert taken.wait(5)
        threads = []
        for i in range(8):
            threads.append(threading.Thread(target=checkout, args=(i,)))
            threads[-1].start()
            _queued(pool, i + 1)
            time.sleep(0.03)
        release[0].set()
        time.sleep(HOLD_S / 2)
        release[1].set()
        for thread in holders + threads:
            thread.join(15)
        assert not failed, failed
        waits = {i: round(took, 2) for i, took in sorted(waited.items())}
        assert served == list(range(8)), f"served in the order {served}, waits {waits}"
        # the i-th in the queue gets the (i // 2 + 1)-th round of releases: its wait is bounded
        for i, took in waited.items():
            assert took < (i // 2 + 1) * HOLD_S + 1.0, (i, took, waited)
    finally:
        for event in release:
            event.set()
        pool.close()


def test_a_refusal_noted_elsewhere_refuses_the_checkouts_already_waiting(postgres_only, memory):
    """The readiness probe's failed connection (``reach.note_refused``) reaches the checkouts waiting
    in the queue at once, in the pool's own terms; a later one, once the memory is old, waits."""
    pool = _pool(size=1)
    release = threading.Event()
    taken = threading.Event()
    outcomes: list[tuple[str, float]] = []

    def holder() -> None:
        with pool.connection():
            taken.set()
            release.wait(10)

    def checkout() -> None:
        started = time.monotonic()
        try:
            with pool.connection():
                outcomes.append(("served", time.monotonic() - started))
        except psycopg.OperationalError as err:
            outcomes.append((str(err), time.monotonic() - started))

    hold = threading.Thread(target=holder)
    hold.start()
    try:
        assert taken.wait(5)
        waiters = [threading.Thread(target=checkout) for _ in range(3)]
        for i, thread in enumerate(waiters):
            thread.start()
            _queued(pool, i + 1)
        time.sleep(0.3)
        reach.note_refused("connection timeout expired")
        for thread in waiters:
            thread.join(5)
        assert len(outcomes) == 3, outcomes
        for text, took in outcomes:
            assert "unreachable" in text and "timeout expired" in text, outcomes
            assert took < 2, outcomes  # the pool's checkout timeout is 10 s
        assert _waiting(pool) == 0
        time.sleep(0.6)  # older than DB_DOWN_MEMORY_S: a checkout waits for the holder again
        late = threading.Thread(target=checkout)
        late.start()
        _queued(pool, 1)
        release.set()
        late.join(5)
        assert outcomes[-1][0] == "served", outcomes
    finally:
        release.set()
        hold.join(5)
        pool.close()


def test_the_pools_own_failed_connection_attempt_refuses_the_waiting_checkout(
    postgres_only, memory
):
    """The pool grows for a waiting checkout; that connection attempt is refused (the link is cut),
    and the checkout is refused with it instead of waiting the pool's 10 s."""
    db = connection.settings_dict
    link = Forwarder((db.get("HOST") or "127.0.0.1", int(db.get("PORT") or 5432)))
    pool = _pool(size=2, min_size=1, port=link.port)
    release = threading.Event()
    taken = threading.Event()

    def holder() -> None:
        with pool.connection():
            taken.set()
            release.wait(10)

    hold = threading.Thread(target=holder)
    hold.start()
    try:
        assert taken.wait(5)
        link.cut()
        started = time.monotonic()
        with pytest.raises(psycopg.OperationalError, match="unreachable"):
            pool.getconn()
        took = time.monotonic() - started
        assert took < 3, took
    finally:
        release.set()
        hold.join(5)
        pool.close()
        link.cut()
