"""Worker-protocol throughput and latency through the HTTP API on PostgreSQL (issue 2, "Benchmark").

    .venv/bin/python -m bench.protocol [--workers 1,4,16] [--runs-per-worker N] [--servers K]
                                       [--out bench/results/protocol.json]

For each worker count W, W separate processes (own httpx.Client each) start together from a barrier and
each drives runs of 20 effects: POST /runs, claim, then per step declare the effect, record its outcome
(committed) and write a checkpoint, then finish. Every effect is therefore two durable ledger writes
(declare + outcome, each with a history row and an audit event) plus a checkpoint. We time every call
and the phase's wall clock (barrier → last worker done): effects/s = committed effects / wall time,
including the create/claim/finish calls of each run.

In the same invocation we measure PostgreSQL's raw single-row INSERT+COMMIT rate over 4 connections
(psycopg 3, a scratch table), before and after the phases, and report effects/s ÷ raw commits/s.
See bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import signal
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import floor as floor_bench
from bench import harness
from bench.rawpg import RAW_CONNECTIONS, RAW_TABLE, raw_pg_commits

EFFECTS_PER_RUN = 20
TARGET_EFFECTS_PER_S = 400
TARGET_DECLARE_P99_MS = 25.0
TARGET_WORKERS = 16
CALLS = ("create", "claim", "declare", "outcome", "checkpoint", "finish", "heartbeat")
HEARTBEAT_EVERY_S = 10.0  # leases last 30 s by default; long phases keep theirs alive
# BENCH_FOLD: how many calls an effect takes. none: declare, outcome, checkpoint (3); checkpoint:
# the outcome carries the step's checkpoint (2); next: it also carries the next declaration (1 after
# the run's first). The default is what the SDK does (fx.checkpoint + fx.then, sdk/README.md).
FOLDS = {
    "none": ["declare", "outcome(committed)", "checkpoint"],
    "checkpoint": ["declare", "outcome(committed, checkpoint)"],
    "next": ["outcome(committed, checkpoint, next declaration); the run's first declare"],
}
DEFAULT_FOLD = "next"


def bench_fold() -> str:
    fold = os.environ.get("BENCH_FOLD", DEFAULT_FOLD)
    if fold not in FOLDS:
        raise SystemExit(f"BENCH_FOLD must be one of {', '.join(FOLDS)}, not {fold!r}")
    return fold


def calls_per_effect(fold: str) -> float:
    """Calls per effect, with a 20th of the run's create, claim and finish."""
    per_run = {"none": 3 * EFFECTS_PER_RUN, "checkpoint": 2 * EFFECTS_PER_RUN}.get(
        fold, EFFECTS_PER_RUN + 1
    )
    return round((per_run + 3) / EFFECTS_PER_RUN, 2)


# --- one worker process ------------------------------------------------------------------------


class CallFailed(Exception):
    pass


def _post(
    client, lat: dict[str, list[float]], name: str, url: str, body: dict, ok=(200, 201)
) -> dict:
    t0 = time.perf_counter()
    resp = client.post(url, json=body)
    lat[name].append((time.perf_counter() - t0) * 1000)
    if resp.status_code not in ok:
        raise CallFailed(f"{name} -> {harness.describe_failure(resp)}")
    return resp.json()


