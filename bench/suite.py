"""`make bench`: every measurement of issue 11 in one invocation, one summary with goals vs measured.

    .venv/bin/python -m bench.suite [--out bench/results/summary.json]     (BENCH_QUICK=1: a smoke run)

In order, on one scratch PostgreSQL database (DATABASE_URL, default controlplane_bench) and its
sibling ``<name>_dbos`` on the same server:

1. raw PostgreSQL single-row INSERT+COMMIT/s over 16 connections (bench/rawpg.py) and the two DBOS
   workloads (bench/dbos_steps.py: 16 concurrent workflows; ``transaction``: one committed row per
   step; ``step``: a plain ``@DBOS.step`` whose output DBOS records) — *before*;
2. 2 API processes (daphne): the protocol phases at 1, 4 and 16 workers (bench/protocol.py: CPU per
   effect of servers, PostgreSQL and client, SQL statements, transactions and rows per effect,
   latencies), the floor (bench/floor.py), then long-poll wake-up while 16 protocol workers run
   (bench/longpoll.py);
3. scale-out: 1 and 4 API processes, the 16-worker phase each (the 2-process point is step 2's);
4. optionally (``--asgi`` or BENCH_ASGI=1) the 16-worker phase on 2 uvicorn and 2 granian processes;
5. raw PostgreSQL and DBOS again — *after* (ratios use the mean of before and after);
6. bench/audit_append.py if it exists (64 concurrent audit writers over 1/2/4 processes);
7. the multi-host phase (bench/multihost.py): 1 and 2 API hosts in network namespaces behind
   HAProxy, effects/s and CPU per effect (``multihost`` in the summary; skipped without ``ip netns``).

Every side commits the same way, set explicitly (``harness.commit_env``: ``BENCH_SYNCHRONOUS_COMMIT``,
default ``on``), never inherited from a test shell's ``DB_SYNCHRONOUS_COMMIT=off``.

Writes ``bench/results/summary.json`` (``goals``: each target of issue 11 with the measured value and
``met``; ``goals_24``: issue 24's, from the same invocation); ``python -m bench.report`` turns it into
the README's table. See bench/README.md.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import multiprocessing as mp
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import floor as floor_bench
from bench import harness, longpoll, protocol
from bench.dbos_steps import dbos_database_url
from bench.rawpg import raw_pg_commits

QUICK = os.environ.get("BENCH_QUICK", "") not in ("", "0")
CONCURRENCY = 16  # the comparison point: workers, DBOS workflows, raw connections

# The goals of issue 11, in its words; `key` names the measured value in the summary.
GOALS: list[dict[str, Any]] = [
    {
        "key": "server_cpu_ms_per_effect",
        "goal": "server CPU per effect",
        "op": "<=",
        "target": 6.0,
        "unit": "ms",
    },
    {
        "key": "postgres_cpu_ms_per_effect",
        "goal": "PostgreSQL CPU per effect",
        "op": "<=",
        "target": 3.0,
        "unit": "ms",
    },
    {
        "key": "statements_per_effect",
        "goal": "SQL statements per effect",
        "op": "<=",
        "target": 12.0,
        "unit": "",
    },
    {
        "key": "effects_per_s_16",
        "goal": "effects/s at 16 workers",
        "op": ">=",
        "target": 150.0,
        "unit": "/s",
    },
    {
        "key": "dbos_ratio",
        "goal": "effects/s ÷ DBOS steps/s (16 each)",
        "op": ">=",
        "target": 0.5,
        "unit": "×",
    },
    {
        "key": "declare_p99_ms_1",
        "goal": "p99 declare at 1 worker",
        "op": "<=",
        "target": 10.0,
        "unit": "ms",
    },
    {
        "key": "longpoll_p99_ms_16",
        "goal": "long-poll wake-up p99 while 16 workers run",
        "op": "<=",
        "target": 100.0,
        "unit": "ms",
    },
    {
        "key": "audit_append_scaling",
        "goal": "audit appends (64 writers): 4 processes ÷ 1 process",
        "op": ">",
        "target": 1.0,
        "unit": "×",
    },
]

# The goals of issue 24 (ahead of DBOS on the same PostgreSQL), each measured in the same invocation.
# The console's at 1,000,000 runs are `make bench-console`'s, not this run's: listed, not measured.
GOALS_24: list[dict[str, Any]] = [
    {
        "key": "dbos_ratio",
        "goal": "effects/s ÷ transactional DBOS steps/s (16 each)",
        "op": ">=",
        "target": 1.2,
        "unit": "×",
    },
    {
        "key": "dbos_step_ratio",
        "goal": "effects/s ÷ plain @DBOS.step steps/s (16 each)",
        "op": ">=",
        "target": 1.0,
        "unit": "×",
    },
    {
        "key": "server_cpu_ms_per_effect",
        "goal": "server CPU per effect",
        "op": "<=",
        "target": 4.0,
        "unit": "ms",
    },
    {
        "key": "postgres_cpu_ms_per_effect",
        "goal": "PostgreSQL CPU per effect",
        "op": "<=",
        "target": 1.5,
        "unit": "ms",
    },
    {
        "key": "total_cpu_ms_per_effect",
        "goal": "total CPU per effect (server + PostgreSQL + SDK client)",
        "op": "<=",
        "target": 5.0,
        "unit": "ms",
    },
    {
        "key": "declare_p99_ms_1",
        "goal": "p99 declare at 1 worker",
        "op": "<=",
        "target": 10.0,
        "unit": "ms",
    },
    {
        "key": "declare_p99_ms_16",
        "goal": "p99 declare at 16 workers",
        "op": "<=",
        "target": 25.0,
        "unit": "ms",
    },
    {
        "key": "longpoll_p99_ms_16",
        "goal": "long-poll wake-up p99 while 16 workers run",
        "op": "<=",
        "target": 50.0,
        "unit": "ms",
    },
    {
        "key": "console_list_p95_ms_1m",
        "goal": "console list p95 at 1,000,000 runs, every depth (make bench-console)",
        "op": "<=",
        "target": 150.0,
        "unit": "ms",
    },
    {
        "key": "console_run_page_p95_ms_1m",
        "goal": "console run page p95 at 1,000,000 runs (make bench-console)",
        "op": "<=",
        "target": 300.0,
        "unit": "ms",
    },
]


def sizes(quick: bool) -> dict[str, Any]:
    """How much of each measurement: the full run takes ~6–8 minutes on the 2-core machine, the quick
    one ~2."""
    if quick:
        return {
            "workers": [1, 4, 16],
            "runs": {1: 3, 4: 8, 16: 16},
            "effects_per_run": protocol.EFFECTS_PER_RUN,
            "scale_out": [1, 2, 4],
            "raw_seconds": 2.0,
            "dbos_runs": 16,
            "dbos_steps": protocol.EFFECTS_PER_RUN,
            "floor_seconds": 0.0,
            "longpoll_samples": 8,
            "longpoll_load": CONCURRENCY,
            "audit_seconds": 2.0,
            "concurrency": CONCURRENCY,
            "phase_budget_s": 12.0,
        }
    return {
        "workers": [1, 4, 16],
        "runs": {1: 12, 4: 24, 16: 32},
        "effects_per_run": protocol.EFFECTS_PER_RUN,
        "scale_out": [1, 2, 4],
        "raw_seconds": 4.0,
        "dbos_runs": 32,
        "dbos_steps": protocol.EFFECTS_PER_RUN,
        "floor_seconds": 4.0,
        "longpoll_samples": 30,
        "longpoll_load": CONCURRENCY,
        "audit_seconds": 5.0,
        "concurrency": CONCURRENCY,
        "phase_budget_s": 40.0,
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.suite", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--out", default=str(harness.RESULTS_DIR / "summary.json"))
    parser.add_argument(
        "--quick", action="store_true", default=QUICK, help="smoke sizes (BENCH_QUICK=1)"
    )
    parser.add_argument(
        "--asgi",
        action="store_true",
        default=os.environ.get("BENCH_ASGI") == "1",
        help="also the 16-worker phase on uvicorn and granian (BENCH_ASGI=1)",
    )
    parser.add_argument(
        "--fresh-db", action="store_true", help="DROP and recreate the benchmark database first"
    )
    parser.add_argument("--no-audit-append", action="store_true", help="skip bench/audit_append.py")
    parser.add_argument("--no-multihost", action="store_true", help="skip bench/multihost.py")
    parser.add_argument(
        "--sizes",
        default=None,
        help="JSON overriding sizes (tests: tiny runs), e.g. '{\"workers\": [1, 2]}'",
    )
    parser.add_argument("--phase-timeout", type=float, default=600.0)
    args = parser.parse_args(argv)
    args.size = sizes(args.quick)
    if args.sizes:
        args.size.update(json.loads(args.sizes))
    args.size["runs"] = {int(k): int(v) for k, v in args.size["runs"].items()}
    return args


# --- pieces --------------------------------------------------------------------------------------


def run_dbos(
    database_url: str, size: dict[str, Any], env: dict[str, str], workload: str = "transaction"
) -> dict[str, Any]:
    """A DBOS workload in its own process (its CPU is its own); an `error` if DBOS cannot run."""
    cmd = [
        harness.python_exe(),
        *("-m", "bench.dbos_steps", "--database-url", dbos_database_url(database_url)),
        *("--workload", workload),
        *("--workflows", str(size["concurrency"]), "--runs", str(size["dbos_runs"])),
        *("--steps", str(size["dbos_steps"])),
    ]
    proc = subprocess.run(
        cmd, cwd=harness.ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if lines:
        try:
            return json.loads(lines[-1])
        except ValueError:
            pass
    return {
        "error": f"bench.dbos_steps exited {proc.returncode}: {(proc.stderr or proc.stdout)[-1500:]}"
    }


def run_audit_append(
    env: dict[str, str], size: dict[str, Any], out_dir: Path
) -> dict[str, Any] | None:
    """bench/audit_append.py (another engineer's) when it exists; None when it does not."""
    if importlib.util.find_spec("bench.audit_append") is None:
        return None
    out = out_dir / "audit_append.json"
    cmd = [
        harness.python_exe(),
        "-m",
        "bench.audit_append",
        "--seconds",
        str(size["audit_seconds"]),
        "--out",
        str(out),
    ]
    started = time.time()
    proc = subprocess.run(
        cmd, cwd=harness.ROOT, env=env, capture_output=True, text=True, timeout=900
    )
    if proc.returncode != 0 or not out.exists() or out.stat().st_mtime < started:
        return {
            "error": f"bench.audit_append exited {proc.returncode}: {(proc.stderr or proc.stdout)[-1500:]}"
        }
    result = json.loads(out.read_text())
    result.pop("machine", None)
    return result


def run_multihost(env: dict[str, str], out_dir: Path) -> dict[str, Any]:
    """bench/multihost.py in its own process (it makes namespaces, needs root; says when skipped)."""
    out = out_dir / "multihost.json"
    proc = subprocess.run(
        [harness.python_exe(), "-m", "bench.multihost", "--out", str(out)],
        cwd=harness.ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if proc.returncode != 0 or not out.exists():
        return {"error": f"bench.multihost exited {proc.returncode}: {proc.stderr[-1500:]}"}
    return json.loads(out.read_text())


def with_servers(
    count: int, env: dict[str, str], kind: str, token: str, ctx, timeout: float, effects: int, body
) -> Any:
    """Start `count` servers of `kind`, warm them up (one unmeasured run per server), call
    body(servers), always stop them."""
    servers = harness.Servers(count, env, kind=kind)
    try:
        servers.start()
        servers.wait_ready()
        print(f"{count} {kind} server(s) ready on {', '.join(servers.urls)}", flush=True)
        protocol.run_phase(ctx, count, count, servers, token, timeout, effects)
        return body(servers)
    except Exception:
        print(servers.log_tail(), file=sys.stderr)
        raise
    finally:
        servers.stop()


def phase(ctx, servers, token, workers: int, args) -> dict[str, Any]:
    runs = args.size["runs"].get(workers) or max(2 * workers, 2)
    print(
        f"phase: {len(servers.urls)} {servers.kind} server(s), {workers} worker(s), {runs} runs "
        f"(no new run after {args.size.get('phase_budget_s')} s) …",
        flush=True,
    )
    out = protocol.run_phase(
        ctx,
        workers,
        runs,
        servers,
        token,
        args.phase_timeout,
        args.size["effects_per_run"],
        budget_s=args.size.get("phase_budget_s"),
    )
    c, q = out["cpu"], out["sql"]
    print(
        f"  {out['effects_per_s']} effects/s · CPU/effect server {c.get('server_cpu_ms_per_effect')} ms, "
        f"PostgreSQL {c.get('postgres_cpu_ms_per_effect')} ms, client {c.get('client_cpu_ms_per_effect')} ms · "
        f"{q.get('statements_per_effect')} statements/effect · declare p99 {out['declare_p99_ms']} ms · "
        f"errors {out['errors']}",
        flush=True,
    )
    return out


def main_servers_block(ctx, env, token, machine, args) -> dict[str, Any]:
    """2 daphne processes: the worker-count phases, the floor, the long-poll under load."""
    size = args.size

    def body(servers: harness.Servers) -> dict[str, Any]:
        phases = {str(w): phase(ctx, servers, token, w, args) for w in size["workers"]}
        floors: dict[str, Any] = {}
        if size["floor_seconds"] > 0:
            for route in floor_bench.ROUTES:
                print(
                    f"floor: {size['concurrency']} workers on {floor_bench.ROUTES[route][1]} …",
                    flush=True,
                )
                floors[route] = floor_bench.run_floor(
                    ctx, size["concurrency"], route, size["floor_seconds"], servers
                )
        print(
            f"long-poll: {size['longpoll_samples']} samples, {size['longpoll_load']} workers alongside …",
            flush=True,
        )
        lp = longpoll.measure(
            ctx, servers, token, env, machine, size["longpoll_samples"], size["longpoll_load"]
        )
        lp.pop("machine", None)
        return {"phases": phases, "floor": floors, "longpoll": lp}

    return with_servers(
        2, env, "daphne", token, ctx, args.phase_timeout, size["effects_per_run"], body
    )


def one_phase_on(ctx, env, token, args, count: int, kind: str) -> dict[str, Any]:
    top = max(args.size["workers"])
    return with_servers(
        count,
        env,
        kind,
        token,
        ctx,
        args.phase_timeout,
        args.size["effects_per_run"],
        lambda servers: phase(ctx, servers, token, top, args),
    )


# --- summary -------------------------------------------------------------------------------------


def _mean(*values: float | None) -> float | None:
    got = [v for v in values if v is not None]
    return round(sum(got) / len(got), 1) if got else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


PER_EFFECT_CPU = (
    "server_cpu_ms_per_effect",
    "postgres_cpu_ms_per_effect",
    "client_cpu_ms_per_effect",
)


def _mean_cpu(runs) -> float | None:
    """A DBOS workload's total CPU per step (its process + its PostgreSQL backends), mean of runs."""
    got = [
        r["cpu"]["dbos_cpu_ms_per_step"] + r["cpu"]["postgres_cpu_ms_per_step"]
        for r in runs
        if "dbos_cpu_ms_per_step" in r.get("cpu", {})
    ]
    return round(sum(got) / len(got), 2) if got else None


def compact_phase(p: dict[str, Any]) -> dict[str, Any]:
    c, q = p["cpu"], p["sql"]
    return {
        "servers": p.get("servers"),
        "workers": p["workers"],
        "effects": p["effects"],
        "effects_per_s": p["effects_per_s"],
        "server_cpu_ms_per_effect": c.get("server_cpu_ms_per_effect"),
        "postgres_cpu_ms_per_effect": c.get("postgres_cpu_ms_per_effect"),
        "client_cpu_ms_per_effect": c.get("client_cpu_ms_per_effect"),
        "statements_per_effect": q.get("statements_per_effect"),
        "transactions_per_effect": q.get("transactions_per_effect"),
        "rows_written_per_effect": q.get("rows_written_per_effect"),
        "declare_p50_ms": p["declare_p50_ms"],
        "declare_p99_ms": p["declare_p99_ms"],
        "outcome_p99_ms": p["outcome_p99_ms"],
        "checkpoint_p99_ms": p["checkpoint_p99_ms"],
        "errors": p["errors"],
        "other_cpu_s": c.get("other_cpu_s"),
        "machine_busy_pct": c.get("machine_busy_pct"),
        "wall_s": p["wall_s"],
    }


def audit_scaling(audit: dict[str, Any] | None) -> float | None:
    if not audit or "per_run_by_processes" not in audit:
        return None
    rates = {int(k): v for k, v in audit["per_run_by_processes"].items()}
    lo, hi = min(rates), max(rates)
    return _ratio(rates[hi], rates[lo]) if hi != lo else None


def goals_table(
    measured: dict[str, Any], goals: list[dict[str, Any]] | None = None
) -> list[dict[str, Any]]:
    rows = []
    for g in GOALS if goals is None else goals:
        value = measured.get(g["key"])
        if value is None:
            met = None
        elif g["op"] == "<=":
            met = value <= g["target"]
        elif g["op"] == ">=":
            met = value >= g["target"]
        else:
            met = value > g["target"]
        rows.append({**g, "measured": value, "met": met})
    return rows


def build_summary(
    args,
    facts: dict[str, Any],
    raw: dict[str, Any],
    dbos: dict[str, Any],
    dbos_step: dict[str, Any],
    main_block: dict[str, Any],
    scale: dict[int, Any],
    asgi: dict[str, Any],
    audit: dict[str, Any] | None,
) -> dict[str, Any]:
    phases = main_block["phases"]
    top = str(max(args.size["workers"]))
    head = phases[top]
    one = phases.get("1")
    raw_rate = _mean(*(r.get("commits_per_s") for r in raw.values()))
    dbos_ok = {k: v for k, v in dbos.items() if "steps_per_s" in v}
    dbos_rate = _mean(*(v["steps_per_s"] for v in dbos_ok.values()))
    step_ok = {k: v for k, v in dbos_step.items() if "steps_per_s" in v}
    step_rate = _mean(*(v["steps_per_s"] for v in step_ok.values()))
    head_cpu = head["cpu"]
    parts = [head_cpu.get(k) for k in PER_EFFECT_CPU]
    total_cpu = round(sum(parts), 2) if all(v is not None for v in parts) else None
    lp = main_block["longpoll"]
    scale_out = {str(k): compact_phase(v) for k, v in sorted(scale.items())}
    measured = {
        "server_cpu_ms_per_effect": head["cpu"].get("server_cpu_ms_per_effect"),
        "postgres_cpu_ms_per_effect": head["cpu"].get("postgres_cpu_ms_per_effect"),
        "client_cpu_ms_per_effect": head["cpu"].get("client_cpu_ms_per_effect"),
        "statements_per_effect": head["sql"].get("statements_per_effect"),
        "transactions_per_effect": head["sql"].get("transactions_per_effect"),
        "rows_written_per_effect": head["sql"].get("rows_written_per_effect"),
        "effects_per_s": {w: p["effects_per_s"] for w, p in phases.items()},
        "effects_per_s_16": head["effects_per_s"],  # at the top worker count (16 unless --sizes)
        "top_workers": int(top),
        "dbos_steps_per_s": dbos_rate,
        "dbos_ratio": _ratio(head["effects_per_s"], dbos_rate),
        "dbos_step_steps_per_s": step_rate,
        "dbos_step_ratio": _ratio(head["effects_per_s"], step_rate),
        "total_cpu_ms_per_effect": total_cpu,
        "dbos_cpu_ms_per_step": _mean_cpu(dbos_ok.values()),
        "dbos_step_cpu_ms_per_step": _mean_cpu(step_ok.values()),
        "declare_p99_ms_16": head["declare_p99_ms"],
        "synchronous_commit": facts.get("synchronous_commit"),
        "raw_pg_commits_per_s": raw_rate,
        "raw_pg_ratio": _ratio(head["effects_per_s"], raw_rate),
        "declare_p99_ms_1": one["declare_p99_ms"] if one else None,
        "longpoll_p99_ms_16": lp.get("wake_p99_ms"),
        "longpoll_load_workers": lp.get("config", {}).get("load_workers"),
        "audit_append_scaling": audit_scaling(audit),
        "scale_out_effects_per_s": {k: v["effects_per_s"] for k, v in scale_out.items()},
        "scale_out_server_cpu_ms_per_effect": {
            k: v["server_cpu_ms_per_effect"] for k, v in scale_out.items()
        },
    }
    if one:
        measured["declare_p99_ms_1"] = one["declare_p99_ms"]
    return {
        "benchmark": "summary",
        "issue": 11,
        "quick": args.quick,
        "started_at": facts["started_at"],
        "finished_at": datetime.now(UTC).isoformat(),
        "duration_s": round(time.monotonic() - facts["t0"], 1),
        "timings_s": facts.get("timings_s"),
        "git_commit": facts["git_commit"],
        "machine": facts["machine"],
        "sizes": {
            k: ({str(w): n for w, n in v.items()} if isinstance(v, dict) else v)
            for k, v in args.size.items()
        },
        "goals": goals_table(measured),
        "goals_24": goals_table(measured, GOALS_24),
        "measured": measured,
        "protocol": {
            "servers": 2,
            "server": "daphne, controlplane.asgi:application (bench.settings: + floor and /bench/stats/ routes, "
            "SQL statement counter), DEBUG=0",
            "per_effect": "declare + outcome(committed) + checkpoint, plus 1/effects_per_run of create, claim, finish",
            "phases": {w: compact_phase(p) for w, p in phases.items()},
            "statements_note": "statements = psycopg cursor execute calls in the API processes (bench/sqlcount.py; "
            "a PL/pgSQL function call counts once; implicit BEGIN/COMMIT not counted); transactions and rows "
            "written from pg_stat_database (approximate at the phase edges)",
        },
        "scale_out": {
            "workers": int(top),
            "note": "same database, same machine: API processes share the 2 cores with PostgreSQL and the "
            "load generator; the 2-process point is the protocol phase above",
            "processes": scale_out,
        },
        "dbos": {
            "runs": dbos,
            "steps_per_s": dbos_rate,
            "workload": f"{args.size['concurrency']} concurrent DBOS workflows (threads, in-process) sharing "
            f"{args.size['dbos_runs']} workflows of {args.size['dbos_steps']} steps; each step a "
            "SQLAlchemyDatasource.transaction inserting one row (+ DBOS's step record, same commit)",
        },
        "dbos_step": {
            "runs": dbos_step,
            "steps_per_s": step_rate,
            "workload": f"{args.size['concurrency']} concurrent DBOS workflows (threads, in-process) sharing "
            f"{args.size['dbos_runs']} workflows of {args.size['dbos_steps']} steps; each step a plain "
            "@DBOS.step returning a small document, which DBOS records in its system database",
        },
        "raw_pg": {"connections": args.size["concurrency"], "runs": raw, "commits_per_s": raw_rate},
        "longpoll": lp,
        "floor": main_block["floor"],
        "asgi_servers": asgi,
        "audit_append": audit,
        "full_phases": phases,
    }


def print_summary(summary: dict[str, Any], out: Path) -> None:
    print()
    print(
        f"bench summary ({'quick' if summary['quick'] else 'full'}, {summary['duration_s']:.0f} s, "
        f"commit {summary['git_commit']})"
    )
    for title, goals in (("issue 11", summary["goals"]), ("issue 24", summary["goals_24"])):
        print(f" {title}:")
        for g in goals:
            verdict = {True: "met", False: "NOT met", None: "not measured"}[g["met"]]
            print(
                f"  {g['goal']:<58} {g['op']} {g['target']:<6} measured {g['measured']!s:<8} {verdict}"
            )
    m = summary["measured"]
    print(
        f"  effects/s by workers {m['effects_per_s']}; by API processes {m['scale_out_effects_per_s']}"
    )
    print(
        f"  DBOS {m['dbos_steps_per_s']} (transaction) / {m['dbos_step_steps_per_s']} (plain step) "
        f"steps/s; raw PostgreSQL {m['raw_pg_commits_per_s']} commits/s "
        f"(ratio {m['raw_pg_ratio']})"
    )
    print(f"wrote {out}")


@contextmanager
def timed(timings: dict[str, float], name: str) -> Iterator[None]:
    t0 = time.monotonic()
    try:
        yield
    finally:
        timings[name] = round(time.monotonic() - t0, 1)


def baselines(
    ctx, database_url, size, env, when: str, raw: dict, dbos: dict, dbos_step: dict
) -> None:
    """Raw PostgreSQL commits/s and both DBOS workloads' steps/s, each at 16; run before and after
    the protocol."""
    print(
        f"raw PostgreSQL INSERT+COMMIT over {size['concurrency']} connections ({when}) …",
        flush=True,
    )
    raw[when] = raw_pg_commits(
        ctx, database_url, size["raw_seconds"], connections=size["concurrency"]
    )
    print(f"  {raw[when]['commits_per_s']} commits/s", flush=True)
    for workload, into in (("transaction", dbos), ("step", dbos_step)):
        print(
            f"DBOS ({workload}): {size['concurrency']} concurrent workflows ({when}) …", flush=True
        )
        into[when] = got = run_dbos(database_url, size, env, workload)
        print(f"  {got.get('steps_per_s', got.get('error', '')[:300])} steps/s", flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    database_url, redis_url = harness.service_urls("bench.suite")
    harness.install_sigterm_as_interrupt()
    ctx = mp.get_context("spawn")
    env = harness.bench_env(database_url, redis_url)
    env["DJANGO_SETTINGS_MODULE"] = "bench.settings"
    facts: dict[str, Any] = {
        "synchronous_commit": env["DB_SYNCHRONOUS_COMMIT"],
        "started_at": datetime.now(UTC).isoformat(),
        "t0": time.monotonic(),
        "git_commit": harness.git_commit(),
    }
    size = args.size
    print(
        f"bench suite ({'quick' if args.quick else 'full'}) on {harness.redact(database_url)} …",
        flush=True,
    )
    harness.ensure_database(database_url, fresh=args.fresh_db)
    token, prefix = harness.prepare(env, f"bench-suite-{int(time.time())}")
    facts["machine"] = harness.machine_info(database_url)
    raw: dict[str, Any] = {}
    dbos: dict[str, Any] = {}
    dbos_step: dict[str, Any] = {}
    scale: dict[int, Any] = {}
    asgi: dict[str, Any] = {}
    top = max(size["workers"])
    timings = facts["timings_s"] = {"prepare": round(time.monotonic() - facts["t0"], 1)}
    try:
        with timed(timings, "baselines_before"):
            baselines(ctx, database_url, size, env, "before", raw, dbos, dbos_step)
        with timed(timings, "protocol_floor_longpoll"):
            main_block = main_servers_block(ctx, env, token, facts["machine"], args)
        with timed(timings, "scale_out"):
            for count in size["scale_out"]:
                scale[count] = (
                    main_block["phases"][str(top)]
                    if count == 2
                    else one_phase_on(ctx, env, token, args, count, "daphne")
                )
        if args.asgi:
            with timed(timings, "asgi_servers"):
                asgi["daphne"] = compact_phase(main_block["phases"][str(top)])
                for kind in ("uvicorn", "granian"):
                    asgi[kind] = compact_phase(one_phase_on(ctx, env, token, args, 2, kind))
        with timed(timings, "baselines_after"):
            baselines(ctx, database_url, size, env, "after", raw, dbos, dbos_step)
    except KeyboardInterrupt:
        print("\ninterrupted: servers and workers stopped", file=sys.stderr)
        return 130
    finally:
        harness.revoke_token(env, prefix)
    audit = None
    if not args.no_audit_append:
        print("audit append (bench/audit_append.py) …", flush=True)
        with timed(timings, "audit_append"):
            audit = run_audit_append(env, size, Path(args.out).parent)
        if audit is None:
            print("  bench/audit_append.py not present: skipped", flush=True)
    summary = build_summary(args, facts, raw, dbos, dbos_step, main_block, scale, asgi, audit)
    if not args.no_multihost:
        print(
            "multi-host (bench/multihost.py: 1 and 2 API hosts in network namespaces) …", flush=True
        )
        with timed(timings, "multihost"):
            summary["multihost"] = run_multihost(env, Path(args.out).parent)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=2) + "\n")
    print_summary(summary, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
