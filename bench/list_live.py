"""What one push to N open run-list pages costs the web process, in-process (issue 10, "Budgets").

    .venv/bin/python -m bench.list_live [--pages 10] [--repeat 30] [--out bench/results/list_live.json]

On the console benchmark's database (``DATABASE_URL``; bench/console.py seeds it), as a viewer:

- ``whole``: what a list socket did before console/list_live.py, for each of N pages on every new
  run or state change: the whole table (list_context + the run-table partial);
- ``shared``: one ``list_update`` for the hints of a window (five runs named, counts included),
  then each page's frames from it (``ListPage.frames``, string work);
- ``shared_rows_only``: the same without the counts (a window with no new run or state change).

Process CPU (time.process_time) and the wall time of the SQL, per push to all N pages.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import harness


def measure(fn, repeat: int) -> dict[str, float]:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    fn()  # warm: templates compiled, plans cached
    cpu, queries, db = [], 0, 0.0
    for _ in range(repeat):
        with CaptureQueriesContext(connection) as ctx:
            c0 = time.process_time()
            fn()
            cpu.append((time.process_time() - c0) * 1000)
        queries = len(ctx.captured_queries)
        db += sum(float(q["time"]) for q in ctx.captured_queries) * 1000
    return {
        "cpu_p50_ms": round(statistics.median(cpu), 2),
        "cpu_p95_ms": round(sorted(cpu)[max(0, int(len(cpu) * 0.95) - 1)], 2),
        "queries": queries,
        "db_ms_mean": round(db / repeat, 2),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--pages", type=int, default=10)
    p.add_argument("--repeat", type=int, default=30)
    p.add_argument("--out", default=str(harness.RESULTS_DIR / "list_live.json"))
    args = p.parse_args(argv)
    database_url, _ = harness.service_urls("bench.list_live")
    env = harness.bench_env(database_url, harness.DEFAULT_REDIS_URL)
    os.environ.update({k: env[k] for k in ("DATABASE_URL", "DEBUG", "DJANGO_SETTINGS_MODULE")})
    import django

    django.setup()
    from django.contrib.auth.models import Group, User

    from console.list_live import View, full_render, list_update, view_key
    from core.roles import roles_of
    from runs.models import Run

    user, _ = User.objects.get_or_create(username="bench-viewer")
    user.groups.add(Group.objects.get_or_create(name="viewer")[0])
    view = View.parse("")
    assert view is not None
    key = view_key(view, user, roles_of(user))
    html, page = full_render(user, view, key, 0.0)
    assert page is not None
    named = list(Run.objects.order_by("-created_at").values_list("pk", flat=True)[:5])
    pending: dict[str, Any] = {str(r): {"state_changed": {""}, "run": {""}} for r in named}

    def whole() -> None:
        for _ in range(args.pages):
            full_render(user, view, key, 0.0)

    def shared(with_counts: bool):
        def push() -> None:
            update = list_update(user, view, pending, with_counts)
            for _ in range(args.pages):
                copy = replace(page, shown=list(page.shown), keys=dict(page.keys), joined=set())
                copy.frames(update)

        return push

    results = {
        "whole": measure(whole, args.repeat),
        "shared": measure(shared(True), args.repeat),
        "shared_rows_only": measure(shared(False), args.repeat),
    }
    result = {
        "benchmark": "list_live",
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "database": harness.redact(database_url),
        "runs": Run.objects.count(),
        "pages": args.pages,
        "repeat": args.repeat,
        "whole_table_kb": round(len(html) / 1024, 1),
        "machine": {
            "cpus": os.cpu_count(),
            "python": sys.version.split()[0],
            "load_avg_1_5_15": [round(x, 1) for x in os.getloadavg()],
        },
        "per_push_to_all_pages": results,
    }
    out = Path(args.out)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
