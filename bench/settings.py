"""The control plane's own settings plus the benchmark's floor routes (bench/urls.py).

The protocol phases run against these servers too: the only differences from
``controlplane.settings`` are three extra URLs that never touch the database (two floor routes and
``/bench/stats/``) and the SQL statement counter (bench/sqlcount.py) that the stats route reads."""

from bench import sqlcount
from controlplane.settings import *  # noqa: F403

ROOT_URLCONF = "bench.urls"

sqlcount.install()
