"""The control plane's own settings plus the benchmark's floor routes (bench/urls.py).

The protocol phases run against these servers too: the only difference from
``controlplane.settings`` is two extra URLs that never touch the database."""

from controlplane.settings import *  # noqa: F403

ROOT_URLCONF = "bench.urls"

# Statements and commits per request (bench/stats.py), read by the benchmark per phase.
MIDDLEWARE = ["bench.stats.CountStatements", *MIDDLEWARE]  # noqa: F405
