"""Heartbeat long-poll wake-up latency (issue 2: "returns within 100 ms of a directive change").

    .venv/bin/python -m bench.longpoll [--samples 30] [--servers 2] [--wait-s 20] [--load W]
                                       [--out bench/results/longpoll.json]

Per sample: create and claim a run over HTTP, then a thread long-polls
``POST /leases/{id}/heartbeat {"wait_s": 20}``. Once its first beat has committed (the server subscribed
to the run before that beat, so it is listening), this process changes the run's
directive through the service layer -- ``runs.services.records.request_approval`` with the run's fencing token
(the worker asking for a planned approval from a second connection), which moves the run to
awaiting_approval (directive ``wait``) and sends ``pg_notify`` in the same transaction. Wake-up latency =
heartbeat response received − the service call returned (i.e. the change was committed), on the one
monotonic clock of this machine. With ``--load W`` W protocol workers (bench.protocol's) run alongside.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import harness

TARGET_MS = 100.0
PARK_TIMEOUT_S = 15.0


def _django(env: dict[str, str]):
    for key in (
        "DATABASE_URL",
        "REDIS_URL",
        "DEBUG",
        "ALLOWED_HOSTS",
        "LOG_LEVEL",
        "DJANGO_SETTINGS_MODULE",
    ):
        os.environ[key] = env[key]
    if str(harness.ROOT) not in sys.path:
        sys.path.insert(0, str(harness.ROOT))
    import django

    django.setup()
    from core.actors import Actor
    from runs.services import records

    actor = Actor(
        kind="worker",
        name="bench-longpoll",
        role="worker",
        agents=(harness.AGENT,),
        component="bench.longpoll",
    )
    return records, actor


def _post(client, url: str, body: dict, ok=(200, 201)) -> dict:
    resp = client.post(url, json=body)
    if resp.status_code not in ok:
        raise RuntimeError(
            f"POST {url.split('/api/v1', 1)[-1]} -> {harness.describe_failure(resp)}"
        )
    return resp.json()


def one_sample(client, base: str, services, actor, wait_s: float, number: int) -> dict[str, Any]:
    run = _post(
        client,
        f"{base}/runs",
        {
            "agent": harness.AGENT,
            "goal": "long-poll probe",
            "input": {"sample": number},
            "authority": [{"scope": s, "ttl_s": 3600} for s in harness.SCOPES],
        },
    )
    claim = _post(client, f"{base}/runs/{run['id']}/claim", {"worker": "bench-longpoll"})
    token, lease_id = claim["lease"]["fencing_token"], claim["lease"]["id"]

    # A plain heartbeat first: the no-wait round trip, for comparison.
    t0 = time.perf_counter()
    _post(client, f"{base}/leases/{lease_id}/heartbeat", {"fencing_token": token})
    plain_ms = (time.perf_counter() - t0) * 1000

    box: dict[str, Any] = {}

    def poll() -> None:
        import httpx

        try:
            with httpx.Client(headers=client.headers, timeout=wait_s + 30) as own:
                box["sent"] = time.monotonic()
                resp = own.post(
                    f"{base}/leases/{lease_id}/heartbeat",
                    json={"fencing_token": token, "wait_s": wait_s},
                )
                box["received"] = time.monotonic()
                box["status"], box["body"] = resp.status_code, resp.json()
        except Exception as exc:
            box["received"] = time.monotonic()
            box["error"] = f"{type(exc).__name__}: {exc}"

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    parked_ms = _wait_until_parked(lease_id, thread)
    if not thread.is_alive():
        return {
            "error": f"long-poll returned before the change: {box.get('body') or box.get('error')}"
        }
    if parked_ms is None:
        return {"error": f"the long-poll's first beat did not commit within {PARK_TIMEOUT_S:.0f}s"}
    from django.db import connection as default_connection

    connection: Any = default_connection  # its private _commit is wrapped below
    marks: dict[str, float] = {}
    t_call = time.monotonic()
    # The service commits in its own durable transaction and then runs its on_commit hooks (the
    # channel-layer push) before returning: time the COMMIT itself, the moment the change became
    # visible, by wrapping this connection's commit for the one call.
    commit = connection._commit

    def timed_commit(*a, **kw):
        done = commit(*a, **kw)
        marks.setdefault("committed", time.monotonic())
        return done

    connection._commit = timed_commit
    try:
        services.request_approval(
            actor=actor,
            run_id=run["id"],
            fencing_token=token,
            tool="bench",
            action="gate",
            reason="long-poll wake-up probe",
        )
    finally:
        del connection._commit
    t_committed = marks.get("committed", time.monotonic())
    thread.join(timeout=wait_s + 30)
    if "error" in box or box.get("status") != 200:
        return {"error": box.get("error") or f"heartbeat -> {box.get('status')}: {box.get('body')}"}
    directive = box["body"].get("directive")
    sample = {
        "wake_ms": round((box["received"] - t_committed) * 1000, 2),
        "wake_from_call_ms": round((box["received"] - t_call) * 1000, 2),
        "commit_ms": round((t_committed - t_call) * 1000, 2),
        "directive": directive,
        "plain_heartbeat_ms": round(plain_ms, 2),
        "parked_after_ms": parked_ms,
    }
    if directive != "wait":
        sample["error"] = f"expected directive 'wait', got {directive!r}"
    return sample


def _wait_until_parked(lease_id: str, thread: threading.Thread) -> float | None:
    """Milliseconds until the long-poll's first beat committed (the lease's heartbeat count went from 1 to
    2), or None. The server subscribes to the run *before* that beat, so any change committed after it
    must wake the poll. Triggering on a fixed delay instead would, under load, sometimes change the run
    before the first beat: the poll would then start from directive ``wait`` and rightly sleep to its
    timeout, which is not a wake-up failure."""
    from runs.models import ExecutionLease

    started = time.monotonic()
    while time.monotonic() - started < PARK_TIMEOUT_S and thread.is_alive():
        beats = (
            ExecutionLease.objects.filter(pk=lease_id).values_list("heartbeats", flat=True).first()
        )
        if beats is not None and beats >= 2:
            return round((time.monotonic() - started) * 1000, 1)
        time.sleep(0.005)
    return None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.longpoll", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--samples", type=int, default=30)
    parser.add_argument("--servers", type=int, default=2)
    parser.add_argument("--wait-s", type=float, default=20.0)
    parser.add_argument(
        "--load",
        type=int,
        default=0,
        help="protocol worker processes running alongside (default 0)",
    )
    parser.add_argument(
        "--fresh-db",
        action="store_true",
        help="DROP and recreate the benchmark database first (e.g. after migrations were rewritten)",
    )
    parser.add_argument("--out", default=str(harness.RESULTS_DIR / "longpoll.json"))
    return parser.parse_args(argv)


class Load:
    """W bench.protocol workers running runs until stopped, alongside the samples."""

    def __init__(self, ctx, workers: int, servers: harness.Servers, token: str):
        from bench.protocol import EFFECTS_PER_RUN, worker_main

        self.workers, self.stop_event = workers, ctx.Event()
        self.barrier, self.results = ctx.Barrier(workers + 1), ctx.Queue()
        self.procs = [
            ctx.Process(
                target=worker_main,
                daemon=True,
                args=(
                    i,
                    servers.urls,
                    token,
                    None,
                    0,
                    EFFECTS_PER_RUN,
                    self.barrier,
                    self.results,
                    self.stop_event,
                ),
            )
            for i in range(workers)
        ]

    def start(self) -> None:
        for p in self.procs:
            p.start()
        self.barrier.wait(timeout=120)
        self.started = time.monotonic()

    def finish(self) -> dict[str, Any]:
        self.stop_event.set()
        reports = [self.results.get(timeout=300) for _ in self.procs]
        wall = time.monotonic() - self.started
        effects = sum(r.get("effects", 0) for r in reports)
        return {
            "workers": self.workers,
            "effects": effects,
            "effects_per_s": round(effects / wall, 1),
            "errors": sum(r.get("errors", 0) for r in reports),
        }


def take_samples(
    args: argparse.Namespace, servers: harness.Servers, token: str, services, actor
) -> list[dict]:
    import httpx

    samples: list[dict[str, Any]] = []
    with httpx.Client(headers={"Authorization": f"Bearer {token}"}, timeout=60) as client:
        for url in servers.urls:  # warm-up: imports and the LISTEN connection of every server
            try:
                one_sample(client, f"{url}/api/v1", services, actor, args.wait_s, -1)
            except Exception as exc:
                print(f"  warm-up on {url} failed: {exc}"[:300], flush=True)
        for i in range(args.samples):
            base = servers.urls[i % len(servers.urls)] + "/api/v1"
            try:
                sample = one_sample(client, base, services, actor, args.wait_s, i)
            except Exception as exc:
                sample = {"error": str(exc)[:400]}
            samples.append(sample)
            if "error" in sample:
                print(f"  sample {i + 1:>3}: {sample['error']}", flush=True)
            else:
                print(
                    f"  sample {i + 1:>3}: woke {sample['wake_ms']:7.1f} ms after commit",
                    flush=True,
                )
    return samples


def measure(
    ctx,
    servers: harness.Servers,
    token: str,
    env: dict[str, str],
    machine: dict,
    samples: int,
    load: int = 0,
    wait_s: float = 20.0,
) -> dict[str, Any]:
    """Long-poll wake-up samples against servers that are already running, with `load` protocol
    workers alongside (bench.suite's entry point); the same result as the command line's."""
    started = datetime.now(UTC)
    args = argparse.Namespace(samples=samples, servers=len(servers.urls), wait_s=wait_s, load=load)
    services, actor = _django(env)
    running: Load | None = None
    try:
        if load:
            running = Load(ctx, load, servers, token)
            running.start()
        taken = take_samples(args, servers, token, services, actor)
        load_summary = running.finish() if running else None
    finally:
        if running:
            harness.stop_processes(running.procs)
    return build_result(args, started, machine, taken, load_summary)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    database_url, redis_url = harness.service_urls("bench.longpoll", " (LISTEN/NOTIFY)")
    harness.install_sigterm_as_interrupt()
    env = harness.bench_env(database_url, redis_url)
    started = datetime.now(UTC)
    print(f"preparing {harness.redact(database_url)} …", flush=True)
    harness.ensure_database(database_url, fresh=args.fresh_db)
    token, prefix = harness.prepare(env, f"bench-longpoll-{int(time.time())}")
    machine = harness.machine_info(database_url)
    services, actor = _django(env)

    servers = harness.Servers(args.servers, env)
    load: Load | None = None
    try:
        servers.start()
        servers.wait_ready()
        print(f"{args.servers} daphne server(s) ready on {', '.join(servers.urls)}", flush=True)
        if args.load:
            load = Load(mp.get_context("spawn"), args.load, servers, token)
            load.start()
            print(f"{args.load} protocol worker(s) running alongside", flush=True)
        samples = take_samples(args, servers, token, services, actor)
        load_summary = load.finish() if load else None
    except KeyboardInterrupt:
        print("\ninterrupted: servers and workers stopped", file=sys.stderr)
        return 130
    except Exception:
        print(servers.log_tail(), file=sys.stderr)
        raise
    finally:
        if load:
            harness.stop_processes(load.procs)
        servers.stop()
        harness.revoke_token(env, prefix)

    result = build_result(args, started, machine, samples, load_summary)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print()
    print(
        f"long-poll wake-up: p50 {result['wake_p50_ms']} ms, p99 {result['wake_p99_ms']} ms, max "
        f"{result['wake_max_ms']} ms over {result['samples'] - result['errors']} samples ({result['errors']} errors); "
        f"target p99 ≤ {TARGET_MS:.0f} ms → {'met' if result['target']['met'] else 'NOT met'}"
    )
    print(f"wrote {out}")
    return 0


def build_result(
    args: argparse.Namespace,
    started: datetime,
    machine: dict,
    samples: list[dict],
    load_summary: dict | None,
) -> dict[str, Any]:
    wakes = [s["wake_ms"] for s in samples if "error" not in s]
    p99 = harness.percentile(wakes, 99)
    return {
        "benchmark": "longpoll",
        "started_at": started.isoformat(),
        "finished_at": datetime.now(UTC).isoformat(),
        "git_commit": harness.git_commit(),
        "machine": machine,
        "config": {
            "samples": args.samples,
            "servers": args.servers,
            "wait_s": args.wait_s,
            "load_workers": args.load,
            "trigger": "runs.services.request_approval (run → awaiting_approval, directive wait) in the bench process",
            "measured": "heartbeat response received − trigger transaction committed (same monotonic clock)",
        },
        "samples": len(samples),
        "errors": sum(1 for s in samples if "error" in s),
        "error_samples": [s["error"] for s in samples if "error" in s][:5],
        "wake_p50_ms": harness.percentile(wakes, 50),
        "wake_p99_ms": p99,
        "wake_max_ms": round(max(wakes), 2) if wakes else None,
        "wake_min_ms": round(min(wakes), 2) if wakes else None,
        "trigger_commit_p50_ms": harness.percentile(
            [s["commit_ms"] for s in samples if "commit_ms" in s], 50
        ),
        "plain_heartbeat_p50_ms": harness.percentile(
            [s["plain_heartbeat_ms"] for s in samples if "plain_heartbeat_ms" in s], 50
        ),
        "parked_after_p50_ms": harness.percentile(
            [s["parked_after_ms"] for s in samples if "parked_after_ms" in s], 50
        ),
        "load": load_summary,
        "target": {"wake_p99_ms": TARGET_MS, "met": p99 is not None and p99 <= TARGET_MS},
        "all_wake_ms": wakes,
    }


if __name__ == "__main__":
    sys.exit(main())
