"""What one worker-protocol call costs the server process: CPU per call through the real ASGI app.

In-process, no sockets: the benchmark calls ``controlplane.asgi.application`` (the product's ASGI
handler, middleware, django-ninja and services, DEBUG off, against PostgreSQL) with hand-made ASGI
messages, so the process's CPU time is the server's CPU plus a few microseconds of message plumbing.
The loop is bench.protocol's ``BENCH_FOLD=next`` worker: create, claim, then per effect one
``POST /effects/{id}/outcome`` carrying the step's checkpoint and the next declaration, then finish.

    DATABASE_URL=postgresql://postgres@127.0.0.1:5432/cp_bench_path REDIS_URL=redis://127.0.0.1:6379/0 \
    .venv/bin/python -m bench.request_path [--runs 6] [--effects 20] [--rounds 5] \
        [--profile /tmp/path.prof] [--out bench/results/request_path.json]

Reports per round and their median: process CPU (``time.process_time``: every thread, the live
sender's too) per outcome call and per effect (create/claim/finish included, as in bench.suite),
the same for the floor (``GET /bench/noop/``: a plain Django view; ``POST /bench/echo/``: a ninja
operation validating a declaration; neither touches the database), and SQL statements per effect
(bench/sqlcount.py). ``--profile`` writes a cProfile of the protocol loop (all threads).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from typing import Any

from bench import harness

SERVER = ("127.0.0.1", 8000)


def _setup(database_url: str, redis_url: str) -> str:
    harness.ensure_database(database_url)
    env = harness.bench_env(database_url, redis_url)
    secret, _ = harness.prepare(env, "request-path")
    os.environ.update(env)
    os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"
    return secret


class Caller:
    """Calls the ASGI app as a server would, one request at a time."""

    def __init__(self, app, token: str) -> None:
        self.app = app
        self.auth = f"Bearer {token}".encode()

    async def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        raw = json.dumps(body).encode() if body is not None else b""
        headers = [
            (b"host", b"127.0.0.1"),
            (b"user-agent", b"bench-request-path"),
            (b"accept", b"application/json"),
        ]
        if path.startswith("/api/"):
            headers.append((b"authorization", self.auth))
        if raw:
            headers += [
                (b"content-type", b"application/json"),
                (b"content-length", b"%d" % len(raw)),
            ]
        scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1",
            "method": method,
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "query_string": b"",
            "root_path": "",
            "headers": headers,
            "client": ("127.0.0.1", 40000),
            "server": SERVER,
        }
        sent = False
        done = asyncio.Event()

        async def receive():
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": raw, "more_body": False}
            await done.wait()
            return {"type": "http.disconnect"}

        status = 0
        chunks: list[bytes] = []

        async def send(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))

        await self.app(scope, receive, send)
        done.set()
        payload = b"".join(chunks)
        try:
            return status, json.loads(payload) if payload else None
        except ValueError:
            return status, payload


def _declaration(run_id: str, token: int, i: int) -> dict:
    return {
        "fencing_token": token,
        "step": f"step-{i}",
        "tool": "bench",
        "action": "write",
        "idempotency_key": f"{run_id}:step-{i}",
        "args": {"i": i, "worker": 0},
        "compensation": {"tool": "bench", "action": "undo"},
        "irreversible": False,
    }


def _ok(status: int, body: Any, want: tuple[int, ...], what: str) -> Any:
    if status not in want:
        raise SystemExit(f"{what} -> {status}: {str(body)[:500]}")
    return body


async def one_run(c: Caller, effects: int, outcome_cpu: list[float]) -> None:
    """bench.protocol's BENCH_FOLD=next run: create, claim, declare, `effects` outcomes, finish."""
    api = "/api/v1"
    body = {
        "agent": harness.AGENT,
        "goal": "request-path benchmark",
        "input": {"run": 0},
        "versions": {"code": "bench", "model": "none", "tools": {"bench": "1"}},
        "authority": [{"scope": s, "ttl_s": 3600} for s in harness.SCOPES],
    }
    run = _ok(*await c.call("POST", f"{api}/runs", body), (201,), "create")
    run_id = run["id"]
    claim = _ok(
        *await c.call("POST", f"{api}/runs/{run_id}/claim", {"worker": "bench-0"}), (200,), "claim"
    )
    token = claim["lease"]["fencing_token"]
    effect = _ok(
        *await c.call("POST", f"{api}/runs/{run_id}/effects", _declaration(run_id, token, 0)),
        (201,),
        "declare",
    )
    for i in range(effects):
        outcome: dict = {
            "fencing_token": token,
            "status": "committed",
            "external_ref": f"bench-{i}",
            "checkpoint": {"step": f"step-{i}", "state": {"done": i + 1}},
        }
        if i + 1 < effects:
            outcome["next"] = _declaration(run_id, token, i + 1)
        t0 = time.process_time()
        answer = _ok(
            *await c.call("POST", f"{api}/effects/{effect['id']}/outcome", outcome),
            (200,),
            "outcome",
        )
        outcome_cpu.append(time.process_time() - t0)
        if "next" in outcome:
            effect = answer["next"]
            if effect.get("decision") != "authorized":
                raise SystemExit(f"next -> {effect}")
    _ok(
        *await c.call(
            "POST",
            f"{api}/runs/{run_id}/finish",
            {"fencing_token": token, "outcome": "succeeded"},
        ),
        (200,),
        "finish",
    )


