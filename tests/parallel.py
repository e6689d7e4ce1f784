"""A pytest plugin (``-p tests.parallel``, on in pyproject's addopts) for running the suite in
parallel with pytest-xdist (``make test`` passes ``-n 2``; docs/operations/tests.md).

Three things the stock plugin does not know about this suite:

* **Redis databases.** e2e tests flush ``E2E_REDIS_DB``, acceptance tests ``ACCEPTANCE_REDIS_DB``,
  and some flush ``REDIS_URL``'s own database (the in-process channel layer and Celery broker). Two
  workers sharing one would flush each other's queues mid-test. Each worker gets three databases of
  its own from ``TEST_REDIS_DBS`` (default below: gw0 keeps the serial defaults 0, 9, 11). This runs
  when the worker imports the plugin, before Django reads its settings (``REDIS_URL``).
  The PostgreSQL test database needs nothing here: pytest-django suffixes it per worker
  (``test_controlplane_gw0``), and every process a test starts gets that name
  (``tests.live.test_database_url``).
* **What must stay on one worker.** The acceptance package shares one live system (daphne, Celery +
  beat, world) and one report; an e2e module one world or daphne. Tests are handed out a file at a
  time, the acceptance package as one unit, so no such system is started twice.
* **Order.** The run ends when the slower worker does: the longest units go first (their seconds in
  the last parallel run, kept in pytest's cache; without a cache, the directories whose tests start
  real processes, then the rest by size), so two minutes of acceptance tests never start last.
"""

from __future__ import annotations

import os
from collections import OrderedDict, defaultdict
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

#: Three Redis databases a worker: REDIS_URL's, E2E_REDIS_DB, ACCEPTANCE_REDIS_DB. Redis has 16.
DEFAULT_REDIS_DBS = "0,9,11,1,10,12,2,13,14,3,15,4"
#: Scopes (a file, or a package kept whole) handed out as one unit.
WHOLE_PACKAGES = ("tests/acceptance/",)
#: Where the tests start real processes (daphne, Celery, the world, chromium): without timings
#: from an earlier run, these go first.
SLOW_DIRS = (
    "tests/acceptance/",
    "tests/e2e/",
    "tests/deploy/",
    "tests/adversarial/",
    "tests/demo/",
    "tests/identity/",
    "tests/bench/",
    "tests/notifications/",
)
CACHE_KEY = "controlplane/unit-seconds"


def redis_dbs_for(worker: str, count: int) -> tuple[int, int, int]:
    """The (REDIS_URL, E2E_REDIS_DB, ACCEPTANCE_REDIS_DB) databases of worker ``gwN``."""
    raw = os.environ.get("TEST_REDIS_DBS") or DEFAULT_REDIS_DBS
    dbs = [int(x) for x in raw.replace(" ", "").split(",") if x]
    if len(set(dbs)) != len(dbs) or any(not 0 <= d <= 15 for d in dbs):
        raise pytest.UsageError(f"TEST_REDIS_DBS={raw!r}: distinct numbers 0-15, please")
    if len(dbs) < 3 * count:
        raise pytest.UsageError(
            f"{count} xdist workers need {3 * count} Redis databases, TEST_REDIS_DBS has {len(dbs)}"
            " (three a worker: REDIS_URL's, E2E_REDIS_DB, ACCEPTANCE_REDIS_DB)"
        )
    n = int(worker.removeprefix("gw"))
    return dbs[3 * n], dbs[3 * n + 1], dbs[3 * n + 2]


def _check_allocation(count: int) -> None:
    """On the controller, before any worker starts: refuse what would make workers share a database."""
    explicit = [v for v in ("E2E_REDIS_DB", "ACCEPTANCE_REDIS_DB") if os.environ.get(v)]
    if explicit and not os.environ.get("TEST_REDIS_DBS"):
        raise pytest.UsageError(
            f"{' and '.join(explicit)} name one database, but {count} xdist workers need one each:"
            " set TEST_REDIS_DBS (three a worker: REDIS_URL's, E2E, acceptance), or run with -n 0"
        )
    redis_dbs_for(f"gw{count - 1}", count)


def _assign_worker_redis() -> None:
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if not worker:
        return
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    main, e2e, acceptance = redis_dbs_for(worker, count)
    os.environ["E2E_REDIS_DB"] = str(e2e)
    os.environ["ACCEPTANCE_REDIS_DB"] = str(acceptance)
    url = os.environ.get("REDIS_URL", "")
    if url.startswith("redis://"):
        os.environ["REDIS_URL"] = urlunsplit(urlsplit(url)._replace(path=f"/{main}"))


# At import: xdist sets PYTEST_XDIST_WORKER before the worker's config loads this plugin, and
# pytest-django imports the settings (which read REDIS_URL) only after.
_assign_worker_redis()


def scope_of(nodeid: str) -> str:
    for package in WHOLE_PACKAGES:
        if nodeid.startswith(package):
            return package.rstrip("/")
    return nodeid.split("::", 1)[0]


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):
        return
    count = getattr(config.option, "numprocesses", None)
    if isinstance(count, int) and count > 0 and config.getoption("dist", "no") != "no":
        _check_allocation(count)
        config.pluginmanager.register(_UnitTimer(config), "controlplane-unit-timer")


class _UnitTimer:
    """On the controller: each unit's seconds (setup + call + teardown of its tests), kept in
    pytest's cache for the next run's order."""

    def __init__(self, config: pytest.Config):
        self.config, self.seconds = config, defaultdict(float)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[scope_of(report.nodeid)] += report.duration

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        cache = getattr(self.config, "cache", None)  # None under -p no:cacheprovider
        if cache is None or not self.seconds:
            return
        kept = dict(cache.get(CACHE_KEY, {}))
        kept.update({k: round(v, 2) for k, v in self.seconds.items()})
        cache.set(CACHE_KEY, kept)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """xdist's default ``--dist load`` hands out single tests; with ``-n`` and no other ``--dist``
    the suite's units are used instead. An explicit ``--dist loadfile`` etc. keeps xdist's own."""
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SuiteScheduling(LoadScopeScheduling):
        ordered = False

        def _split_scope(self, nodeid: str) -> str:
            return scope_of(nodeid)

        def _assign_work_unit(self, node: Any) -> None:
            # The queue is complete when the first unit is handed out: order it once, longest first.
            if not self.ordered:
                weights = expected_seconds(self.config, self.workqueue)
                self.workqueue = OrderedDict(
                    sorted(self.workqueue.items(), key=lambda kv: weights[kv[0]], reverse=True)
                )
                self.ordered = True
            super()._assign_work_unit(node)

    return SuiteScheduling(config, log)


def expected_seconds(config: pytest.Config, units: dict[str, dict[str, bool]]) -> dict[str, float]:
    """Each unit's expected seconds: the last parallel run's, else a guess that puts the directories
    whose tests start real processes first."""
    cache = getattr(config, "cache", None)
    cached = cache.get(CACHE_KEY, {}) if cache is not None else {}
    slow_dirs = tuple(d.rstrip("/") for d in SLOW_DIRS)
    weights = {}
    for scope, tests in units.items():
        per_test = 5.0 if scope.startswith(slow_dirs) else 0.3  # seconds, roughly, on 2 busy cores
        guess = len(tests) * per_test
        weights[scope] = float(cached.get(scope, guess))
    return weights
