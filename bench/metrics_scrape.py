"""The cost of a /metrics scrape as the ledger grows (issue 22, item 6). A benchmark, not a test.

    .venv/bin/python -m bench.metrics_scrape [--sizes 1000,100000] [--repeat 20]
                                             [--out bench/results/metrics_scrape.json]

On a scratch PostgreSQL database (``DATABASE_URL``, default ``…/controlplane_metrics_bench``,
recreated each time) it loads runs (and 0-3 effects each) by COPY up
to each size in turn, and at each size scrapes ``/metrics`` in-process with Django's test client:
server time p50/p95 over ``--repeat`` scrapes and the SQL statements one scrape runs. For contrast
it times the counts the scrape used to run (``COUNT(*)`` over runs and effects by state/status),
which the tallies (RunTally, LedgerTally) replaced. Bar: the same statements per scrape at every
size and a p95 that does not grow with the ledger.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench import harness

DEFAULT_DATABASE_URL = "postgresql://postgres@127.0.0.1:5432/controlplane_metrics_bench"
STATES = ["succeeded"] * 70 + ["failed"] * 10 + ["running"] * 10 + ["queued"] * 8 + ["paused"] * 2


def load(start: int, stop: int) -> None:
    """Runs ``start``..``stop`` with their effects, by COPY (the triggers keep the tallies: a COPY
    fires the statement-level ones once)."""
    import random

    from django.db import connection, transaction

    from bench.console import _copy, _effect
    from runs.models import Agent, Effect, Run

    rng = random.Random(start)
    agent = Agent.objects.get_or_create(name="purchasing")[0]
    now = datetime.now(UTC)
    runs, effects = [], []
    for i in range(start, stop):
        run_id, created = uuid.uuid4(), now - timedelta(seconds=i)
        state = rng.choice(STATES)
        runs.append(
            {
                "id": run_id,
                "agent_id": agent.pk,
                "goal": f"run {i}",
                "state": state,
                "created_at": created,
                "updated_at": created,
                "state_changed_at": created,
                "attempt_count": 1,
            }
        )
        for _ in range(rng.choice((0, 1, 1, 2, 3))):
            status = "unknown" if rng.random() < 0.001 else "committed"
            effects.append(_effect(run_id, "payments", "charge", status, created))
    with transaction.atomic(), connection.cursor() as cursor:
        _copy(cursor, Run, runs)
        _copy(cursor, Effect, effects)
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE")


def scrape(repeat: int) -> dict[str, Any]:
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    client = Client()
    client.get("/metrics")  # warm: imports, connection
    times, queries = [], set()
    for _ in range(repeat):
        with CaptureQueriesContext(connection) as ctx:
            started = time.perf_counter()
            resp = client.get("/metrics")
            times.append((time.perf_counter() - started) * 1000)
        assert resp.status_code == 200, resp.content[:300]
        queries.add(len(ctx.captured_queries))
    times.sort()
    return {
        "scrape_p50_ms": round(statistics.median(times), 2),
        "scrape_p95_ms": round(times[max(int(len(times) * 0.95) - 1, 0)], 2),
        "queries_per_scrape": sorted(queries),
        "body_bytes": len(resp.content),
    }


def old_counts_ms(repeat: int) -> float:
    """What the scrape ran before the tallies: COUNT(*) over runs and effects, grouped."""
    from django.db import connection

    times = []
    with connection.cursor() as cursor:
        for _ in range(repeat):
            started = time.perf_counter()
            cursor.execute("SELECT state, COUNT(*) FROM runs_run GROUP BY state")
            cursor.fetchall()
            cursor.execute("SELECT decision, status, COUNT(*) FROM runs_effect GROUP BY 1, 2")
            cursor.fetchall()
            times.append((time.perf_counter() - started) * 1000)
    return round(statistics.median(times), 2)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="1000,100000")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--out", default="bench/results/metrics_scrape.json")
    args = parser.parse_args(argv)
    database_url = os.environ.get("BENCH_DATABASE_URL") or DEFAULT_DATABASE_URL
    harness.ensure_database(database_url, fresh=True)
    env = harness.bench_env(database_url, os.environ.get("REDIS_URL") or harness.DEFAULT_REDIS_URL)
    harness.manage(env, "migrate", "--noinput", "-v", "0")
    os.environ.update({k: env[k] for k in ("DATABASE_URL", "DEBUG", "DJANGO_SETTINGS_MODULE")})
    os.environ.update(REDIS_URL=env.get("REDIS_URL", ""), LOG_LEVEL="WARNING")
    import django

    django.setup()
    from runs.models import Effect, Run

    sizes = [int(s) for s in args.sizes.split(",")]
    points: list[dict[str, Any]] = []
    loaded = 0
    for size in sizes:
        started = time.perf_counter()
        load(loaded, size)
        loaded = size
        point = {
            "runs": Run.objects.count(),
            "effects": Effect.objects.count(),
            "load_s": round(time.perf_counter() - started, 1),
        }
        point |= scrape(args.repeat)
        point["old_count_queries_ms"] = old_counts_ms(args.repeat)
        points.append(point)
        print(json.dumps(point))
    first, last = points[0], points[-1]
    result = {
        "benchmark": "metrics_scrape",
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "database": harness.redact(database_url),
        "machine": {
            "cpus": os.cpu_count(),
            "python": sys.version.split()[0],
            "load_avg_1_5_15": [round(x, 1) for x in os.getloadavg()],
        },
        "points": points,
        "same_queries_at_every_size": len({tuple(p["queries_per_scrape"]) for p in points}) == 1,
        "p95_growth_ratio": round(last["scrape_p95_ms"] / max(first["scrape_p95_ms"], 0.01), 2),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
