"""Per protocol call: SQL statements, server CPU and PostgreSQL CPU, in-process (issue 11).

The run of ``BENCH_FOLD=next`` through the Django test client: ``POST /runs`` (create), claim, the
run's first declaration, then per effect one outcome carrying the step's checkpoint and the next
declaration (the last outcome carries only the checkpoint), finish. For each kind of call: statements
sent (Django's execute wrapper, with their text), the request thread's CPU (``thread_time``) and the
PostgreSQL backend's CPU (``/proc/<backend pid>/stat``: the server must be on this machine). Medians
(PostgreSQL: means, its clock ticks are coarse) over ``CALLS_RUNS`` runs of ``CALLS_EFFECTS``
effects. ``CALLS_SQL=1`` prints each kind's statements; ``CALLS_EXPLAIN=<kind>`` the planning and
execution time of each of its statements (EXPLAIN ANALYZE in a rolled-back savepoint);
``CALLS_PROFILE=<kind>`` a cProfile of it (wall time). ``CALLS_OUT=file.json`` keeps the summary.

Run: .venv/bin/python -m pytest -p tests.conftest bench/protocol_calls.py -q -s
"""

from __future__ import annotations

import cProfile
import json
import os
import pstats
import statistics
import time
from collections import defaultdict

import pytest
from django.db import connection

from tests.conftest import claim, declare, start_run

RUNS = int(os.environ.get("CALLS_RUNS", "6"))
EFFECTS = int(os.environ.get("CALLS_EFFECTS", "20"))
TICK = os.sysconf("SC_CLK_TCK")
EXPLAIN = os.environ.get("CALLS_EXPLAIN", "")
PROFILE = os.environ.get("CALLS_PROFILE", "")  # a kind of call: cProfile it, print the top


def _backend_cpu_ms() -> float:
    with connection.cursor() as cur:
        cur.execute("SELECT pg_backend_pid()")
        pid = cur.fetchone()[0]
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1000 / TICK


class Meter:
    def __init__(self) -> None:
        self.cpu: dict[str, list[float]] = defaultdict(list)
        self.pg: dict[str, list[float]] = defaultdict(list)
        self.statements: dict[str, list[int]] = defaultdict(list)
        self.sql: dict[str, list[str]] = {}
        self.plans: list[tuple[str, float, float, float]] = []
        self.profile = cProfile.Profile()  # wall time: waits on PostgreSQL show up in psycopg

    def call(self, kind: str, fn):
        seen: list[str] = []

        def wrapper(execute, sql, params, many, context):
            seen.append(sql)
            if EXPLAIN and kind == EXPLAIN and not many:
                self.explain(context["cursor"], sql, params)
            return execute(sql, params, many, context)

        pg0 = _backend_cpu_ms()
        t0 = time.thread_time()
        with connection.execute_wrapper(wrapper):
            if PROFILE and kind == PROFILE:
                result = self.profile.runcall(fn)
            else:
                result = fn()
        t1 = time.thread_time()
        pg1 = _backend_cpu_ms()
        self.cpu[kind].append((t1 - t0) * 1000)
        self.pg[kind].append(pg1 - pg0)
        self.statements[kind].append(len(seen))
        self.sql.setdefault(kind, seen)
        return result

    def explain(self, cursor, sql: str, params) -> None:
        """Planning and execution time of ``sql`` by EXPLAIN ANALYZE, in a savepoint rolled back
        before the statement itself runs (``CALLS_EXPLAIN=<kind>``)."""
        if not connection.in_atomic_block or not sql.lstrip().upper().startswith(
            ("SELECT", "WITH", "INSERT", "UPDATE")
        ):
            return
        cursor.execute("SAVEPOINT calls_explain")
        try:
            cursor.execute("EXPLAIN (ANALYZE, SUMMARY, FORMAT JSON) " + sql, params)
            plan = cursor.fetchone()[0][0]
        finally:
            cursor.execute("ROLLBACK TO SAVEPOINT calls_explain")
        triggers = sum(t.get("Time", 0) for t in plan.get("Triggers", []))
        self.plans.append((sql[:90], plan["Planning Time"], plan["Execution Time"], triggers))


