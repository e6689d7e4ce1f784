"""Statements and commits per request, counted inside the benchmark's servers (``bench.settings``).

pg_stat_statements needs a server restart to load, so the servers count for themselves: a middleware
wraps each request in ``connection.execute_wrapper`` (every statement Django sends, each its own round
trip) and the connection's ``_commit`` is counted too (COMMIT is a round trip the wrapper does not
see). ``GET /bench/stats/`` returns this process's totals; the benchmark reads every server before and
after a phase and divides the difference by the phase's effects. Never installed in the product."""

from __future__ import annotations

import threading

from django.db import connection
from django.db.backends.base.base import BaseDatabaseWrapper
from django.http import JsonResponse

_lock = threading.Lock()
TOTALS = {"requests": 0, "statements": 0, "commits": 0}
_local = threading.local()

_original_commit = BaseDatabaseWrapper._commit  # type: ignore[attr-defined]


def _counted_commit(self):
    if getattr(_local, "counting", False):
        _local.commits += 1
    return _original_commit(self)


BaseDatabaseWrapper._commit = _counted_commit  # type: ignore[attr-defined]


class CountStatements:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if request.path.startswith("/bench/"):
            return self.get_response(request)
        count = [0]

        def wrapper(execute, sql, params, many, context):
            count[0] += 1
            return execute(sql, params, many, context)

        _local.counting, _local.commits = True, 0
        try:
            with connection.execute_wrapper(wrapper):
                return self.get_response(request)
        finally:
            _local.counting = False
            with _lock:
                TOTALS["requests"] += 1
                TOTALS["statements"] += count[0]
                TOTALS["commits"] += _local.commits


def stats(request):
    with _lock:
        return JsonResponse(dict(TOTALS))
