"""A worker host's process for the faults test (tests/deploy/test_faults.py), run inside a network
namespace: ``python -m tests.deploy.fault_worker MODE --base URL --token T --name N --out FILE``.

It uses only the SDK (no Django): it is a worker on another host. Every answer it got is one JSON
line in ``--out`` (flushed at once, so a SIGKILL loses nothing it saw); the test compares those
acknowledgements with the database. Modes:

- ``load``: ``--threads`` loops of create, claim, heartbeat, declare a charge, record it, finish.
  An error is written down and the loop goes on with a new run (the old one's lease expires).
- ``victim``: one run claimed and its charge committed, then heartbeats until the network goes,
  and once it is back, the late writes a partitioned worker would make: heartbeat, a new
  declaration, finish. Each answer (a refusal is the bar) is written down.
- ``recoverer``: claims the victim agent's runs (a recovered run comes back queued), declares the
  same charge under the same key (the ledger must replay it, not authorize it twice) and finishes.

Every loop is bounded by ``--max-s`` and stops when ``--stop`` exists."""

from __future__ import annotations

import argparse
import json
import threading
import time
from pathlib import Path
from typing import Any

from controlplane_sdk import Client
from controlplane_sdk.errors import ApiError, ServerUnreachable

AUTHORITY = [{"scope": "payments:charge", "ttl_s": 3600}]
MAX_RUNS_PER_THREAD = 400


class Out:
    def __init__(self, path: str) -> None:
        self._file = open(path, "a", buffering=1)  # closed by the process exit
        self._lock = threading.Lock()

    def __call__(self, event: str, **data: Any) -> None:
        with self._lock:
            self._file.write(json.dumps({"event": event, "t": time.time(), **data}) + "\n")
            self._file.flush()


def _answer(call) -> dict[str, Any]:
    """What one late write got back: the status and error code, or that nothing answered."""
    try:
        call()
        return {"status": 200}
    except ApiError as err:
        return {
            "status": err.status,
            "code": err.code,
            "reason": getattr(err, "reason", None) or err.payload.get("reason"),
        }
    except ServerUnreachable as err:
        return {"status": None, "error": str(err)[:200]}


def load(args: argparse.Namespace, out: Out, stopped) -> None:
    def loop(index: int) -> None:
        sdk = Client(args.base, args.token, timeout=10)
        for n in range(MAX_RUNS_PER_THREAD):
            if stopped():
                return
            goal, at = f"{args.name}-{index}-{n}", "create"
            try:
                run = sdk.create_run(args.agent, goal, authority=AUTHORITY)
                out("run", goal=goal, run=run["id"])
                at = "claim"
                claim = sdk.claim(run["id"], args.name)
                token = claim.lease.fencing_token
                at = "heartbeat"
                sdk.heartbeat(claim.lease.id, token, wait_s=0.2)
                at = "declare"
                decision = sdk.declare_effect(
                    run["id"],
                    token,
                    step="charge",
                    tool="payments",
                    action="charge",
                    idempotency_key=f"{goal}-charge",
                    args={"amount": 1},
                    attempt_id=claim.attempt.id,  # a declaration whose answer was lost is adopted
                )
                at = "outcome"
                sdk.record_outcome(decision.id, token, "committed", external_ref=goal)
                out("effect", goal=goal, run=run["id"], effect=decision.id)
                at = "finish"
                sdk.finish(run["id"], token, "succeeded")
                out("finished", goal=goal, run=run["id"])
            except (ApiError, ServerUnreachable) as err:
                # an unanswered write is indeterminate, not acknowledged: written down, not counted
                out("error", goal=goal, at=at, kind=type(err).__name__, error=str(err)[:200])
                time.sleep(0.2)
        sdk.close()

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(args.threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def victim(args: argparse.Namespace, out: Out, stopped) -> None:
    setup = Client(args.base, args.token, timeout=20)
    goal = f"{args.name}-held"
    run = setup.create_run(args.agent, goal, authority=AUTHORITY)
    claim = setup.claim(run["id"], args.name)
    lease, token = claim.lease.id, claim.lease.fencing_token
    decision = setup.declare_effect(
        run["id"],
        token,
        step="charge",
        tool="payments",
        action="charge",
        idempotency_key=f"{goal}-charge",
        args={"amount": 1},
    )
    setup.record_outcome(decision.id, token, "committed", external_ref=goal)
    setup.close()
    # Short timeouts from here: the partition must show as unreachable, not as a slow call. An
    # unreachable API before the test says the link is down (``--partitioned`` exists) is another
    # fault (an API host killed): heartbeats go on.
    sdk = Client(args.base, args.token, timeout=2, retries=2)
    out("holding", goal=goal, run=run["id"], effect=decision.id, token=token, lease=lease)
    cut = False
    while not stopped():
        try:
            sdk.heartbeat(lease, token, wait_s=0.5)
        except ServerUnreachable:
            if Path(args.partitioned).exists() and not cut:
                out("cut")
                cut = True
            time.sleep(0.3)
            continue
        except ApiError as err:
            if not cut:
                out("refused_before_partition", code=err.code)
                raise  # the test's premise is broken: say so
        if cut:
            break
        time.sleep(0.3)
    else:
        return
    # The network is back. What a worker that never learnt of its expiry would send next.
    late = {
        "heartbeat": _answer(lambda: sdk.heartbeat(lease, token)),
        "declare": _answer(
            lambda: sdk.declare_effect(
                run["id"],
                token,
                step="ship",
                tool="payments",
                action="charge",
                idempotency_key=f"{goal}-late",
                args={"amount": 1},
            )
        ),
        "finish": _answer(lambda: sdk.finish(run["id"], token, "succeeded")),
    }
    out("late", run=run["id"], **late)


def recoverer(args: argparse.Namespace, out: Out, stopped) -> None:
    sdk = Client(args.base, args.token, timeout=10)
    while not stopped():
        try:
            claim = sdk.claim_next(args.name, agents=[args.agent], wait_s=1)
            if claim is None:
                continue
            goal = sdk.get_run(claim.run_id)["goal"]
            token = claim.lease.fencing_token
            decision = sdk.declare_effect(
                claim.run_id,
                token,
                step="charge",
                tool="payments",
                action="charge",
                idempotency_key=f"{goal}-charge",
                args={"amount": 1},
            )
            if not decision.replayed:
                sdk.record_outcome(decision.id, token, "committed", external_ref=goal)
            sdk.finish(claim.run_id, token, "succeeded")
            out(
                "recovered",
                run=claim.run_id,
                goal=goal,
                decision=decision.decision,
                effect=decision.id,
                token=token,
            )
        except (ApiError, ServerUnreachable) as err:
            out("error", kind=type(err).__name__, error=str(err)[:200])
            time.sleep(0.3)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["load", "victim", "recoverer"])
    for flag in ("--base", "--token", "--name", "--out", "--stop", "--agent"):
        parser.add_argument(flag, required=True)
    parser.add_argument("--partitioned", default="/nonexistent")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-s", type=float, default=120)
    args = parser.parse_args()
    deadline = time.monotonic() + args.max_s
    stop = Path(args.stop)

    def stopped() -> bool:
        return stop.exists() or time.monotonic() > deadline

    out = Out(args.out)
    out("started", mode=args.mode)
    {"load": load, "victim": victim, "recoverer": recoverer}[args.mode](args, out, stopped)
    out("stopped")


if __name__ == "__main__":
    main()