def _one_run(
    client,
    base: str,
    lat: dict[str, list[float]],
    worker: int,
    number: int,
    effects: int,
    tally: dict[str, int],
) -> None:
    """Create, claim, `effects` × (declare, outcome committed, checkpoint), finish. Counts committed
    effects in `tally` as they happen, so a run that fails half-way still counts what it committed."""
    run = _post(
        client,
        lat,
        "create",
        f"{base}/runs",
        {
            "agent": harness.AGENT,
            "goal": "protocol benchmark",
            "input": {"worker": worker, "run": number},
            "versions": {
                "code": "bench",
                "model": "none",
                "tools": {"bench": "1"},
                "config_hash": "bench",
            },
            "authority": [{"scope": s, "ttl_s": 3600} for s in harness.SCOPES],
        },
        ok=(201,),
    )
    run_id = run["id"]
    claim = _post(
        client, lat, "claim", f"{base}/runs/{run_id}/claim", {"worker": f"bench-{worker}"}
    )
    token, lease_id = claim["lease"]["fencing_token"], claim["lease"]["id"]
    last_beat = time.monotonic()
    fold = bench_fold()

    def declaration(i: int) -> dict:
        return {
            "fencing_token": token,
            "step": f"step-{i}",
            "tool": "bench",
            "action": "write",
            "idempotency_key": f"{run_id}:step-{i}",
            "args": {"i": i, "worker": worker},
            "compensation": {"tool": "bench", "action": "undo"},
            "irreversible": False,
        }

    def authorized(effect: dict, call: str) -> dict:
        if effect.get("decision") != "authorized":
            raise CallFailed(f"{call} -> decision {effect.get('decision')}: {effect.get('reason')}")
        return effect

    effect = None
    for i in range(effects):
        if time.monotonic() - last_beat > HEARTBEAT_EVERY_S:
            _post(
                client,
                lat,
                "heartbeat",
                f"{base}/leases/{lease_id}/heartbeat",
                {"fencing_token": token},
            )
            last_beat = time.monotonic()
        if effect is None:
            declared = _post(
                client, lat, "declare", f"{base}/runs/{run_id}/effects", declaration(i), ok=(201,)
            )
            effect = authorized(declared, "declare")
        outcome: dict = {
            "fencing_token": token,
            "status": "committed",
            "external_ref": f"bench-{i}",
        }
        checkpoint = {"step": f"step-{i}", "state": {"done": i + 1}}
        if fold == "none":
            _post(client, lat, "outcome", f"{base}/effects/{effect['id']}/outcome", outcome)
            tally["effects"] += 1
            _post(
                client,
                lat,
                "checkpoint",
                f"{base}/runs/{run_id}/checkpoints",
                {"fencing_token": token, **checkpoint},
                ok=(201,),
            )
            effect = None
            continue
        outcome["checkpoint"] = checkpoint
        if fold == "next" and i + 1 < effects:
            outcome["next"] = declaration(i + 1)
        answer = _post(client, lat, "outcome", f"{base}/effects/{effect['id']}/outcome", outcome)
        tally["effects"] += 1
        if "error" in (answer.get("checkpoint") or {"error": "missing"}):
            raise CallFailed(f"outcome -> checkpoint {answer.get('checkpoint')}")
        effect = authorized(answer["next"], "next") if "next" in outcome else None
    _post(
        client,
        lat,
        "finish",
        f"{base}/runs/{run_id}/finish",
        {"fencing_token": token, "outcome": "succeeded"},
    )


def _take_run(counter, total: int) -> int | None:
    """The next run number of the phase's shared pool, or None when all `total` runs are taken."""
    with counter.get_lock():
        number = counter.value
        if number >= total:
            return None
        counter.value = number + 1
        return number


