"""The xdist plugin (tests/parallel.py): workers get Redis databases of their own, the units keep a
shared live system on one worker, and the longest units go first."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import parallel

ROOT = Path(__file__).resolve().parents[1]

PROBE = """
import json, os, time
from pathlib import Path

def _write(name):
    keys = ("PYTEST_XDIST_WORKER", "REDIS_URL", "E2E_REDIS_DB", "ACCEPTANCE_REDIS_DB")
    Path(os.environ["PROBE_OUT"], name).write_text(json.dumps({k: os.environ.get(k) for k in keys}))

def test_a():
    time.sleep(1)  # the other worker takes the other file meanwhile
    _write("a")

def test_b():
    time.sleep(1)
    _write("b")
"""


def test_two_workers_get_distinct_redis_databases(tmp_path):
    """A real two-worker run: each worker's environment (what its tests and the processes they
    start see) names three databases no other worker uses."""
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "pytest.ini").write_text("[pytest]\n")
    (suite / "test_one.py").write_text(PROBE.replace("test_b", "_unused_b"))
    (suite / "test_two.py").write_text(PROBE.replace("test_a", "_unused_a"))
    out = tmp_path / "out"
    out.mkdir()
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("E2E_REDIS_DB", "ACCEPTANCE_REDIS_DB", "DJANGO_SETTINGS_MODULE")
        and not k.startswith("PYTEST_")
    }
    env |= {
        "PYTHONPATH": str(ROOT),
        "PROBE_OUT": str(out),
        "REDIS_URL": "redis://127.0.0.1:6379/0",
        "TEST_REDIS_DBS": "0,9,11,1,10,12",
    }
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "-p", "tests.parallel", "-p", "no:django",
         "-p", "no:cacheprovider", "-q", str(suite)],
        cwd=suite, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    seen = [json.loads((out / name).read_text()) for name in ("a", "b")]
    assert {s["PYTEST_XDIST_WORKER"] for s in seen} == {"gw0", "gw1"}, seen
    by_worker = {s["PYTEST_XDIST_WORKER"]: s for s in seen}
    assert by_worker["gw0"] | {"PYTEST_XDIST_WORKER": None} == {
        "PYTEST_XDIST_WORKER": None,
        "REDIS_URL": "redis://127.0.0.1:6379/0",
        "E2E_REDIS_DB": "9",
        "ACCEPTANCE_REDIS_DB": "11",
    }
    assert by_worker["gw1"]["REDIS_URL"] == "redis://127.0.0.1:6379/1"
    assert (by_worker["gw1"]["E2E_REDIS_DB"], by_worker["gw1"]["ACCEPTANCE_REDIS_DB"]) == (
        "10",
        "12",
    )


def test_a_run_that_would_share_a_database_is_refused(monkeypatch):
    monkeypatch.setenv("E2E_REDIS_DB", "3")
    monkeypatch.delenv("TEST_REDIS_DBS", raising=False)
    with pytest.raises(pytest.UsageError, match="TEST_REDIS_DBS"):
        parallel._check_allocation(2)
    monkeypatch.setenv("TEST_REDIS_DBS", "3,4,5")
    with pytest.raises(pytest.UsageError, match="need 6 Redis databases"):
        parallel._check_allocation(2)
    monkeypatch.setenv("TEST_REDIS_DBS", "3,4,5,6,7,3")
    with pytest.raises(pytest.UsageError, match="distinct"):
        parallel._check_allocation(2)


def test_the_acceptance_package_is_one_unit_and_other_tests_go_by_file():
    assert (
        parallel.scope_of("tests/acceptance/test_run_control.py::test_x[1]") == "tests/acceptance"
    )
    assert (
        parallel.scope_of("tests/acceptance/test_scenarios_walk.py::test_y") == "tests/acceptance"
    )
    assert (
        parallel.scope_of("tests/e2e/test_fleet_waves.py::Test::test_z")
        == "tests/e2e/test_fleet_waves.py"
    )


class _NoCache:
    cache = None


def test_without_timings_the_units_that_start_processes_go_first():
    units = {
        "tests/runs/test_big.py": dict.fromkeys(map(str, range(100)), False),
        "tests/acceptance": dict.fromkeys(map(str, range(20)), False),
        "tests/e2e/test_one.py": {"x": False},
    }
    weights = parallel.expected_seconds(_NoCache(), units)  # type: ignore[arg-type]
    assert sorted(units, key=weights.__getitem__, reverse=True) == [
        "tests/acceptance",
        "tests/runs/test_big.py",
        "tests/e2e/test_one.py",
    ]


@pytest.mark.django_db(transaction=True)
def test_a_transactional_test_that_deletes_the_role_groups():
    from django.contrib.auth.models import Group

    Group.objects.all().delete()
    assert not Group.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_the_next_test_still_finds_the_roles_the_migrations_seeded():
    """Every test starts from the migrated database (tests/conftest.py), whatever ran before it on
    its worker: the teardown of the test above wrote the six role groups back."""
    from django.contrib.auth.models import Group

    from core.roles import ROLES

    assert sorted(Group.objects.values_list("name", flat=True)) == sorted(ROLES)
