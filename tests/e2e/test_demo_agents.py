"""End to end: real agent worker processes complete purchases against a real ASGI server and the real
demo world, and the control plane's ledger matches the world's request record exactly.

Processes (all started here, all killed in ``finally``): ``daphne`` serving ``controlplane.asgi`` on the
*test* database, ``python -m world`` on a temporary SQLite file, and ``python -m demo_agents.worker``.
PostgreSQL only (the server subprocess must see the test database; SQLite's test file would do too,
but the suite runs on PostgreSQL). No Celery: nothing here needs a background job.
"""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from django.db import connection

from controlplane_sdk import Client
from tests.live import Procs, server_env, start_daphne, start_world, wait_for
from world.client import WorldClient

ROOT = Path(__file__).resolve().parents[2]
WORLD_SYSTEMS = {"inventory", "shipping", "payments", "notifications"}
PURCHASE_AUTHORITY = [
    {"scope": s, "ttl_s": 3600}
    for s in ("inventory:*", "shipping:*", "payments:charge", "notifications:*", "address:verify")
]
ADDRESS = "12 St James's Square, SW1Y 4JH London, UK"

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def _wait(predicate, timeout: float, what: str, interval: float = 0.2):
    return wait_for(what, predicate, timeout, interval)


@pytest.fixture(scope="module")
def stack(django_db_setup, django_db_blocker, tmp_path_factory):
    """daphne on the test database + the world, shared by the tests of this module."""
    if connection.vendor != "postgresql":
        pytest.skip("needs PostgreSQL (run via make test)")
    tmp = tmp_path_factory.mktemp("e2e-agents")
    env = server_env(tmp)
    procs = Procs(tmp)
    try:
        base = start_daphne(procs, env)
        world_url = start_world(procs, env)
        yield {"url": base, "world_url": world_url, "env": env, "procs": procs, "tmp": tmp}
    except BaseException:
        print(procs.logs())
        raise
    finally:
        procs.stop()


@pytest.fixture
def demo(stack, transactional_db):
    """Agents and a worker token seeded through the ORM, a reset world, and a starter for agent workers."""
    from django.contrib.auth.models import Group, User

    from core.actors import system_actor
    from core.roles import ROLES
    from runs.management.commands.seed_demo import DEMO_AGENTS, DEMO_APPROVALS
    from runs.models import ApiToken
    from runs.services.agents import register_agent

    for name, (scopes, description) in DEMO_AGENTS.items():
        register_agent(
            actor=system_actor("e2e"),
            name=name,
            scopes=scopes,
            description=description,
            approvals=DEMO_APPROVALS.get(name, []),
        )
    _, worker_secret = ApiToken.issue(
        kind=ApiToken.WORKER, name="e2e-agents", agents=list(DEMO_AGENTS)
    )
    for role in ROLES:
        Group.objects.get_or_create(name=role)
    otto = User.objects.create_user("otto", password="pw-otto")
    otto.groups.add(Group.objects.get(name="operator"))
    _, operator_secret = ApiToken.issue(kind=ApiToken.OPERATOR, name="otto-token", user=otto)
    april = User.objects.create_user("april", password="pw-april")
    april.groups.add(Group.objects.get(name="approver"))
    _, approver_secret = ApiToken.issue(kind=ApiToken.OPERATOR, name="april-token", user=april)

    world = WorldClient(stack["world_url"], timeout=5)
    world.reset()
    procs: Procs = stack["procs"]
    started: set[str] = set()
    agent_env = dict(
        stack["env"],
        CONTROLPLANE_URL=stack["url"],
        CONTROLPLANE_TOKEN=worker_secret,
        WORLD_URL=stack["world_url"],
        AGENT_WORLD_TIMEOUT_S="2",
        CHILD_TIMEOUT_S="60",
    )

    def start_workers(n: int) -> None:
        for i in range(1, n + 1):
            name = f"e2e-worker-{i}"
            procs.start(
                name,
                [
                    sys.executable,
                    "-m",
                    "demo_agents.worker",
                    "--name",
                    name,
                    "--poll",
                    "0.3",
                    "--agents",
                    "purchasing:2,address-verifier:1,refunds:1",
                ],
                agent_env,
            )
            started.add(name)

    client = Client(stack["url"], worker_secret, timeout=15)
    operator = Client(stack["url"], operator_secret, timeout=15)
    approver = Client(stack["url"], approver_secret, timeout=15)
    try:
        yield {
            "client": client,
            "operator": operator,
            "approver": approver,
            "world": world,
            "start_workers": start_workers,
            "procs": procs,
            "agent_env": agent_env,
        }
    except BaseException:
        print(procs.logs())
        raise
    finally:
        procs.stop(started)  # before the database is flushed
        for c in (client, operator, approver):
            c.close()
        world.clear_faults()
        world.close()