def worker_main(
    index: int,
    servers: list[str],
    token: str,
    counter,
    total_runs: int,
    effects: int,
    barrier,
    results,
    stop=None,
    budget_s: float | None = None,
) -> None:
    """Takes runs from the shared pool until it is empty (or, with counter=None, runs until `stop` is set)
    and puts its measurements on `results`. A shared pool keeps every worker busy until the phase ends.
    With `budget_s`, no new run is taken once that long has passed since the barrier (a loaded machine
    then shortens the phase instead of stretching the whole benchmark)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and terminates us
    import httpx

    lat: dict[str, list[float]] = {name: [] for name in CALLS}
    errors: list[str] = []
    error_count = 0
    tally = {"effects": 0}
    done_runs = 0
    client = httpx.Client(headers={"Authorization": f"Bearer {token}"}, timeout=60.0)
    try:
        for url in servers:  # open a keep-alive connection to every server before the clock starts
            client.get(f"{url}/api/v1/runs", params={"limit": 1})
        barrier.wait()
        t_start, cpu0 = time.monotonic(), time.process_time()
        number = 0
        while True:
            if budget_s is not None and time.monotonic() - t_start > budget_s:
                break
            if counter is not None:
                taken = _take_run(counter, total_runs)
                if taken is None:
                    break
                number = taken
            elif stop.is_set():
                break
            base = servers[(index + number) % len(servers)] + "/api/v1"
            try:
                _one_run(client, base, lat, index, number, effects, tally)
                done_runs += 1
            except (CallFailed, httpx.HTTPError, ValueError, KeyError) as exc:
                error_count += 1
                if len(errors) < 5:
                    errors.append(f"{type(exc).__name__}: {exc}"[:400])
            if counter is None:
                number += 1
        t_end, cpu = time.monotonic(), time.process_time() - cpu0
        results.put(
            {
                "index": index,
                "t_start": t_start,
                "t_end": t_end,
                "cpu_s": cpu,
                "effects": tally["effects"],
                "runs": done_runs,
                "errors": error_count,
                "error_samples": errors,
                "lat": lat,
            }
        )
    except Exception as exc:
        results.put({"index": index, "fatal": f"{type(exc).__name__}: {exc}"[:1000]})
    finally:
        client.close()


# --- phases ----------------------------------------------------------------------------------------


def run_phase(
    ctx,
    workers: int,
    total_runs: int,
    servers: harness.Servers,
    token: str,
    timeout: float,
    effects_per_run: int = EFFECTS_PER_RUN,
    budget_s: float | None = None,
) -> dict[str, Any]:
    """`workers` processes share a pool of `total_runs` runs (taking none after `budget_s`); wall time
    runs from the common barrier to the last worker finishing."""
    counter = ctx.Value("i", 0)
    reports, cpu = harness.run_workers(
        ctx,
        servers,
        workers,
        worker_main,
        lambda i: (i, servers.urls, token, counter, total_runs, effects_per_run),
        timeout,
        "phase",
        kwargs={"budget_s": budget_s} if budget_s else None,
    )
    out = summarise(workers, total_runs, reports, dict(cpu))
    out["servers"] = len(servers.urls)
    out["budget_s"] = budget_s
    return out


def summarise(workers: int, total_runs: int, reports: list[dict], cpu: dict) -> dict[str, Any]:
    lat = {name: [v for r in reports for v in r["lat"][name]] for name in CALLS}
    wall = max(r["t_end"] for r in reports) - min(r["t_start"] for r in reports)
    effects = sum(r["effects"] for r in reports)
    requests = sum(len(v) for v in lat.values())
    worker_cpu = sum(r["cpu_s"] for r in reports)
    per_worker = [r["runs"] for r in reports]
    out: dict[str, Any] = {
        "workers": workers,
        "runs": total_runs,
        "runs_completed": sum(per_worker),
        "runs_per_worker_min_max": [min(per_worker), max(per_worker)],
        "effects": effects,
        "wall_s": round(wall, 3),
        "effects_per_s": round(effects / wall, 1) if wall > 0 else 0.0,
        "requests": requests,
        "requests_per_s": round(requests / wall, 1) if wall > 0 else 0.0,
    }
    for name in ("declare", "outcome", "checkpoint"):
        out[f"{name}_p50_ms"] = harness.percentile(lat[name], 50)
        out[f"{name}_p99_ms"] = harness.percentile(lat[name], 99)
        out[f"{name}_max_ms"] = round(max(lat[name]), 2) if lat[name] else None
    for name in ("create", "claim", "finish"):
        out[f"{name}_p50_ms"] = harness.percentile(lat[name], 50)
        out[f"{name}_p99_ms"] = harness.percentile(lat[name], 99)
    out["heartbeats"] = len(lat["heartbeat"])
    out["errors"] = sum(r["errors"] for r in reports)
    out["error_samples"] = [e for r in reports for e in r["error_samples"]][:5]
    cpu = dict(cpu)
    statements, db = cpu.pop("statements", None), cpu.pop("db", None)
    busy_s = cpu.pop("machine_busy_s", None)
    cpu["workers_cpu_s"] = round(worker_cpu, 2)
    if busy_s is not None:
        # Anything else on the machine (other sessions, the OS) competing for the same cores.
        cpu["other_cpu_s"] = round(
            max(busy_s - cpu["servers_cpu_s"] - cpu["postgres_cpu_s"] - worker_cpu, 0.0), 2
        )
    if effects:
        cpu["server_cpu_ms_per_effect"] = round(1000 * cpu["servers_cpu_s"] / effects, 2)
        cpu["postgres_cpu_ms_per_effect"] = round(1000 * cpu["postgres_cpu_s"] / effects, 2)
        cpu["client_cpu_ms_per_effect"] = round(1000 * worker_cpu / effects, 2)
    out["cpu"] = cpu
    out["sql"] = sql_per_effect(statements, db, effects)
    return out


def sql_per_effect(
    statements: int | None, db: dict[str, int] | None, effects: int
) -> dict[str, Any]:
    """Statements the servers sent (exact, bench/sqlcount.py), and transactions and rows written from
    pg_stat_database (approximate at the window's edges), each per committed effect. Per effect means
    declare + outcome + checkpoint plus a 20th of the run's create, claim and finish."""
    out: dict[str, Any] = {"statements": statements, "db": db}
    if not effects:
        return out
    if statements is not None:
        out["statements_per_effect"] = round(statements / effects, 2)
    if db:
        out["transactions_per_effect"] = round(
            (db["xact_commit"] + db["xact_rollback"]) / effects, 2
        )
        out["rows_written_per_effect"] = round(
            (db["tup_inserted"] + db["tup_updated"] + db["tup_deleted"]) / effects, 2
        )
    return out


# --- main ----------------------------------------------------------------------------------------------


def phase_runs(workers: int, args: argparse.Namespace) -> int:
    """Runs in a phase: --runs-per-worker × workers if given, else --runs-per-phase (at least 2 per worker)."""
    if args.runs_per_worker:
        return args.runs_per_worker * workers
    return max(args.runs_per_phase, 2 * workers)


def effect_rows(database_url: str) -> int | None:
    import psycopg

    try:
        with psycopg.connect(database_url, autocommit=True) as conn:
            return harness.scalar(
                conn, "SELECT count(*) FROM runs_effect WHERE status = 'committed'"
            )
    except psycopg.Error:
        return None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.protocol", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--workers", default="1,4,16", help="comma-separated worker-process counts (default 1,4,16)"
    )
    parser.add_argument(
        "--runs-per-worker",
        type=int,
        default=None,
        help="runs (of 20 effects) per worker process, i.e. a phase does N × workers runs",
    )
    parser.add_argument(
        "--runs-per-phase",
        type=int,
        default=32,
        help="runs per phase when --runs-per-worker is not given (default 32 = 640 effects; "
        "at least 2 per worker)",
    )
    parser.add_argument("--servers", type=int, default=2, help="ASGI server processes (default 2)")
    parser.add_argument(
        "--raw-seconds", type=float, default=4.0, help="duration of each raw PostgreSQL measurement"
    )
    parser.add_argument(
        "--fresh-db",
        action="store_true",
        help="DROP and recreate the benchmark database first (e.g. after migrations were rewritten)",
    )
    parser.add_argument("--out", default=str(harness.RESULTS_DIR / "protocol.json"))
    parser.add_argument("--phase-timeout", type=float, default=600.0)
    parser.add_argument(
        "--floor-seconds",
        type=float,
        default=5.0,
        help="duration of each floor measurement (no-work endpoints, bench/floor.py); 0 skips it",
    )
    args = parser.parse_args(argv)
    try:
        args.worker_counts = [int(w) for w in args.workers.split(",") if w.strip()]
    except ValueError:
        parser.error("--workers must be comma-separated integers")
    if not args.worker_counts or min(args.worker_counts) < 1 or args.servers < 1:
        parser.error("--workers and --servers must be positive")
    return args


