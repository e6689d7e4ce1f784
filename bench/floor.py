"""The floor under bench.protocol: how many HTTP calls per second these servers answer when the call
does no control-plane work at all (bench/urls.py), measured with the same worker processes, client,
servers and machine as the protocol phases.

Every effect in bench.protocol costs 3 calls (declare, outcome, checkpoint) plus its share of the run's
create/claim/finish, so ``floor requests/s ÷ calls per effect`` bounds the effects/s any implementation
of the protocol could reach on these servers. With W closed-loop workers and no think time, Little's law
bounds the mean latency from below: ``W ÷ requests/s``."""

from __future__ import annotations

import signal
import time
from typing import Any

from bench import harness

ROUTES = {
    # name: (method, path, body)
    "django_noop": ("GET", "/bench/noop/", None),
    "ninja_echo": (
        "POST",
        "/bench/echo/",
        {
            "fencing_token": 1,
            "step": "step-0",
            "tool": "bench",
            "action": "write",
            "idempotency_key": "k:step-0",
            "args": {"i": 0, "worker": 0},
            "compensation": {"tool": "bench", "action": "undo"},
            "irreversible": False,
        },
    ),
}


def floor_worker(
    index: int, servers: list[str], route: str, seconds: float, barrier, results
) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    import httpx

    method, path, body = ROUTES[route]
    url = servers[index % len(servers)] + path
    lat: list[float] = []
    errors = 0
    try:
        with httpx.Client(timeout=30.0) as client:
            client.request(
                method, url, json=body
            )  # open the keep-alive connection before the clock
            barrier.wait()
            t_start, cpu0 = time.monotonic(), time.process_time()
            while time.monotonic() - t_start < seconds:
                t0 = time.perf_counter()
                resp = client.request(method, url, json=body)
                lat.append((time.perf_counter() - t0) * 1000)
                errors += resp.status_code != 200
            results.put(
                {
                    "t_start": t_start,
                    "t_end": time.monotonic(),
                    "cpu_s": time.process_time() - cpu0,
                    "lat": lat,
                    "errors": errors,
                }
            )
    except Exception as exc:
        results.put({"fatal": f"{type(exc).__name__}: {exc}"[:1000]})


def run_floor(
    ctx, workers: int, route: str, seconds: float, servers: harness.Servers
) -> dict[str, Any]:
    reports, cpu = harness.run_workers(
        ctx,
        servers,
        workers,
        floor_worker,
        lambda i: (i, servers.urls, route, seconds),
        seconds + 60,
        "floor",
    )
    lat = [v for r in reports for v in r["lat"]]
    wall = max(r["t_end"] for r in reports) - min(r["t_start"] for r in reports)
    rps = len(lat) / wall if wall > 0 else 0.0
    return {
        "route": f"{ROUTES[route][0]} {ROUTES[route][1]}",
        "workers": workers,
        "requests": len(lat),
        "wall_s": round(wall, 3),
        "requests_per_s": round(rps, 1),
        "p50_ms": harness.percentile(lat, 50),
        "p99_ms": harness.percentile(lat, 99),
        "errors": sum(r["errors"] for r in reports),
        "little_mean_latency_floor_ms": round(1000 * workers / rps, 1) if rps else None,
        "cpu": {
            "servers_cpu_s": cpu["servers_cpu_s"],
            "workers_cpu_s": round(sum(r["cpu_s"] for r in reports), 2),
            "machine_busy_pct": cpu["machine_busy_pct"],
            "server_cpu_ms_per_request": round(1000 * cpu["servers_cpu_s"] / len(lat), 3)
            if lat
            else None,
            "client_cpu_ms_per_request": round(
                1000 * sum(r["cpu_s"] for r in reports) / len(lat), 3
            )
            if lat
            else None,
        },
    }


def ceiling(
    floor: dict[str, Any],
    calls_per_effect: float,
    target_effects_per_s: float,
    target_p99_ms: float,
    cpu_count: int | None = None,
) -> dict[str, Any]:
    """What the floor implies for the protocol targets on this machine. The CPU budget: at the target,
    the worker processes alone (their HTTP client) and the servers answering *no-work* calls would need
    this many cores, before the protocol does anything."""
    rps = floor["requests_per_s"]
    best = round(rps / calls_per_effect, 1)
    needed_rps = target_effects_per_s * calls_per_effect
    cpu = floor.get("cpu", {})
    client_cores = needed_rps * (cpu.get("client_cpu_ms_per_request") or 0) / 1000
    server_cores = needed_rps * (cpu.get("server_cpu_ms_per_request") or 0) / 1000
    budget = {
        "requests_per_s_needed": round(needed_rps),
        "client_cores_needed": round(client_cores, 2),
        "noop_server_cores_needed": round(server_cores, 2),
        "cores_available": cpu_count,
    }
    return {
        "cpu_budget_at_target": budget,
        "based_on": floor["route"],
        "calls_per_effect": calls_per_effect,
        "max_effects_per_s": best,
        "effects_per_s_target_reachable": best >= target_effects_per_s,
        "mean_latency_floor_ms": floor["little_mean_latency_floor_ms"],
        "p99_target_reachable": (floor["little_mean_latency_floor_ms"] or 0) <= target_p99_ms,
        "note": (
            f"{floor['workers']} workers calling a no-work endpoint get {rps:.0f} requests/s from these "
            f"servers; at {calls_per_effect} calls per effect no protocol implementation on them exceeds "
            f"{best:.0f} effects/s, and with {floor['workers']} closed-loop workers the mean latency of any "
            f"call is at least {floor['little_mean_latency_floor_ms']} ms (Little's law)"
        ),
    }
