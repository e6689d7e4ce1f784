"""``python -m demo_agents.traffic [--interval S] [--max-active N] [--count N] [--seed N]``

Keeps producing runs with a realistic mix, so there is always something for an operator to act on:

==============  =====================================================================================
``ok``          an ordinary purchase under the approval threshold (most runs)
``approval``    a purchase above ``APPROVAL_THRESHOLD``: waits in ``awaiting_approval`` for a human
                (at most ``--max-approvals`` waiting at once)
``slow``        a world ``slow`` fault on the next reserve or label call (1.2 s, under the agents' 2 s
                timeout): the run succeeds, slowly
``ambiguous``   a world ``timeout`` fault on the next payments charge (the charge COMMITS, the answer
                comes after 3 s, the agent gave up after 2 s): an ``unknown`` effect to reconcile
``rejected``    an injected ``reject`` on the next charge (402 card_declined, not stored): failed run,
                retryable with the same key
``declined``    the always-declined test card 4000000000000002: failed run (``payment_declined``)
``bad_address`` the child address check fails: the parent fails after reserving stock (compensate!)
``refund``      a refunds-agent run for the charge of a recent successful purchase
==============  =====================================================================================

Faults are per *next call* of a system, so with several runs in flight the fault lands on whichever
run makes that call next -- realistic enough, and the point is that something goes wrong somewhere.
A fault is not injected again while an identical one is still pending. Stock is topped up so the
demo does not run dry. The generator creates runs with the worker token (``POST /api/v1/runs`` is
allowed for worker tokens) and talks to the world's admin API for faults and stock.

Half the ``approval`` runs are started with ``CONTROLPLANE_REQUESTER_TOKEN`` (seed_demo's requester,
rita) when it is set: a person's purchase, which she may not approve herself (four eyes).

Environment: ``CONTROLPLANE_URL``, ``CONTROLPLANE_TOKEN``, ``CONTROLPLANE_REQUESTER_TOKEN``,
``WORLD_URL``, ``TRAFFIC_INTERVAL_S``, ``TRAFFIC_MAX_ACTIVE``, ``APPROVAL_THRESHOLD``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import os
import random
import signal
import sys
import threading
import uuid
from typing import Any

from controlplane_sdk import Client, ControlPlaneError
from world.client import WorldClient, WorldClientError

from .common import (
    VERSIONS,
    controlplane_token,
    controlplane_url,
    env_float,
    follow_deployed_versions,
    world_url,
)

log = logging.getLogger("demo_agents.traffic")

ACTIVE_STATES = "queued,running,awaiting_approval"
PURCHASE_AUTHORITY = [
    {"scope": s, "ttl_s": 3600}
    for s in ("inventory:*", "shipping:*", "payments:charge", "notifications:*", "address:verify")
]
REFUND_AUTHORITY = [{"scope": s, "ttl_s": 3600} for s in ("payments:refund", "notifications:*")]
CUSTOMERS = [
    ("Ada Lovelace", "ada@example.com", "12 St James's Square, SW1Y 4JH London, UK"),
    ("Grace Hopper", "grace@example.com", "1 Navy Yard, 20374 Washington DC, US"),
    ("Alan Turing", "alan@example.com", "78 High Street, MK3 6EB Bletchley, UK"),
    ("Emmy Noether", "emmy@example.com", "Bunsenstrasse 3, 37073 Goettingen, DE"),
    ("Edsger Dijkstra", "edsger@example.com", "Molenweg 4, 5671 Nuenen, NL"),
    ("Barbara Liskov", "barbara@example.com", "32 Vassar St, 02139 Cambridge MA, US"),
]
BAD_ADDRESSES = ["Unknown street, Nowhere", "somewhere over the rainbow"]
CHEAP = [("sku-1", (1, 4)), ("sku-2", (1, 3)), ("sku-3", (1, 4))]  # seed prices 12.50, 30.00, 7.25
PRICEY = [("sku-2", (8, 9)), ("sku-4", (3, 4))]  # 240-270, 300-400 at seed prices
#: sku -> stock level to top up to when it runs low (sku-5 stays sold out on purpose)
RESTOCK = {"sku-1": 200, "sku-2": 120, "sku-3": 80, "sku-4": 40}
FRAMEWORK_AGENTS = ("purchasing", "lg-purchasing", "oa-purchasing")
FRAMEWORK_WEIGHTS = (70, 15, 15)
FRAMEWORK_AUTHORITY = [
    {"scope": s, "ttl_s": 3600} for s in ("inventory:*", "payments:charge", "notifications:*")
]

WEIGHTS = {
    "ok": 48,
    "approval": 9,
    "slow": 10,
    "ambiguous": 7,
    "rejected": 5,
    "declined": 4,
    "bad_address": 4,
    "refund": 13,
}


class Traffic:
    def __init__(
        self,
        client: Client,
        world: WorldClient,
        rng: random.Random,
        *,
        max_active: int,
        max_approvals: int,
        threshold: float,
        requester: Client | None = None,
    ):
        self.client, self.world, self.rng = client, world, rng
        # Four eyes: half the purchases that need an approval are started by a person (seed_demo's
        # rita, her own token), so the console shows her being refused deciding her own approval.
        self.requester = requester
        self.max_active, self.max_approvals, self.threshold = max_active, max_approvals, threshold
        self.refunded: set[str] = set()
        self.prices: dict[str, float] = {}
        self.made: dict[str, int] = {}
        self.backlogged: set[str | None] = set()

    # -- one tick ---------------------------------------------------------------------------------
    def tick(self) -> dict[str, Any] | None:
        """Create at most one run. Returns it, or None when the system is busy enough."""
        self.restock()
        active = self.client.list_runs(state=ACTIVE_STATES, limit=100)
        waiting = sum(1 for r in active if r.get("state") == "awaiting_approval")
        # Runs waiting for a human do not count against the cap (they are capped by --max-approvals):
        # unattended, they would otherwise fill it and the demo would stop producing runs.
        if len(active) - waiting >= self.max_active:
            log.debug("%d active runs: waiting", len(active) - waiting)
            return None
        # An agent with queued runs has every thread busy (e.g. all blocked on approvals nobody
        # gives): new framework runs go elsewhere instead of joining its queue.
        self.backlogged = {r.get("agent") for r in active if r.get("state") == "queued"}
        kinds = [k for k in WEIGHTS if not (k == "approval" and waiting >= self.max_approvals)]
        kind = self.rng.choices(kinds, [WEIGHTS[k] for k in kinds])[0]
        run = self.make(kind)
        if run is None and kind != "ok":
            kind, run = "ok", self.make("ok")
        if run is not None:
            self.made[kind] = self.made.get(kind, 0) + 1
            log.info("created %-11s run %s: %s", kind, run["id"], run.get("goal", ""))
        return run

    def make(self, kind: str) -> dict[str, Any] | None:
        if kind == "refund":
            return self.refund()
        name, email, address = self.rng.choice(CUSTOMERS)
        sku, (lo, hi) = self.rng.choice(PRICEY if kind == "approval" else CHEAP)
        qty = self.rng.randint(lo, hi)
        price = self.prices.get(sku) or 0
        if (
            price > 0
        ):  # keep each scenario on its side of the threshold, whatever the current prices are
            fits = int(self.threshold // price)
            qty = max(qty, fits + 1) if kind == "approval" else max(1, min(qty, fits))
        inp: dict[str, Any] = {
            "sku": sku,
            "qty": qty,
            "address": address,
            "email": email,
            "order": f"PO-{uuid.uuid4().hex[:8].upper()}",
            "customer": name,
            "scenario": kind,
        }
        if kind == "declined":
            inp["card"] = "4000000000000002"
        elif kind == "bad_address":
            inp["address"] = self.rng.choice(BAD_ADDRESSES)
        elif kind == "slow":
            system, action = self.rng.choice(
                [("inventory", "reserve"), ("shipping", "create_label")]
            )
            self.fault(system, "slow", action, delay_ms=1200)
        elif kind == "ambiguous":
            self.fault("payments", "timeout", "charge", delay_ms=3000)
        elif kind == "rejected":
            self.fault("payments", "reject", "charge")
        # Plain runs and approvals also go to the framework-built agents, so the console shows
        # governed LangGraph and OpenAI Agents SDK runs beside the SDK ones.
        agent = "purchasing"
        if kind in ("ok", "approval") and os.environ.get("DEMO_FRAMEWORK_AGENTS") == "1":
            agent = self.rng.choices(FRAMEWORK_AGENTS, FRAMEWORK_WEIGHTS)[0]
            if agent in self.backlogged:
                agent = "purchasing"
        creator, by = self.client, ""
        if kind == "approval" and self.requester is not None and self.rng.random() < 0.5:
            creator, by = self.requester, " (requested in person)"
        return creator.create_run(
            agent,
            f"buy {qty} x {sku} for {name} ({inp['order']}){by}",
            inp,
            versions=VERSIONS,
            authority=PURCHASE_AUTHORITY if agent == "purchasing" else FRAMEWORK_AUTHORITY,
        )

    def refund(self) -> dict[str, Any] | None:
        """A refund of a recent successful purchase's charge (read from the control plane's ledger)."""
        for run in self.client.list_runs(agent="purchasing", state="succeeded", limit=30):
            if run["id"] in self.refunded:
                continue
            self.refunded.add(run["id"])
            charge = next(
                (
                    e
                    for e in self.client.list_effects(run["id"])
                    if e.get("tool") == "payments"
                    and e.get("action") == "charge"
                    and e.get("status") == "committed"
                    and e.get("external_ref")
                ),
                None,
            )
            if charge is None:
                continue
            deadline = dt.datetime.now(dt.UTC) + dt.timedelta(minutes=15)
            inp = {
                "charge_id": charge["external_ref"],
                "source_run": run["id"],
                "reason": "customer returned the goods",
                "email": self.rng.choice(CUSTOMERS)[1],
            }
            return self.client.create_run(
                "refunds",
                f"refund charge {charge['external_ref']} (customer return)",
                inp,
                versions=VERSIONS,
                authority=REFUND_AUTHORITY,
                deadline=deadline.isoformat(),
            )
        return None

    # -- the world ----------------------------------------------------------------------------------
    def fault(self, system: str, kind: str, action: str, **kw: Any) -> None:
        pending = [
            f
            for f in self.world.faults()
            if f.get("system") == system and f.get("kind") == kind and f.get("action") == action
        ]
        if not pending:
            self.world.set_fault(system, kind, action=action, count=1, **kw)
            log.info("world fault: %s on the next %s/%s", kind, system, action)

    def restock(self) -> None:
        items = self.world.list_items()
        self.prices = {item["sku"]: float(item["price"]) for item in items}
        for item in items:
            target = RESTOCK.get(item["sku"])
            if target and int(item["stock"]) < target // 4:
                self.world.set_stock(item["sku"], target)
                log.info("restocked %s to %d", item["sku"], target)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m demo_agents.traffic", description="Keep producing demo runs."
    )
    parser.add_argument("--interval", type=float, default=env_float("TRAFFIC_INTERVAL_S", 4.0))
    parser.add_argument("--max-active", type=int, default=int(env_float("TRAFFIC_MAX_ACTIVE", 8)))
    parser.add_argument("--max-approvals", type=int, default=2)
    parser.add_argument(
        "--count", type=int, default=0, help="stop after creating N runs (0: run forever)"
    )
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s traffic %(levelname)s %(message)s",
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)

    stop = threading.Event()
    follow_deployed_versions()  # manage.py demo_bump_tool_version
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())

    client = Client(controlplane_url(), controlplane_token(), timeout=15)
    requester_token = os.environ.get("CONTROLPLANE_REQUESTER_TOKEN", "")
    requester = Client(controlplane_url(), requester_token, timeout=15) if requester_token else None
    world = WorldClient(world_url(), timeout=5)
    traffic = Traffic(
        client,
        world,
        random.Random(args.seed),
        max_active=args.max_active,
        max_approvals=args.max_approvals,
        threshold=env_float("APPROVAL_THRESHOLD", 200.0),
        requester=requester,
    )
    print(
        f"demo_agents.traffic started: a run every {args.interval:g}s, at most {args.max_active} active",
        flush=True,
    )
    created = 0
    try:
        while not stop.is_set() and (not args.count or created < args.count):
            try:
                if traffic.tick() is not None:
                    created += 1
            except (
                ControlPlaneError,
                WorldClientError,
            ) as err:  # a peer is still starting or restarting
                log.warning("tick skipped: %s", err)
            stop.wait(args.interval * traffic.rng.uniform(0.6, 1.4))
    finally:
        client.close()
        if requester is not None:
            requester.close()
        world.close()
    log.info("traffic stopped after %d runs: %s", created, traffic.made)
    return 0


if __name__ == "__main__":
    sys.exit(main())