def run_phases(
    ctx, args: argparse.Namespace, env: dict[str, str], token: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Start the servers, warm up, run one phase per worker count, then the floor measurements;
    always stop the servers."""
    servers = harness.Servers(args.servers, env)
    phases: dict[str, Any] = {}
    floors: dict[str, Any] = {}
    try:
        servers.start()
        servers.wait_ready()
        print(f"{args.servers} daphne server(s) ready on {', '.join(servers.urls)}", flush=True)
        # Warm-up (not measured): imports, connection pools, the LISTEN connection, first query plans.
        run_phase(ctx, args.servers, args.servers, servers, token, args.phase_timeout)
        for workers in args.worker_counts:
            runs = phase_runs(workers, args)
            print(
                f"phase: {workers} worker(s) sharing {runs} runs × {EFFECTS_PER_RUN} effects …",
                flush=True,
            )
            phase = phases[str(workers)] = run_phase(
                ctx, workers, runs, servers, token, args.phase_timeout
            )
            print(
                f"  {phase['effects_per_s']:.0f} effects/s · declare p50 {phase['declare_p50_ms']} / "
                f"p99 {phase['declare_p99_ms']} ms · outcome p50 {phase['outcome_p50_ms']} / p99 "
                f"{phase['outcome_p99_ms']} ms · errors {phase['errors']}",
                flush=True,
            )
            if phase["errors"] and not servers.keep_logs:
                servers.keep_logs = True  # the servers' tracebacks explain the failed calls
                print(f"  server logs kept in {servers.logdir}", flush=True)
        if args.floor_seconds > 0:
            workers = (
                TARGET_WORKERS if TARGET_WORKERS in args.worker_counts else max(args.worker_counts)
            )
            for route in floor_bench.ROUTES:
                print(
                    f"floor: {workers} worker(s) calling {floor_bench.ROUTES[route][1]} for "
                    f"{args.floor_seconds:.0f}s …",
                    flush=True,
                )
                floors[route] = floor_bench.run_floor(
                    ctx, workers, route, args.floor_seconds, servers
                )
                print(
                    f"  {floors[route]['requests_per_s']:.0f} requests/s · p50 {floors[route]['p50_ms']} / "
                    f"p99 {floors[route]['p99_ms']} ms",
                    flush=True,
                )
    except KeyboardInterrupt:
        raise
    except Exception:
        print(servers.log_tail(), file=sys.stderr)
        raise
    finally:
        servers.stop()
    return phases, floors


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    database_url, redis_url = harness.service_urls("bench.protocol")
    harness.install_sigterm_as_interrupt()
    ctx = mp.get_context("spawn")
    env = harness.bench_env(database_url, redis_url)
    env["DJANGO_SETTINGS_MODULE"] = "bench.settings"  # the product's settings plus the floor routes
    facts: dict[str, Any] = {"started_at": datetime.now(UTC).isoformat()}

    print(f"preparing {harness.redact(database_url)} …", flush=True)
    facts["database_created"] = harness.ensure_database(database_url, fresh=args.fresh_db)
    token, prefix = harness.prepare(env, f"bench-protocol-{int(time.time())}")
    facts["machine"] = harness.machine_info(database_url)
    rows_before = effect_rows(database_url)
    try:
        print(
            f"raw PostgreSQL INSERT+COMMIT over {RAW_CONNECTIONS} connections ({args.raw_seconds:.0f}s) …",
            flush=True,
        )
        raw = {
            "before": raw_pg_commits(ctx, database_url, args.raw_seconds),
            "single_connection": raw_pg_commits(
                ctx, database_url, min(args.raw_seconds, 3.0), connections=1
            ),
        }
        print(
            f"  {raw['before']['commits_per_s']:.0f} commits/s; {raw['single_connection']['commits_per_s']:.0f} "
            "on a single connection",
            flush=True,
        )
        phases, floors = run_phases(ctx, args, env, token)
        print(f"raw PostgreSQL again ({args.raw_seconds:.0f}s) …", flush=True)
        raw["after"] = raw_pg_commits(ctx, database_url, args.raw_seconds)
        print(f"  {raw['after']['commits_per_s']:.0f} commits/s", flush=True)
    except KeyboardInterrupt:
        print("\ninterrupted: servers and workers stopped", file=sys.stderr)
        return 130
    finally:
        harness.revoke_token(env, prefix)
    rows_after = effect_rows(database_url)
    facts["committed_effect_rows_added"] = (
        (rows_after - rows_before) if rows_before is not None and rows_after is not None else None
    )
    result = build_result(args, database_url, redis_url, facts, phases, raw, floors)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print_summary(result, out)
    return 0


def _target(
    headline: dict[str, Any], key: str, target: float, higher_is_better: bool
) -> dict[str, Any]:
    value = headline[key]
    met = value is not None and (value >= target if higher_is_better else value <= target)
    return {"workers": headline["workers"], "target": target, "value": value, "met": met}


def build_result(
    args: argparse.Namespace,
    database_url: str,
    redis_url: str,
    facts: dict[str, Any],
    phases: dict[str, Any],
    raw: dict[str, Any],
    floors: dict[str, Any],
) -> dict[str, Any]:
    raw_rate = round((raw["before"]["commits_per_s"] + raw["after"]["commits_per_s"]) / 2, 1)
    headline = phases.get(str(TARGET_WORKERS)) or phases[str(max(args.worker_counts))]
    return {
        "benchmark": "protocol",
        "started_at": facts["started_at"],
        "finished_at": datetime.now(UTC).isoformat(),
        "git_commit": harness.git_commit(),
        "machine": facts["machine"],
        "config": {
            "workers": args.worker_counts,
            "runs_per_phase": {str(w): phase_runs(w, args) for w in args.worker_counts},
            "work_distribution": "each phase's runs are a shared pool the worker processes draw from",
            "effects_per_run": EFFECTS_PER_RUN,
            "fold": bench_fold(),
            "calls_per_effect": FOLDS[bench_fold()],
            "calls_per_run": ["create", "claim", "finish"],
            "servers": args.servers,
            "server": "daphne (controlplane.asgi:application, settings bench.settings = controlplane.settings "
            "plus the floor routes), DEBUG=0",
            "client": "one httpx.Client per worker process, keep-alive; runs alternate between servers",
            "database_url": harness.redact(database_url),
            "database_created": facts["database_created"],
            "redis_url": harness.redact(redis_url),
            "raw_pg": {
                "connections": RAW_CONNECTIONS,
                "seconds": args.raw_seconds,
                "statement": f"INSERT INTO {RAW_TABLE} (worker, payload) VALUES (…); COMMIT",
            },
        },
        "phases": phases,
        "raw_pg_commits_per_s": raw_rate,
        "raw_pg": raw,
        "ratio": round(headline["effects_per_s"] / raw_rate, 3) if raw_rate else None,
        "ratio_note": f"effects/s at {headline['workers']} workers ÷ raw single-row INSERT+COMMIT/s over "
        f"{RAW_CONNECTIONS} connections (mean of before and after)",
        "ratios": {w: round(p["effects_per_s"] / raw_rate, 3) for w, p in phases.items()}
        if raw_rate
        else {},
        "committed_effect_rows_added": facts["committed_effect_rows_added"],
        "targets": {
            "effects_per_s": _target(
                headline, "effects_per_s", TARGET_EFFECTS_PER_S, higher_is_better=True
            ),
            "declare_p99_ms": _target(
                headline, "declare_p99_ms", TARGET_DECLARE_P99_MS, higher_is_better=False
            ),
        },
        "reference": {
            "raw_pg_commits_per_s_reported_in_issue": 5700,
            "dbos_steps_per_s_in_process": 330,
        },
        "floor": floors,
        "ceiling": floor_bench.ceiling(
            floors["ninja_echo"],
            calls_per_effect(bench_fold()),
            TARGET_EFFECTS_PER_S,
            TARGET_DECLARE_P99_MS,
            facts["machine"].get("cpu_count"),
        )
        if "ninja_echo" in floors
        else None,
    }


def print_summary(result: dict[str, Any], out: Path) -> None:
    m = result["machine"]
    print()
    print(
        f"protocol benchmark — {m['cpu_count']} CPUs, Python {m['python']}, PostgreSQL {m['postgres']['version']}, "
        f"{result['config']['servers']} server(s)"
    )
    print(
        f"{'workers':>7} {'effects/s':>10} {'declare p50/p99 ms':>19} {'outcome p50/p99 ms':>19} "
        f"{'checkpoint p50 ms':>18} {'errors':>7}"
    )
    for w, p in result["phases"].items():
        print(
            f"{w:>7} {p['effects_per_s']:>10.1f} {p['declare_p50_ms']:>9}/{p['declare_p99_ms']:<9} "
            f"{p['outcome_p50_ms']:>9}/{p['outcome_p99_ms']:<9} {str(p['checkpoint_p50_ms']):>18} {p['errors']:>7}"
        )
    print(
        f"raw PostgreSQL: {result['raw_pg_commits_per_s']:.0f} INSERT+COMMIT/s over {RAW_CONNECTIONS} connections; "
        f"ratio {result['ratio']}"
    )
    for w, p in result["phases"].items():
        if p["errors"]:
            print(f"{w} workers: {p['errors']} failed run(s), e.g. {p['error_samples'][0]}")
        other = p["cpu"].get("other_cpu_s")
        if other and other > 0.2 * p["wall_s"] * (m["cpu_count"] or 1):
            print(
                f"{w} workers: note — other processes used {other:.1f} CPU-s of the {p['wall_s']:.1f} s phase "
                f"(machine {p['cpu']['machine_busy_pct']}% busy): numbers are depressed by competing load"
            )
    for name, f in result["floor"].items():
        print(
            f"floor {name} ({f['route']}, {f['workers']} workers): {f['requests_per_s']:.0f} requests/s, "
            f"p50 {f['p50_ms']} / p99 {f['p99_ms']} ms, "
            f"{f['cpu']['server_cpu_ms_per_request']} ms server CPU per request"
        )
    if result["ceiling"]:
        print(f"ceiling: {result['ceiling']['note']}")
        b = result["ceiling"]["cpu_budget_at_target"]
        print(
            f"CPU budget at the target ({b['requests_per_s_needed']} requests/s): the worker processes' client alone "
            f"needs {b['client_cores_needed']} cores and no-work server calls {b['noop_server_cores_needed']} more, "
            f"of {b['cores_available']}"
        )
    for name, t in result["targets"].items():
        print(
            f"target {name} at {t['workers']} workers: {t['value']} vs {t['target']} → "
            f"{'met' if t['met'] else 'NOT met'}"
        )
    print(f"wrote {out}")


if __name__ == "__main__":
    sys.exit(main())
