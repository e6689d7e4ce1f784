"""What the custom PostgreSQL backend (core/pg/backend) costs against Django's own, in CPU.

One process, two database aliases on the same PostgreSQL database with the same settings and pool
options (the product's ``OPTIONS["pool"]``): ``custom`` on ``core.pg.backend`` (the refusing pool,
its check of an idle connection, the marking cursor, the request-start reset) and ``stock`` on
``django.db.backends.postgresql``. Two operations, each timed in rounds that alternate which backend
goes first (the machine is shared: a burst of load lands on both sides, not on one):

- **checkout**: ``cursor()`` (a checkout from the pool), ``SELECT 1``, ``close()`` (back to the pool);
- **request**: an in-process ASGI request (the product's handler and middleware, DEBUG off, as
  bench.request_path) to a view that runs ``SELECT 1`` on the alias; the connection goes back to the
  pool at the request's end. ``floor`` is the same request to a view that touches no database.

CPU per operation is ``time.process_time`` (this process, every thread: the pools' workers too; not
PostgreSQL's), after a ``gc.collect()``. On a shared machine a round's figure swings by half with
the neighbours' load, so the rounds are many and short; the summary gives the median and minimum
over rounds, the ratio custom / stock of each, and the median of the rounds' paired ratios.

    DATABASE_URL=postgresql://postgres@127.0.0.1:5432/cp_bench_backend \\
    .venv/bin/python -m bench.backend_cost [--rounds 30] [--checkouts 150] [--requests 60] \\
        [--out bench/results/backend_cost.json]
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import gc
import json
import os
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

from django.http import JsonResponse
from django.urls import path

from bench import harness

ALIASES = ("custom", "stock")


def db_view(request, alias: str):
    from django.db import connections

    with connections[alias].cursor() as cursor:
        cursor.execute("SELECT 1")
        cursor.fetchone()
    return JsonResponse({"ok": True})


def floor_view(request):
    return JsonResponse({"ok": True})


def _urlpatterns() -> list[Any]:
    from controlplane.urls import urlpatterns as control_plane_urls

    return [
        path("bench/backend/<str:alias>/", db_view),
        path("bench/floor/", floor_view),
        *control_plane_urls,
    ]


def __getattr__(name: str) -> Any:  # ROOT_URLCONF: built on first use, after django.setup()
    if name == "urlpatterns":
        return _urlpatterns()
    raise AttributeError(name)


def _setup(database_url: str) -> None:
    harness.ensure_database(database_url)
    os.environ.update(
        DATABASE_URL=database_url,
        DEBUG="0",
        LOG_LEVEL="WARNING",
        DJANGO_SETTINGS_MODULE="controlplane.settings",
    )
    from django.conf import settings

    default = settings.DATABASES["default"]
    if default["ENGINE"] != "core.pg.backend":
        raise SystemExit(f"DATABASE_URL must be PostgreSQL (got {default['ENGINE']})")
    settings.DATABASES["custom"] = copy.deepcopy(default)
    settings.DATABASES["stock"] = {
        **copy.deepcopy(default),
        "ENGINE": "django.db.backends.postgresql",
    }
    settings.ROOT_URLCONF = "bench.backend_cost"
    import django

    django.setup()


def _checkouts(alias: str, count: int) -> tuple[float, float]:
    from django.db import connections

    conn = connections[alias]
    gc.collect()  # the other side's garbage is not collected on this side's clock
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(count):
        with conn.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
        conn.close()
    return time.process_time() - cpu, time.perf_counter() - wall


async def _requests(caller: Any, url: str, count: int) -> tuple[float, float]:
    gc.collect()
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(count):
        status, body = await caller.call("GET", url)
        if status != 200:
            raise SystemExit(f"GET {url} -> {status}: {str(body)[:300]}")
    return time.process_time() - cpu, time.perf_counter() - wall


def _summary(samples: dict[str, list[tuple[float, float]]], count: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, rounds in samples.items():
        cpu = [c / count * 1e6 for c, _ in rounds]
        wall = [w / count * 1e6 for _, w in rounds]
        out[name] = {
            "cpu_us_median": round(statistics.median(cpu), 1),
            "cpu_us_min": round(min(cpu), 1),
            "wall_us_median": round(statistics.median(wall), 1),
            "cpu_us_rounds": [round(x, 1) for x in cpu],
        }
    custom, stock = out["custom"]["cpu_us_median"], out["stock"]["cpu_us_median"]
    out["cpu_ratio_custom_over_stock"] = round(custom / stock, 3)
    out["cpu_us_difference"] = round(custom - stock, 1)
    out["cpu_ratio_of_minimums"] = round(
        out["custom"]["cpu_us_min"] / out["stock"]["cpu_us_min"], 3
    )
    paired = [c[0] / s[0] for c, s in zip(samples["custom"], samples["stock"], strict=True)]
    out["cpu_ratio_paired_rounds_median"] = round(statistics.median(paired), 3)
    return out


async def _run(rounds: int, checkouts: int, requests: int) -> dict[str, Any]:
    from asgiref.sync import sync_to_async

    from bench.request_path import Caller
    from controlplane.asgi import application

    caller = Caller(application, token="")
    # the ASGI handler runs sync views and its connection handling in one thread (thread_sensitive):
    # the checkout loop runs there too, so both operations use the same thread's connections
    checkout = sync_to_async(_checkouts, thread_sensitive=True)
    for alias in ALIASES:  # warm-up: pools open and full, code paths hot
        await checkout(alias, 100)
        await _requests(caller, f"/bench/backend/{alias}/", 50)
    await _requests(caller, "/bench/floor/", 50)

    check: dict[str, list[tuple[float, float]]] = {alias: [] for alias in ALIASES}
    request: dict[str, list[tuple[float, float]]] = {alias: [] for alias in ALIASES}
    floor: list[tuple[float, float]] = []
    loads = [os.getloadavg()[0]]
    for r in range(rounds):
        order = ALIASES if r % 2 == 0 else ALIASES[::-1]
        for alias in order:
            check[alias].append(await checkout(alias, checkouts))
        for alias in order:
            request[alias].append(await _requests(caller, f"/bench/backend/{alias}/", requests))
        floor.append(await _requests(caller, "/bench/floor/", requests))
        loads.append(os.getloadavg()[0])
    result = {
        "checkout": _summary(check, checkouts),
        "request": _summary(request, requests),
        "floor_request_cpu_us_median": round(
            statistics.median(c / requests * 1e6 for c, _ in floor), 1
        ),
        "loadavg_1min_per_round": [round(x, 2) for x in loads],
    }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--checkouts", type=int, default=150, help="per backend per round")
    parser.add_argument("--requests", type=int, default=60, help="per backend per round")
    parser.add_argument("--out", default="bench/results/backend_cost.json")
    args = parser.parse_args()
    database_url = os.environ.get(
        "DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/cp_bench_backend"
    )
    _setup(database_url)
    started = time.monotonic()
    load_before = [round(x, 2) for x in os.getloadavg()]
    result = asyncio.run(_run(args.rounds, args.checkouts, args.requests))
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    result["measured"] = {
        "commit": commit,
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "rounds": args.rounds,
        "checkouts_per_round": args.checkouts,
        "requests_per_round": args.requests,
        "seconds": round(time.monotonic() - started, 1),
        "cpus": os.cpu_count(),
        "load_avg_1_5_15_before": load_before,
        "load_avg_1_5_15_after": [round(x, 2) for x in os.getloadavg()],
        "database": harness.redact(database_url),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("checkout", "request")}, indent=1))
    print("floor request CPU µs:", result["floor_request_cpu_us_median"])
    print("load average:", load_before, "->", result["measured"]["load_avg_1_5_15_after"])


if __name__ == "__main__":
    main()