def _purchase(client: Client, sku: str, qty: int, **extra) -> dict:
    inp = {"sku": sku, "qty": qty, "address": ADDRESS, "email": "ada@example.com", **extra}
    return client.create_run(
        "purchasing",
        f"buy {qty} x {sku}",
        inp,
        versions={"code": "demo-agents 1.0.0"},
        authority=PURCHASE_AUTHORITY,
    )


def _wait_state(client: Client, run_id: str, states: set[str], timeout: float) -> dict:
    def check():
        run = client.get_run(run_id)
        return run if run["state"] in states else None

    try:
        return _wait(check, timeout, f"run {run_id} to reach {states}", interval=0.3)
    except AssertionError:
        raise AssertionError(
            f"run {run_id} is {client.get_run(run_id)['state']}, expected {states}"
        ) from None


def _assert_ledger_matches_world(world: WorldClient, allow_unknown: bool = False) -> int:
    """Every committed world-system effect in the ledger has exactly one committed request with its key in
    the world, and the world has no committed request the ledger does not know -- except, with
    ``allow_unknown``, under the key of an ``unknown`` effect (an ambiguous timeout the world did commit).
    Returns the number of committed effects."""
    from runs.models import Effect

    ledger = [
        e for e in Effect.objects.filter(decision=Effect.AUTHORIZED) if e.tool in WORLD_SYSTEMS
    ]
    committed = [e for e in ledger if e.status == Effect.COMMITTED]
    unknown = {(e.tool, e.idempotency_key) for e in ledger if e.status == Effect.UNKNOWN}
    odd = [
        (e.tool, e.action, e.status, e.outcome_detail)
        for e in ledger
        if not (
            e.status in (Effect.COMMITTED, Effect.FAILED)
            or (allow_unknown and e.status == Effect.UNKNOWN)
        )
    ]
    assert not odd, odd
    keys = Counter((e.tool, e.idempotency_key) for e in committed)
    assert all(n == 1 for n in keys.values()), f"duplicate committed keys in the ledger: {keys}"

    requests = [
        r for r in world.requests() if r["system"] in WORLD_SYSTEMS and r["method"] == "POST"
    ]
    world_committed = Counter(
        (r["system"], r["idempotency_key"]) for r in requests if r["committed"]
    )
    assert all(n == 1 for n in world_committed.values()), (
        f"a key committed twice in the world: {world_committed}"
    )
    for e in committed:
        mine = [
            r
            for r in requests
            if r["system"] == e.tool
            and r["idempotency_key"] == e.idempotency_key
            and r["committed"]
        ]
        assert len(mine) == 1, (e.tool, e.action, e.idempotency_key, mine)
        assert mine[0]["action"] == e.action
    assert set(world_committed) - unknown == set(keys), set(world_committed) ^ set(keys)
    return len(committed)