def _run(worker, meter: Meter, tag: str) -> None:
    run = meter.call("create", lambda: start_run(worker))
    rid = run["id"]
    token = meter.call("claim", lambda: claim(worker, rid))["lease"]["fencing_token"]
    effect = meter.call("declare", lambda: declare(worker, rid, token, key=f"{tag}-0").json())
    for i in range(EFFECTS):
        body: dict = {
            "fencing_token": token,
            "status": "committed",
            "checkpoint": {"step": f"s{i}", "state": {"i": i}},
        }
        last = i == EFFECTS - 1
        if not last:
            body["next"] = {
                "fencing_token": token,
                "step": "charge",
                "tool": "payments",
                "action": "charge",
                "idempotency_key": f"{tag}-{i + 1}",
                "args": {"amount": 100 + i},
            }
        kind = "outcome+checkpoint" if last else "outcome+checkpoint+next"
        url = f"/effects/{effect['id']}/outcome"
        answer = meter.call(kind, lambda b=body, u=url: worker.post(u, b))
        assert answer.status_code == 200, answer.content
        if not last:
            effect = answer.json()["next"]
            assert effect["http_status"] == 201, effect
    answer = meter.call(
        "finish",
        lambda: worker.post(
            f"/runs/{rid}/finish", {"fencing_token": token, "outcome": "succeeded"}
        ),
    )
    assert answer.status_code == 200, answer.content


@pytest.mark.django_db(transaction=True)
def test_protocol_calls(worker):
    from core import live

    _run(worker, Meter(), "warm")
    meter = Meter()
    for r in range(RUNS):
        _run(worker, meter, f"r{r}")
    getattr(live, "flush", lambda timeout=5.0: None)()
    with connection.cursor() as cur:
        cur.execute(
            "SELECT count(*), sum(generic_plans)::int, sum(custom_plans)::int FROM pg_prepared_statements"
        )
        prepared = cur.fetchone()
    kinds = list(meter.cpu)
    per = {
        k: {
            "statements": statistics.median(meter.statements[k]),
            "server_cpu_ms": round(statistics.median(meter.cpu[k]), 2),
            # the backend's CPU ticks are 10 ms: a mean over many calls, not a median
            "pg_cpu_ms": round(statistics.fmean(meter.pg[k]), 2),
            "calls_per_run": len(meter.cpu[k]) // RUNS,
        }
        for k in kinds
    }
    n = EFFECTS
    per_effect = {
        key: round(sum(per[k][key] * per[k]["calls_per_run"] for k in kinds) / n, 2)
        for key in ("statements", "server_cpu_ms", "pg_cpu_ms")
    }
    summary = {
        "per_call": per,
        "per_effect": per_effect,
        "runs": RUNS,
        "effects": n,
        "load": os.getloadavg(),
        "prepared_statements": {
            "count": prepared[0],
            "generic": prepared[1],
            "custom": prepared[2],
        },
    }
    print("\n" + json.dumps(summary, indent=1))
    if os.environ.get("CALLS_SQL"):
        for k in kinds:
            print(f"\n--- {k}: {len(meter.sql[k])} statements")
            for sql in meter.sql[k]:
                print("  ", sql[:220].replace("\n", " "))
    if EXPLAIN:
        by_sql: dict[str, list[tuple[float, float, float]]] = defaultdict(list)
        for sql, planning, execution, triggers in meter.plans:
            by_sql[sql].append((planning, execution, triggers))
        print(f"\n--- {EXPLAIN}: median planning / execution / triggers ms per statement")
        for sql, times in by_sql.items():
            cols = [statistics.median(t[i] for t in times) for i in range(3)]
            print(f"  {cols[0]:.3f} {cols[1]:.3f} {cols[2]:.3f}  {sql}")
    if PROFILE:
        pstats.Stats(meter.profile).sort_stats(
            os.environ.get("CALLS_SORT", "cumulative")
        ).print_stats(60)
    out = os.environ.get("CALLS_OUT")
    if out:
        with open(out, "w") as fh:
            json.dump(summary, fh, indent=1)
