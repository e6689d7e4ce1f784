"""PostgreSQL's raw single-row INSERT+COMMIT rate: the ceiling the protocol benchmark is compared with.

    .venv/bin/python -m bench.rawpg [--connections 4] [--seconds 4]

One process per connection (psycopg 3), each looping ``INSERT one row; COMMIT`` into a scratch table
that is created before and dropped after.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import signal
import time
from typing import Any

from bench import harness

RAW_CONNECTIONS = 4

RAW_TABLE = "bench_raw_commit"


def raw_commit_worker(database_url: str, index: int, seconds: float, barrier, results) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    import psycopg

    try:
        with psycopg.connect(database_url) as conn:
            conn.execute("SELECT 1")
            conn.commit()
            barrier.wait()
            t0 = time.monotonic()
            deadline, n = t0 + seconds, 0
            while time.monotonic() < deadline:
                conn.execute(
                    f"INSERT INTO {RAW_TABLE} (worker, payload) VALUES (%s, %s)", [index, "x" * 64]
                )
                conn.commit()
                n += 1
            results.put({"index": index, "commits": n, "elapsed": time.monotonic() - t0})
    except Exception as exc:
        results.put({"index": index, "fatal": f"{type(exc).__name__}: {exc}"})


def raw_pg_commits(
    ctx, database_url: str, seconds: float, connections: int = RAW_CONNECTIONS
) -> dict[str, Any]:
    """Single-row INSERT + COMMIT in a loop on `connections` connections (one process each)."""
    import psycopg

    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {RAW_TABLE}")
        conn.execute(
            f"CREATE TABLE {RAW_TABLE} (id bigserial PRIMARY KEY, worker int NOT NULL, payload text NOT NULL, "
            "created_at timestamptz NOT NULL DEFAULT now())"
        )
    barrier, results = ctx.Barrier(connections), ctx.Queue()
    procs = [
        ctx.Process(
            target=raw_commit_worker, args=(database_url, i, seconds, barrier, results), daemon=True
        )
        for i in range(connections)
    ]
    try:
        for p in procs:
            p.start()
        reports = [results.get(timeout=seconds + 60) for _ in procs]
    finally:
        harness.stop_processes(procs)
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(f"DROP TABLE IF EXISTS {RAW_TABLE}")
    fatal = [r["fatal"] for r in reports if "fatal" in r]
    if fatal:
        raise RuntimeError(f"raw commit worker failed: {fatal[0]}")
    commits = sum(r["commits"] for r in reports)
    elapsed = max(r["elapsed"] for r in reports)
    return {
        "connections": connections,
        "seconds": round(elapsed, 2),
        "commits": commits,
        "commits_per_s": round(commits / elapsed, 1),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.rawpg", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--connections", type=int, default=RAW_CONNECTIONS)
    parser.add_argument("--seconds", type=float, default=4.0)
    args = parser.parse_args(argv)
    database_url = os.environ.get("DATABASE_URL") or harness.DEFAULT_DATABASE_URL
    harness.ensure_database(database_url)
    print(
        json.dumps(
            raw_pg_commits(mp.get_context("spawn"), database_url, args.seconds, args.connections)
        )
    )


if __name__ == "__main__":
    main()
