"""A rolling restart of two API replicas behind HAProxy under 16 SDK workers: each replica in turn
gets SIGTERM, drains, exits and starts again while the workers create, claim, declare, record and
finish runs. Bar: 0 errors surfaced to the SDK users, every acknowledged write in the database,
no run created twice (docs/operations/drain.md)."""

from __future__ import annotations

import os
import signal
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
        errors.append(f"worker {index}: {traceback.format_exc(limit=3)}")
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
        restarts = []
        for i, port in enumerate(ports):
            before = len(acked)
            api = procs.get(f"api{i}")
            sigterm_at = time.monotonic()
            os.kill(api.pid, signal.SIGTERM)
            assert api.wait(timeout=30) == 0
            drained_s = time.monotonic() - sigterm_at
            procs.procs = [t for t in procs.procs if t[0] != f"api{i}"]
            taken_back = lb_log.read_text().count(f"replicas/r{i} is UP")
            # a name of its own, so the first process's log (its drain) is kept for a post-mortem
            start_api(procs, env, name=f"api{i}-restarted", port=port)
            wait_for(
                f"the proxy to take api{i} back",
                lambda i=i, n=taken_back: lb_log.read_text().count(f"replicas/r{i} is UP") > n,
                20,
                logs=(lb_log,),
            )
            restarts.append((drained_s, len(acked) - before))
        time.sleep(2)
        stop.set()
        for w in workers:
            w.join(MAX_LOAD_S)
        assert not any(w.is_alive() for w in workers)

        assert errors == [], "\n".join(errors)
        runs = [a for a in acked if a[0] == "run"]
        effects = [a for a in acked if a[0] == "effect"]
        finished = [a for a in acked if a[0] == "finished"]
        assert len(finished) >= WORKERS, acked[-5:]
        # every acknowledged write is there, and nothing was written twice
        stored = dict(Run.objects.filter(goal__startswith="rolling-").values_list("id", "goal"))
        assert len(stored) == len(runs) == len(set(stored.values()))
        assert {str(i) for i in stored} == {r[2] for r in runs}
        committed = set(Effect.objects.filter(status=Effect.COMMITTED).values_list("id", flat=True))
        assert {e[2] for e in effects} <= {str(i) for i in committed}
        done = Run.objects.filter(pk__in=[f[2] for f in finished], state="succeeded").count()
        assert done == len(finished)
        print(
            f"rolling restart: {len(runs)} runs, {len(effects)} effects acknowledged; "
            f"drain s and writes acknowledged during each restart: {restarts}"
        )
    finally:
        procs.stop()
