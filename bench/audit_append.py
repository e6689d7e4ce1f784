"""Audit appends per second under 64 concurrent writers: per-run chains against one global chain.

    .venv/bin/python -m bench.audit_append [--writers 64] [--seconds 5] [--processes 1,2,4]
                                           [--rest-ms 1] [--fresh-db]

Each writer is a thread that loops over decisions: one transaction holding ``record_audit`` (the real
one, on a real PostgreSQL scratch database) followed by the rest of the decision, modelled as
``--rest-ms`` of server time inside the same transaction (in the product, the history row, the outbox
and the notify come after the audit row, and every row lock taken is held until COMMIT). The writers
are spread over 1, 2 and 4 processes (64 writers in all each time), in two modes:

- ``global_lock``: what audit did before per-chain chains: every decision first locks one global head
  row FOR UPDATE (as ``_lock_head`` did) and then appends; every decision in the system queues there.
- ``per_run``: every writer appends to its own run's chain, as decisions on different runs do now.

Settings are interleaved over ``--rounds`` repetitions and the medians reported, with the writers'
own CPU per append and the load average at each sample (the machine may be shared). Results go to
bench/results/audit_append.json.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import signal
import statistics
import threading
import time
import uuid
from typing import Any

from bench import harness

MODES = ("global_lock", "per_run")
GLOBAL_TABLE = "bench_audit_global_head"


def _writer_process(env, mode, threads, seconds, rest_ms, barrier, results) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # One pooled connection per writer thread (the pool's default cap would make writers wait for it).
    os.environ.update(env | {"DB_POOL_MIN": "1", "DB_POOL_MAX": str(threads + 2)})
    import django

    django.setup()
    from django.db import connection, transaction

    from audit.services import record_audit
    from core.actors import system_actor

    actor = system_actor("bench")
    import resource

    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    counts = [0] * threads
    errors: list[str] = []
    ready = threading.Barrier(threads + 1)

    def loop(i: int) -> None:
        run_id = uuid.uuid4()  # the writer's own run: its own chain
        try:
            try:
                connection.ensure_connection()
            finally:
                ready.wait()  # whatever happened: the others must not wait for this writer
            deadline = start + seconds
            while time.monotonic() < deadline:
                with transaction.atomic():
                    with connection.cursor() as cursor:
                        if mode == "global_lock":
                            cursor.execute(f"SELECT 1 FROM {GLOBAL_TABLE} WHERE id = 1 FOR UPDATE")
                        record_audit(
                            actor=actor,
                            action="bench.append",
                            object_type="run",
                            object_id=run_id,
                            run_id=run_id,
                            context={"writer": i},
                        )
                        if rest_ms:
                            cursor.execute("SELECT pg_sleep(%s)", [rest_ms / 1000])
                counts[i] += 1
        except (
            Exception
        ) as exc:  # reported, not raised: one failed writer must not hang the barrier
            errors.append(f"{type(exc).__name__}: {exc}")
        finally:
            connection.close()

    workers = [threading.Thread(target=loop, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    barrier.wait()
    start = time.monotonic()
    ready.wait()
    for w in workers:
        w.join()
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    results.put(
        {
            "appends": sum(counts),
            "elapsed": time.monotonic() - start,
            "cpu_s": cpu,
            "errors": errors,
        }
    )


def measure(env, mode: str, processes: int, writers: int, seconds: float, rest_ms: float) -> dict:
    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(processes), ctx.Queue()
    per = [writers // processes + (1 if i < writers % processes else 0) for i in range(processes)]
    procs = [
        ctx.Process(target=_writer_process, args=(env, mode, n, seconds, rest_ms, barrier, results))
        for n in per
    ]
    for p in procs:
        p.start()
    got = [results.get(timeout=seconds + 120) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    appends = sum(g["appends"] for g in got)
    elapsed = max(g["elapsed"] for g in got)
    errors = [e for g in got for e in g["errors"]]
    cpu = sum(g["cpu_s"] for g in got)
    return {
        "mode": mode,
        "processes": processes,
        "writers": writers,
        "appends": appends,
        "seconds": round(elapsed, 2),
        "appends_per_s": round(appends / elapsed, 1) if elapsed else 0.0,
        "client_cpu_ms_per_append": round(1000 * cpu / appends, 3) if appends else None,
        "loadavg": round(os.getloadavg()[0], 1),
        "errors": errors[:5],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--writers", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--processes", default="1,2,4")
    parser.add_argument("--rest-ms", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=2, help="interleaved repetitions")
    parser.add_argument("--fresh-db", action="store_true")
    parser.add_argument("--out", default=str(harness.RESULTS_DIR / "audit_append.json"))
    args = parser.parse_args()
    database_url, redis_url = harness.service_urls("bench.audit_append")
    harness.ensure_database(database_url, fresh=args.fresh_db)
    env = harness.bench_env(database_url, redis_url)
    harness.manage(env, "migrate", "--noinput", "-v", "0")
    import psycopg

    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE IF NOT EXISTS {GLOBAL_TABLE} (id int PRIMARY KEY)")
        conn.execute(f"INSERT INTO {GLOBAL_TABLE} VALUES (1) ON CONFLICT DO NOTHING")
    counts = [int(x) for x in args.processes.split(",")]
    rows = []
    for round_ in range(args.rounds):  # interleaved: a noisy neighbour hits every setting alike
        for processes in counts:
            for mode in MODES:
                row = measure(env, mode, processes, args.writers, args.seconds, args.rest_ms)
                row["round"] = round_ + 1
                print(json.dumps(row), flush=True)
                rows.append(row)
    verified = json.loads(harness.manage(env, "audit_verify").strip().splitlines()[-1])
    rate = {
        (mode, p): statistics.median(
            r["appends_per_s"] for r in rows if (r["mode"], r["processes"]) == (mode, p)
        )
        for mode in MODES
        for p in counts
    }
    result: dict[str, Any] = {
        "benchmark": "audit_append",
        "writers": args.writers,
        "rest_of_decision_ms": args.rest_ms,
        "seconds_per_sample": args.seconds,
        "rounds": args.rounds,
        "median_appends_per_s": {f"{m}/{p}": rate[(m, p)] for m in MODES for p in counts},
        "samples": rows,
        "per_run_over_global_lock": {
            str(p): round(rate[("per_run", p)] / rate[("global_lock", p)], 2)
            for p in counts
            if rate[("global_lock", p)]
        },
        "per_run_by_processes": {str(p): rate[("per_run", p)] for p in counts},
        "global_lock_by_processes": {str(p): rate[("global_lock", p)] for p in counts},
        "chains_verified": verified["chain"]["ok"],
        "events_verified": verified["chain"]["checked"],
        "chains": verified["chain"]["chains"],
        "database": harness.redact(database_url),
        "machine": harness.machine_info(database_url),
        "commit": harness.git_commit(),
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    harness.RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump(result, fh, indent=2)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
