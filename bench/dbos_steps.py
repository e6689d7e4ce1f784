"""The peer the protocol is compared with: DBOS durable workflows on the same PostgreSQL.

    .venv/bin/python -m bench.dbos_steps [--workload transaction|step] [--workflows 16] [--runs 32]
                                         [--steps 20] [--database-url postgresql://…/controlplane_bench_dbos]

Each workflow runs `--steps` steps. ``--workload transaction`` (the default): each step is a
datasource transaction that inserts one row, and DBOS records the step's output in the same
transaction. ``--workload step``: each step is a plain ``@DBOS.step`` that returns a small document,
which DBOS records in its system database -- DBOS's cheapest durable step. Either way one durable
commit per step, in-process, no HTTP, no audit chain. `--workflows` threads start together and
share a pool of `--runs` workflows (the protocol phase's shape: 16 workers sharing 32 runs of 20
effects). Reports steps/s (steps ÷ wall time, workflow start and end included), this process's CPU
and the CPU of the PostgreSQL backends of its database, per step. Prints one JSON object on the
last line of stdout. Needs the ``bench`` extra (``pip install -e '.[bench]'``); without DBOS it
prints ``{"error": …}`` and exits 2.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from typing import Any

from bench import harness

ROW_TABLE = "bench_dbos_row"
# The control plane's own isolation level; DBOS's default for a datasource step is SERIALIZABLE.
ISOLATION = "READ COMMITTED"


def dbos_database_url(bench_database_url: str) -> str:
    """The benchmark database's server (and credentials), with a database of DBOS's own next to the
    benchmark's: ``<bench database>_dbos``."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(bench_database_url)
    return urlunsplit(parts._replace(path=f"{parts.path.rstrip('/')}_dbos"))


WORKLOADS = ("transaction", "step")


def _setup(database_url: str, isolation: str, workload: str = "transaction"):
    """Configure DBOS, its datasource and the workflow; returns (DBOS, the workflow function).

    DBOS 3 has no application database of its own: a ``SQLAlchemyDatasource``'s ``transaction`` step
    runs the function in a database transaction and records the step's output in the datasource's
    own table in that same transaction (one commit per step)."""
    import sqlalchemy as sa
    from dbos import DBOS, SQLAlchemyDatasource

    DBOS(
        config={
            "name": "controlplane-bench",
            "system_database_url": database_url,
            "log_level": "WARNING",
        }
    )
    if workload == "step":

        @DBOS.step()
        def plain_step(workflow: str, step: int) -> dict[str, Any]:
            # What an effect's outcome carries, roughly: DBOS stores it as the step's output.
            return {"workflow": workflow, "step": step, "payload": "x" * 64}

        step_fn: Any = plain_step
    else:
        datasource = SQLAlchemyDatasource.create(database_url)
        insert = sa.text(f"INSERT INTO {ROW_TABLE} (workflow, step, payload) VALUES (:w, :s, :p)")

        @datasource.transaction(isolation_level=isolation)  # type: ignore[call-overload, unused-ignore]
        def write_row(workflow: str, step: int) -> int:
            datasource.sql_session().execute(insert, {"w": workflow, "s": step, "p": "x" * 64})
            return step

        step_fn = write_row

    @DBOS.workflow()
    def bench_workflow(name: str, steps: int) -> int:
        done = 0
        for i in range(steps):
            step_fn(name, i)
            done += 1
        return done

    return DBOS, bench_workflow