# -- the tests ---------------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_agent_processes_complete_purchases_and_the_ledger_matches_the_world(demo):
    from runs.models import Assumption, Effect, Run

    client, world = demo["client"], demo["world"]
    demo["start_workers"](2)
    orders = [
        ("sku-1", 2),
        ("sku-2", 1),
        ("sku-3", 3),
        ("sku-2", 8),
    ]  # the last is 240 EUR: needs approval
    runs = [_purchase(client, sku, qty) for sku, qty in orders]

    # the planned approval boundary: the run waits for a human, who approves exactly the charge asked for
    waiting = _wait_state(client, runs[3]["id"], {"awaiting_approval", "failed", "succeeded"}, 60)
    assert waiting["state"] == "awaiting_approval"
    [approval] = waiting["approvals"]
    assert (approval["tool"], approval["action"], approval["status"]) == (
        "payments",
        "charge",
        "pending",
    )
    demo["approver"].intervene(
        runs[3]["id"],
        "approve",
        reason="known customer, within budget",
        options={"approval_id": approval["id"]},
    )
    for run in runs:
        _wait_state(client, run["id"], {"succeeded", "failed"}, 60)
    states = {r["id"]: client.get_run(r["id"])["state"] for r in runs}
    assert set(states.values()) == {"succeeded"}, states

    for run, (sku, qty) in zip(runs, orders, strict=False):
        detail = client.get_run(run["id"])
        effects = [e for e in client.list_effects(run["id"]) if e["decision"] != "denied"]
        assert [(e["tool"], e["action"], e["status"]) for e in effects] == [
            ("inventory", "reserve", "committed"),
            ("shipping", "create_label", "committed"),
            ("payments", "charge", "committed"),
            ("notifications", "enqueue", "committed"),
        ]
        # reserve, label, charge can be undone; the customer notification is irreversible
        assert [bool(e["compensation"]) for e in effects] == [True, True, True, False]
        assert [e["irreversible"] for e in effects] == [False, False, False, True]
        assert detail["checkpoint"]["step"] == "notify"
        assert detail["checkpoint"]["state"]["charge_id"] == effects[2]["external_ref"]
        # the delegated child ran on some worker and succeeded with the delegated grant only
        [child] = detail["children"]
        assert child["agent"] == "address-verifier" and child["state"] == "succeeded"
        child_effects = client.list_effects(child["id"])
        assert [(e["tool"], e["action"], e["status"]) for e in child_effects] == [
            ("address", "verify", "committed")
        ]
        assert {g["scope"] for g in client.get_run(child["id"])["authority"]} == {"address:verify"}
        keys = set(Assumption.objects.filter(run_id=run["id"]).values_list("key", "checker"))
        assert keys == {(f"price:{sku}", "price"), (f"stock:{sku}", "stock")}
        assert effects[2]["args"]["amount"] == pytest.approx(
            {"sku-1": 12.5, "sku-2": 30.0, "sku-3": 7.25}[sku] * qty
        )

    # both worker processes took part (claims are spread by competition, not assigned)
    workers = {a["worker"] for r in runs for a in client.get_run(r["id"])["attempts"]}
    workers |= {
        a["worker"]
        for r in runs
        for c in client.get_run(r["id"])["children"]
        for a in client.get_run(c["id"])["attempts"]
    }
    assert workers <= {"e2e-worker-1", "e2e-worker-2"} and workers

    # the second shape: a refund of the first purchase's charge
    charge_id = client.get_run(runs[0]["id"])["checkpoint"]["state"]["charge_id"]
    refund = client.create_run(
        "refunds",
        f"refund {charge_id}",
        {"charge_id": charge_id, "email": "ada@example.com"},
        authority=[{"scope": "payments:refund"}, {"scope": "notifications:*"}],
    )
    assert _wait_state(client, refund["id"], {"succeeded", "failed"}, 30)["state"] == "succeeded"
    refund_effects = client.list_effects(refund["id"])
    assert [(e["tool"], e["action"], e["irreversible"]) for e in refund_effects] == [
        ("payments", "refund", True),
        ("notifications", "enqueue", True),
    ]

    # the ledger and the world agree exactly: same keys, one committed call each, nothing extra
    assert _assert_ledger_matches_world(world) == 4 * 4 + 2
    assert Counter(r["action"] for r in world.requests() if r["committed"]) == Counter(
        {"reserve": 4, "create_label": 4, "charge": 4, "enqueue": 5, "refund": 1}
    )
    counts = world.counts()  # the objects the world actually created: one per key
    assert (counts["charges"]["total"], counts["charges"]["refunded"]) == (4, 1)
    assert counts["reservations"]["total"] == counts["labels"]["total"] == 4
    assert all(n == 1 for n in counts["charges"]["by_key"].values())
    assert Run.objects.filter(state="succeeded").count() == 4 + 4 + 1
    approved = client.get_run(runs[3]["id"])["approvals"]
    assert [a["status"] for a in approved] == ["approved"]
    assert not Effect.objects.filter(status__in=Effect.UNRESOLVED).exists()


