"""``python -m demo_agents.worker --name NAME [--agents purchasing:3,address-verifier,refunds]``

One worker process serving the demo agents. Each ``agent[:threads]`` entry gets that many threads, each
running the SDK's :func:`~controlplane_sdk.run_agent_loop` for that agent (one run at a time per
thread). A purchase blocks its thread while it waits for its address check or an approval, so the
purchasing agent gets several threads by default, and the address verifier has its own thread: one
process alone can still complete a purchase and its child. Several such processes run at once
(``make run`` starts ``DEMO_AGENTS`` of them); they compete for queued runs through the claim protocol.

All threads claim under the process's ``--name`` (one worker identity). Configuration: ``CONTROLPLANE_URL``,
``CONTROLPLANE_TOKEN`` (worker token), ``WORLD_URL`` (see :mod:`demo_agents.common`).

SIGTERM/SIGINT: stop claiming; a run in progress finishes its current step sequence; a run that is
*waiting* (child, approval) stops waiting and its lease is left to expire -- the control plane then
treats it as orphaned and recovers it from its checkpoint. After ``--grace`` seconds the process exits
regardless (a second signal exits at once).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from controlplane_sdk import Client, RunContext, RunSummary, run_agent_loop

from . import address_verifier, purchasing, refunds
from .common import (
    SHUTDOWN,
    VERSIONS,
    WorkerShutdown,
    controlplane_token,
    controlplane_url,
    follow_deployed_versions,
)

AGENTS: dict[str, Callable[[RunContext], Any] | str] = {
    purchasing.AGENT: purchasing.purchase,
    address_verifier.AGENT: address_verifier.verify,
    refunds.AGENT: refunds.refund,
    # Framework-built agents, imported only by a worker that serves them (their frameworks are
    # heavy imports): a LangGraph graph and an OpenAI Agents SDK agent, each governed by its adapter.
    "lg-purchasing": "demo_agents.lg_purchasing:purchase",
    "oa-purchasing": "demo_agents.oa_purchasing:purchase",
}


def run_function(agent: str) -> Callable[[RunContext], Any]:
    fn = AGENTS[agent]
    if isinstance(fn, str):
        module, _, name = fn.partition(":")
        fn = getattr(importlib.import_module(module), name)
    return fn


DEFAULT_AGENTS = "purchasing:3,address-verifier:1,refunds:1,lg-purchasing:1,oa-purchasing:1"

log = logging.getLogger("demo_agents.worker")


def parse_agents(spec: str) -> list[tuple[str, int]]:
    out = []
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        name, _, n = part.partition(":")
        if name not in AGENTS:
            raise SystemExit(f"unknown agent {name!r}; known: {', '.join(AGENTS)}")
        out.append((name, max(1, int(n or 1))))
    if not out:
        raise SystemExit("no agents to serve")
    return out


def serve(
    agent: str, worker_name: str, stop: threading.Event, poll: float, counts: dict[str, int]
) -> None:
    """One thread: run the agent loop until ``stop``; survive anything but a shutdown."""
    run_fn = run_function(agent)

    def on_summary(s: RunSummary) -> None:
        counts[s.outcome] = counts.get(s.outcome, 0) + 1
        log.info("%s run %s: %s %s", agent, s.run_id, s.outcome, s.detail[:200])

    while not stop.is_set():
        client = Client(controlplane_url(), controlplane_token(), timeout=15)
        try:
            run_agent_loop(
                client,
                agent,
                worker_name,
                run_fn,
                versions=VERSIONS,
                poll_interval=poll,
                stop_event=stop,
                on_summary=on_summary,
            )
        except WorkerShutdown:
            log.info(
                "%s: stopped while a run was waiting; its lease will expire and it will be recovered",
                agent,
            )
            return
        except Exception:  # never let one bad run or a server hiccup kill the thread
            log.exception("%s: agent loop crashed; restarting in 2 s", agent)
            stop.wait(2)
        finally:
            client.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m demo_agents.worker", description=__doc__.split("\n\n")[1]
    )
    parser.add_argument(
        "--name", default=os.environ.get("WORKER_NAME") or f"demo-worker-{os.getpid()}"
    )
    parser.add_argument(
        "--agents",
        default=os.environ.get("WORKER_AGENTS", DEFAULT_AGENTS),
        help=f"comma-separated agent[:threads] (default {DEFAULT_AGENTS})",
    )
    parser.add_argument(
        "--poll", type=float, default=1.0, help="seconds between polls for queued runs"
    )
    parser.add_argument(
        "--grace", type=float, default=8.0, help="seconds to let runs finish on SIGTERM"
    )
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)

    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format=f"%(asctime)s {args.name} %(threadName)s %(levelname)s %(message)s",
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)
    agents = parse_agents(args.agents)
    controlplane_token()  # fail fast without a token

    stop = threading.Event()
    follow_deployed_versions()  # manage.py demo_bump_tool_version
    signals = {"n": 0}

    def on_signal(signum: int, _frame: Any) -> None:
        signals["n"] += 1
        if signals["n"] > 1:
            log.warning("second signal: exiting now")
            os._exit(1)
        log.info("signal %s: stopping (grace %.0fs)", signum, args.grace)
        stop.set()
        SHUTDOWN.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    counts: dict[str, int] = {}
    threads = []
    for agent, n in agents:
        for i in range(1, n + 1):
            t = threading.Thread(
                target=serve,
                args=(agent, args.name, stop, args.poll, counts),
                name=f"{agent}-{i}",
                daemon=True,
            )
            t.start()
            threads.append(t)
    log.info(
        "worker %s serving %s against %s (world %s)",
        args.name,
        ", ".join(f"{a}x{n}" for a, n in agents),
        controlplane_url(),
        os.environ.get("WORLD_URL", "default"),
    )
    print(f"demo_agents.worker {args.name} started", flush=True)

    while not stop.is_set():
        stop.wait(0.5)
    deadline = time.monotonic() + args.grace
    for t in threads:
        t.join(timeout=max(0.0, deadline - time.monotonic()))
    alive = [t.name for t in threads if t.is_alive()]
    if alive:
        log.warning(
            "exiting with runs still in progress on %s; their leases will expire", ", ".join(alive)
        )
    log.info("worker %s stopped; runs handled: %s", args.name, counts or "none")
    return 0


if __name__ == "__main__":
    sys.exit(main())