def measure(
    database_url: str,
    workflows: int,
    runs: int,
    steps: int,
    isolation: str = ISOLATION,
    workload: str = "transaction",
) -> dict[str, Any]:
    import psycopg

    harness.ensure_database(database_url)
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            f"CREATE TABLE IF NOT EXISTS {ROW_TABLE} (id bigserial PRIMARY KEY, workflow text NOT NULL, "
            "step int NOT NULL, payload text NOT NULL, created_at timestamptz NOT NULL DEFAULT now())"
        )
        synchronous_commit = harness.scalar(conn, "SHOW synchronous_commit")
    dbos, bench_workflow = _setup(database_url, isolation, workload)
    dbos.launch()
    try:
        tag = f"{int(time.time())}"
        bench_workflow(f"warm-{tag}", 2)  # imports, pools, first plans: not measured
        counter = iter(range(runs))
        lock = threading.Lock()
        barrier = threading.Barrier(workflows + 1)
        done: list[int] = []
        errors: list[str] = []

        def worker(index: int) -> None:
            barrier.wait()
            while True:
                with lock:
                    number = next(counter, None)
                if number is None:
                    return
                try:
                    done.append(bench_workflow(f"{tag}-{index}-{number}", steps))
                except Exception as exc:  # reported, not raised: one failure must not hide the rest
                    errors.append(f"{type(exc).__name__}: {exc}"[:300])

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(workflows)]
        for t in threads:
            t.start()
        dbname = harness.dbname_of(database_url)
        pg0 = harness.postgres_backends_cpu(dbname)
        busy0, _ = harness.machine_cpu()
        barrier.wait()
        t0, cpu0 = time.monotonic(), time.process_time()
        for t in threads:
            t.join()
        wall, cpu = time.monotonic() - t0, time.process_time() - cpu0
        pg1 = harness.postgres_backends_cpu(dbname)
        busy1, _ = harness.machine_cpu()
    finally:
        dbos.destroy()
    pg = sum(max(v - pg0.get(pid, 0.0), 0.0) for pid, v in pg1.items())
    total_steps = sum(done)
    out: dict[str, Any] = {
        "workload": workload,
        "workflows_concurrent": workflows,
        "isolation_level": isolation if workload == "transaction" else None,
        # Read on a connection made like DBOS's (same URL, same PGOPTIONS): bench.suite sets the
        # commit behaviour of both sides explicitly (harness.commit_env).
        "synchronous_commit": synchronous_commit,
        "workflows": len(done),
        "steps_per_workflow": steps,
        "steps": total_steps,
        "wall_s": round(wall, 3),
        "steps_per_s": round(total_steps / wall, 1) if wall > 0 else 0.0,
        "errors": len(errors),
        "error_samples": errors[:3],
        "cpu": {
            "dbos_process_cpu_s": round(cpu, 2),
            "postgres_cpu_s": round(pg, 2),
            "other_cpu_s": round(max(busy1 - busy0 - cpu - pg, 0.0), 2),
        },
    }
    if total_steps:
        out["cpu"]["dbos_cpu_ms_per_step"] = round(1000 * cpu / total_steps, 2)
        out["cpu"]["postgres_cpu_ms_per_step"] = round(1000 * pg / total_steps, 2)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.dbos_steps", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--workload",
        choices=WORKLOADS,
        default="transaction",
        help="transaction: a datasource transaction inserting one row per step; step: a plain "
        "@DBOS.step whose output DBOS records",
    )
    parser.add_argument("--workflows", type=int, default=16, help="concurrent workflows (threads)")
    parser.add_argument("--runs", type=int, default=32, help="workflows in the shared pool")
    parser.add_argument("--steps", type=int, default=20, help="steps (one row each) per workflow")
    parser.add_argument("--database-url", default=None)
    parser.add_argument(
        "--isolation", default=ISOLATION, help=f"step isolation (default {ISOLATION})"
    )
    args = parser.parse_args(argv)
    database_url = args.database_url or dbos_database_url(harness.service_urls("bench.dbos")[0])
    try:
        import dbos  # noqa: F401
    except ImportError as exc:
        print(json.dumps({"error": f"DBOS is not installed ({exc}): pip install -e '.[bench]'"}))
        return 2
    result = measure(
        database_url,
        args.workflows,
        max(args.runs, args.workflows),
        args.steps,
        args.isolation,
        args.workload,
    )
    result["dbos_version"] = _version()
    result["database"] = harness.redact(database_url)
    print(json.dumps(result))
    return 0


def _version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("dbos")
    except PackageNotFoundError:
        return None


if __name__ == "__main__":
    sys.exit(main())
