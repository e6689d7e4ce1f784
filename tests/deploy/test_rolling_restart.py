"""A rolling restart of two API replicas behind HAProxy under 16 SDK workers: each replica in turn
gets SIGTERM, drains, exits and starts again while the workers create, claim, declare, record and
finish runs. Bar: 0 errors surfaced to the SDK users, every acknowledged write in the database,
no run created twice (docs/operations/drain.md)."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
import traceback

import pytest

from controlplane_sdk import Client
from runs.models import Effect, Run
from tests.deploy.hosts import start_api, start_haproxy, start_redis
from tests.live import Procs, free_port, server_env, wait_for

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    # 30-70 s, too long for the suite: run by `make rolling-restart-test` (.ci/run). Its two
    # failures (a new replica's listen queue reset by the drain, and HAProxy reusing an idle
    # connection the drain was closing) are described in docs/operations/drain.md.
    pytest.mark.skipif(
        os.environ.get("CONTROLPLANE_ROLLING_TEST") != "1",
        reason="the rolling-restart test runs under `make rolling-restart-test` (30-70 s)",
    ),
]

WORKERS = 16
MAX_RUNS_PER_WORKER = 200  # a bound on the load whatever the restarts take
MAX_LOAD_S = 90


def _work(base: str, token: str, index: int, stop: threading.Event, acked: list, errors: list):
    sdk = Client(base, token, timeout=30)
    try:
        for n in range(MAX_RUNS_PER_WORKER):
            if stop.is_set():
                return
            goal = f"rolling-{index}-{n}"
            run = sdk.create_run(
                "purchasing",
                goal,
                versions={"code": "1.0.0"},
                authority=[{"scope": "payments:charge", "ttl_s": 3600}],
            )
            acked.append(("run", goal, run["id"]))
            claim = sdk.claim(run["id"], f"worker-{index}")
            token_ = claim.lease.fencing_token
            sdk.heartbeat(claim.lease.id, token_, wait_s=0.5)  # a short long-poll
            decision = sdk.declare_effect(
                run["id"],
                token_,
                step="charge",
                tool="payments",
                action="charge",
                idempotency_key=f"{goal}-charge",
                args={"amount": 1},
            )
            sdk.record_outcome(decision.id, token_, "committed", external_ref=goal)
            acked.append(("effect", goal, decision.id))
            sdk.finish(run["id"], token_, "succeeded")
            acked.append(("finished", goal, run["id"]))
    except Exception:
        # when, in the test's clock (compare with the restarts' events), and where
        errors.append(f"worker {index} at {time.monotonic():.2f}: {traceback.format_exc(limit=4)}")
    finally:
        sdk.close()


def test_a_rolling_restart_under_load_loses_nothing_and_shows_no_error(
    postgres_only, tmp_path, worker_token
):
    procs = Procs(tmp_path)
    try:
        redis = start_redis(procs)
        env = server_env(tmp_path, REDIS_URL=f"redis://127.0.0.1:{redis}/0", DRAIN_TIMEOUT_S="15")
        ports = [free_port(), free_port()]
        for i, port in enumerate(ports):
            start_api(procs, env, name=f"api{i}", port=port)
        base, lb_log = start_haproxy(procs, ports)

        stop, acked, errors = threading.Event(), [], []
        workers = [
            threading.Thread(target=_work, args=(base, worker_token, i, stop, acked, errors))
            for i in range(WORKERS)
        ]
        for w in workers:
            w.start()
        time.sleep(2)
        restarts, events = [], [f"load started at {time.monotonic():.2f}"]
        for i, port in enumerate(ports):
            before = len(acked)
            api = procs.get(f"api{i}")
            sigterm_at = time.monotonic()
            events.append(f"api{i} SIGTERM at {sigterm_at:.2f}")
            os.kill(api.pid, signal.SIGTERM)
            try:
                rc: int | str = api.wait(timeout=30)
            except subprocess.TimeoutExpired:
                rc = "still running after 30 s"
                api.kill()
                api.wait(5)
            drained_s = time.monotonic() - sigterm_at
            events.append(f"api{i} exited {rc} at {time.monotonic():.2f}")
            procs.procs = [t for t in procs.procs if t[0] != f"api{i}"]
            taken_back = lb_log.read_text().count(f"replicas/r{i} is UP")
            # a name of its own, so the first process's log (its drain) is kept for a post-mortem
            start_api(procs, env, name=f"api{i}-restarted", port=port)
            events.append(f"api{i}-restarted serving at {time.monotonic():.2f}")
            wait_for(
                f"the proxy to take api{i} back",
                lambda i=i, n=taken_back: lb_log.read_text().count(f"replicas/r{i} is UP") > n,
                20,
                logs=(lb_log,),
            )
            events.append(f"the proxy took api{i} back at {time.monotonic():.2f}")
            restarts.append(
                {"exit": rc, "drain_s": round(drained_s, 1), "acks": len(acked) - before}
            )
        time.sleep(2)
        stop.set()
        for w in workers:
            w.join(MAX_LOAD_S)

        runs = [a for a in acked if a[0] == "run"]
        effects = [a for a in acked if a[0] == "effect"]
        finished = [a for a in acked if a[0] == "finished"]
        stored = dict(Run.objects.filter(goal__startswith="rolling-").values_list("id", "goal"))
        committed = {
            str(i)
            for i in Effect.objects.filter(status=Effect.COMMITTED).values_list("id", flat=True)
        }
        done = Run.objects.filter(pk__in=[f[2] for f in finished], state="succeeded").count()
        # every check is evaluated and printed before any is asserted, so a failure names them all
        checks = {
            "workers still running": [i for i, w in enumerate(workers) if w.is_alive()],
            "replicas that did not drain and exit 0": [r for r in restarts if r["exit"] != 0],
            "errors surfaced to SDK users": errors,
            "fewer finishes than workers": [] if len(finished) >= WORKERS else [len(finished)],
            "acknowledged runs missing": sorted({r[2] for r in runs} - {str(i) for i in stored}),
            "runs created twice": sorted(
                g for g in set(stored.values()) if list(stored.values()).count(g) > 1
            ),
            "runs stored but not acknowledged (indeterminate)": sorted(
                {str(i) for i in stored} - {r[2] for r in runs}
            ),
            "acknowledged effects not committed": sorted({e[2] for e in effects} - committed),
            "acknowledged finishes not succeeded": []
            if done == len(finished)
            else [done, len(finished)],
        }
        failed = {k: v for k, v in checks.items() if v}
        print(
            f"rolling restart: {len(runs)} runs, {len(effects)} effects, {len(finished)} finishes "
            f"acknowledged; each restart: {restarts}; events: {events}"
        )
        if failed:
            for log in sorted(tmp_path.glob("*.log")):
                print(f"--- {log.name} (last 6000 characters) ---\n{log.read_text()[-6000:]}")
        assert failed == {}, "\n".join(f"{k}: {v}" for k, v in failed.items())
    finally:
        procs.stop()