@pytest.mark.django_db(transaction=True)
def test_ambiguous_charge_timeout_leaves_unknown_effect_that_reconciliation_resolves(
    demo, settings
):
    from interventions.reconcile import auto_reconcile
    from runs.models import Effect

    client, world = demo["client"], demo["world"]
    # accept-then-time-out: the world commits the next charge but answers only after 3 s; agents wait 2 s
    world.set_fault("payments", "timeout", action="charge", count=1, delay_ms=3000)
    demo["start_workers"](1)
    run = _purchase(client, "sku-1", 1)
    detail = _wait_state(client, run["id"], {"failed", "succeeded"}, 60)
    assert detail["state"] == "failed"
    assert detail["attempts"][-1]["failure_class"] == "world_timeout"
    assert detail["checkpoint"]["step"] == "label"  # the durable boundary before the charge

    charge = Effect.objects.get(run_id=run["id"], tool="payments", action="charge")
    assert charge.status == Effect.UNKNOWN and not charge.reconciled
    key = charge.idempotency_key
    world_charges = [
        r for r in world.requests(system="payments", action="charge") if r["committed"]
    ]
    assert [r["idempotency_key"] for r in world_charges] == [
        key
    ]  # it did commit, the agent just never heard

    settings.WORLD_URL = world.base_url
    settings.WORLD_TIMEOUT_S = 3.0
    result = auto_reconcile(charge.pk)
    assert result["outcome"] == "committed", result
    charge.refresh_from_db()
    assert charge.status == Effect.COMMITTED and charge.reconciled
    assert charge.reconciliation["source"] == "reconciler"
    evidence = charge.reconciliation["evidence"]
    assert (
        evidence["answer"] == "committed"
        and evidence["committed"] is True
        and evidence["key"] == key
    )
    assert charge.external_ref and charge.external_ref.startswith("ch_")

    # retry: a new attempt reuses the key, the charge replays from the ledger, the run completes
    receipt = demo["operator"].intervene(
        run["id"], "retry", reason="charge reconciled as committed; finish the order"
    )
    assert receipt.get("status") in ("applied", "pending", "completed"), receipt
    done = _wait_state(client, run["id"], {"succeeded", "failed"}, 40)
    assert done["state"] == "succeeded", done["attempts"]
    assert len(done["attempts"]) == 2 and done["attempts"][0]["id"] != done["attempts"][1]["id"]
    assert done["checkpoint"]["state"]["charge_id"] == charge.external_ref
    assert Effect.objects.filter(run_id=run["id"], tool="payments", action="charge").count() == 1
    assert [
        r["idempotency_key"]
        for r in world.requests(system="payments", action="charge")
        if r["committed"]
    ] == [key]
    assert world.counts()["charges"]["by_key"] == {key: 1}
    assert _assert_ledger_matches_world(world) == 4


@pytest.mark.django_db(transaction=True)
def test_traffic_generator_produces_a_mix_that_worker_processes_handle(demo):
    """``python -m demo_agents.traffic`` creates runs with the worker token; the workers take them to an end
    state (or to a human approval), and stop cleanly on SIGTERM even with a run waiting for approval."""
    from runs.models import Run

    _client, world = demo["client"], demo["world"]
    demo["start_workers"](2)
    traffic = subprocess.run(
        [
            sys.executable,
            "-m",
            "demo_agents.traffic",
            "--count",
            "8",
            "--interval",
            "0.4",
            "--seed",
            "11",
            "--max-active",
            "8",
        ],
        cwd=ROOT,
        env=demo["agent_env"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert traffic.returncode == 0, traffic.stdout + traffic.stderr
    assert "traffic stopped after 8 runs" in traffic.stderr, traffic.stderr

    top = Run.objects.filter(parent__isnull=True)
    assert top.count() == 8
    scenarios = Counter(r.input.get("scenario", "refund") for r in top)
    assert scenarios["ok"] >= 1, scenarios

    settled = {"succeeded", "failed", "awaiting_approval"}
    _wait(
        lambda: (
            set(Run.objects.filter(parent__isnull=True).values_list("state", flat=True)) <= settled
        ),
        60,
        "every generated run to finish or wait for a human",
    )
    for run in Run.objects.filter(parent__isnull=True).select_related("agent"):
        want = {
            "approval": {"awaiting_approval"},
            "declined": {"failed"},
            "bad_address": {"failed"},
            "ok": {"succeeded", "failed"},
        }.get(run.input.get("scenario"), settled)
        # "ok" may still fail: a fault injected for another scenario lands on whichever run calls next
        assert run.state in want, (run.input, run.state)
    _assert_ledger_matches_world(world, allow_unknown=True)

    codes = demo["procs"].stop({"e2e-worker-1", "e2e-worker-2"})
    assert codes == {"e2e-worker-1": 0, "e2e-worker-2": 0}, codes
