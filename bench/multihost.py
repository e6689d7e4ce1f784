"""The multi-host phase (issue 22 item 8): effects/s and CPU per effect with 1 and 2 API hosts
behind HAProxy, each API host a network namespace reached across a veth (docs/operations/faults.md
describes the hosts; tests/deploy/netns.py makes them).

    .venv/bin/python -m bench.multihost [--seconds S] [--threads T] [--out bench/results/multihost.json]

Needs root (``ip netns``); where namespaces cannot be made it writes ``{"skipped": why}``. The load
is one worker host running ``T`` SDK loops (create, claim, heartbeat, declare, record, finish: one
effect a run) for ``S`` seconds per phase. CPU is the API processes' and the benchmark database's
PostgreSQL backends'; the forwarders to PostgreSQL and Redis (threads of this process) and HAProxy
are not counted.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from bench import harness

# The hosts and processes are the faults test's (tests/deploy/netns.py, tests/live.py), loaded at run
# time: the type checker covers bench/, not the test helpers.
netns: Any = importlib.import_module("tests.deploy.netns")
Procs: Any = importlib.import_module("tests.live").Procs

QUICK = os.environ.get("BENCH_QUICK", "") not in ("", "0")


def _alive(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _wait(what: str, predicate, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise RuntimeError(f"timed out after {timeout}s waiting for {what}")


def phase(
    net: Any,
    apis: list[Any],
    load_host: Any,
    api_envs: list[dict[str, str]],
    token: str,
    dbname: str,
    count: int,
    seconds: float,
    threads: int,
    tmp: Path,
) -> dict[str, Any]:
    procs = Procs(tmp)
    try:
        pids = []
        for i in range(count):
            proc, _ = procs.start(
                f"api{i}",
                apis[i].cmd(sys.executable, "-m", "controlplane.serve", "-b", apis[i].ip, "-p",
                            "8000", "controlplane.asgi:application"),
                api_envs[i],
            )  # fmt: skip
            pids.append(proc.pid)
        for h in apis[:count]:
            _wait(f"{h.name} to serve", lambda h=h: _alive(f"http://{h.ip}:8000"), 90)
        lb_port, _ = netns.start_haproxy(
            procs, [(h.ip, 8000) for h in apis[:count]], [load_host.root_ip]
        )
        _wait("haproxy to serve", lambda: _alive(f"http://127.0.0.1:{lb_port}"), 15)
        out, stop = tmp / f"load-{count}.jsonl", tmp / f"stop-{count}"
        meter = harness.CpuMeter(pids, dbname)
        meter.start()
        started = time.monotonic()
        load, _ = procs.start(
            f"load-{count}",
            load_host.cmd(sys.executable, "-m", "tests.deploy.fault_worker", "load",
                          "--base", f"http://{load_host.root_ip}:{lb_port}", "--token", token,
                          "--name", f"mh{count}-{int(time.time())}", "--out", str(out),
                          "--stop", str(stop), "--agent", harness.AGENT, "--tool", "bench",
                          "--threads", str(threads), "--max-s", str(seconds)),
            dict(os.environ, PYTHONUNBUFFERED="1"),
        )  # fmt: skip
        load.wait(timeout=seconds + 60)
        elapsed = time.monotonic() - started
        cpu = meter.stop()
        lines = [json.loads(x) for x in out.read_text().splitlines() if x.strip()]
        effects = sum(1 for e in lines if e["event"] == "effect")
        errors = sum(1 for e in lines if e["event"] == "error")
        return {
            "api_hosts": count,
            "workers": threads,
            "seconds": round(elapsed, 1),
            "effects": effects,
            "errors": errors,
            "effects_per_s": round(effects / elapsed, 1) if elapsed else None,
            "server_cpu_ms_per_effect": round(1000 * cpu["servers_cpu_s"] / effects, 2)
            if effects
            else None,
            "postgres_cpu_ms_per_effect": round(1000 * cpu["postgres_cpu_s"] / effects, 2)
            if effects
            else None,
            "machine_busy_pct": cpu["machine_busy_pct"],
        }
    finally:
        procs.stop()


def measure(seconds: float, threads: int) -> dict[str, Any]:
    why = netns.namespaces_permitted()
    if why:
        return {"skipped": f"network namespaces are not available: {why}"}
    database_url, redis_url = harness.service_urls("bench.multihost")
    env = harness.bench_env(database_url, redis_url)
    harness.ensure_database(database_url)
    token, prefix = harness.prepare(env, f"bench-multihost-{int(time.time())}")
    db, rd = urlsplit(database_url), urlsplit(redis_url)
    net = netns.Network()
    try:
        apis = [net.add_host(f"a{i}") for i in range(2)]
        load_host = net.add_host("w0")
        api_envs = []
        for h in apis:
            pg = net.link(h, (db.hostname or "127.0.0.1", db.port or 5432))
            redis = net.link(h, (rd.hostname or "127.0.0.1", rd.port or 6379))
            api_envs.append(
                dict(
                    env,
                    DATABASE_URL=db._replace(netloc=f"{db.username or 'postgres'}@{h.root_ip}:{pg.port}").geturl(),
                    REDIS_URL=rd._replace(netloc=f"{h.root_ip}:{redis.port}").geturl(),
                    ALLOWED_HOSTS=",".join(["127.0.0.1", h.ip, load_host.root_ip]),
                )
            )  # fmt: skip
        dbname = harness.dbname_of(database_url)
        with tempfile.TemporaryDirectory(prefix="bench-multihost-") as tmp:
            phases = {
                str(n): phase(net, apis, load_host, api_envs, token, dbname, n, seconds, threads, Path(tmp))
                for n in (1, 2)
            }  # fmt: skip
    finally:
        net.close()
        harness.revoke_token(env, prefix)
    one, two = phases["1"], phases["2"]
    return {
        "phases": phases,
        "scaling_2_over_1": round(two["effects_per_s"] / one["effects_per_s"], 2)
        if one.get("effects_per_s") and two.get("effects_per_s")
        else None,
        "note": "one machine (2 cores) plays every host: a second API host adds processes, not cores",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=8.0 if QUICK else 20.0)
    parser.add_argument("--threads", type=int, default=8 if QUICK else 16)
    parser.add_argument("--out", default="bench/results/multihost.json")
    args = parser.parse_args(argv)
    result = measure(args.seconds, args.threads)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