async def floor(c: Caller, n: int) -> dict[str, float]:
    """CPU ms per call of the two no-work routes of bench/urls.py."""
    echo = _declaration("floor", 1, 0)
    out = {}
    for name, method, path, body in (
        ("noop", "GET", "/bench/noop/", None),
        ("echo", "POST", "/bench/echo/", echo),
    ):
        t0 = time.process_time()
        for _ in range(n):
            _ok(*await c.call(method, path, body), (200,), name)
        out[name] = (time.process_time() - t0) * 1000 / n
    return out


def _statements() -> int:
    from bench import sqlcount

    return sqlcount.snapshot()["statements"]


async def measure(
    c: Caller, runs: int, effects: int, rounds: int, floor_calls: int, profile: str | None
) -> dict[str, Any]:
    from core import live

    flush = getattr(live, "flush", lambda timeout=5.0: None)
    await one_run(c, effects, [])  # warm-up: imports, connections, caches
    await floor(c, 20)
    flush()
    per_round = []
    for _ in range(rounds):
        outcome_cpu: list[float] = []
        s0, t0, w0 = _statements(), time.process_time(), time.perf_counter()
        for _ in range(runs):
            await one_run(c, effects, outcome_cpu)
        flush()  # the sender thread's work belongs to these calls
        t1, w1, s1 = time.process_time(), time.perf_counter(), _statements()
        n = runs * effects
        per_round.append(
            {
                "cpu_ms_per_effect": (t1 - t0) * 1000 / n,
                "cpu_ms_per_outcome_call": statistics.mean(outcome_cpu) * 1000,
                "wall_ms_per_effect": (w1 - w0) * 1000 / n,
                "statements_per_effect": (s1 - s0) / n,
                **{f"floor_{k}_cpu_ms": v for k, v in (await floor(c, floor_calls)).items()},
            }
        )
    result: dict[str, Any] = {
        "median": {k: round(statistics.median(r[k] for r in per_round), 3) for k in per_round[0]},
        "rounds": [{k: round(v, 3) for k, v in r.items()} for r in per_round],
    }
    if profile:
        import cProfile

        # CPU, not wall: waits on PostgreSQL and Redis cost the process nothing. Process-wide, so
        # the live sender thread's work shows too (one thread runs Python at a time).
        prof = cProfile.Profile(time.process_time)
        prof.enable()
        for _ in range(runs):
            await one_run(c, effects, [])
        flush()
        prof.disable()
        prof.dump_stats(profile)
        result["profile"] = profile
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=6, help="runs per round")
    parser.add_argument("--effects", type=int, default=20, help="effects per run")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--floor-calls", type=int, default=100)
    parser.add_argument("--profile", default=None, help="write a cProfile of one round here")
    parser.add_argument("--label", default="", help="a name for this run in the JSON")
    parser.add_argument("--out", default=str(harness.RESULTS_DIR / "request_path.json"))
    args = parser.parse_args(argv)
    database_url, redis_url = harness.service_urls("bench.request_path")
    secret = _setup(database_url, redis_url)
    from controlplane.asgi import application

    load0 = os.getloadavg()
    result = asyncio.run(
        measure(
            Caller(application, secret),
            args.runs,
            args.effects,
            args.rounds,
            args.floor_calls,
            args.profile,
        )
    )
    result = {
        "label": args.label,
        "commit": harness.git_commit(),
        "fold": "next",
        "runs_per_round": args.runs,
        "effects_per_run": args.effects,
        "load_average": [round(x, 2) for x in load0],
        "load_average_end": [round(x, 2) for x in os.getloadavg()],
        **result,
    }
    print(json.dumps({k: v for k, v in result.items() if k != "rounds"}, indent=1))
    if args.out and args.out != "-":
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out, "w") as fh:
            json.dump(result, fh, indent=1)
            fh.write("\n")


if __name__ == "__main__":
    main()
