"""The pool guard (tests/pool_guard.py) gives back what an ended thread held, so one test's leak
cannot starve the tests after it."""

import threading

import pytest
from django.db import connection, connections

from tests import pool_guard


@pytest.mark.django_db(transaction=True)
def test_a_connection_an_ended_thread_held_goes_back_to_the_pool():
    if connection.pool is None:
        pytest.skip("no connection pool: the suite runs on PostgreSQL with one (make test)")

    def leak():
        with connections["default"].cursor() as cursor:  # checks a connection out, never closes it
            cursor.execute("SELECT 1")

    thread = threading.Thread(target=leak)
    thread.start()
    thread.join()
    left = connection.pool.get_stats().get("pool_available", 0)
    assert pool_guard.reclaim() == 1
    assert connection.pool.get_stats().get("pool_available", 0) == left + 1
    assert pool_guard.reclaim() == 0
