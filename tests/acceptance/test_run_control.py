"""The operator's run-control test (docs/operator/scenarios.md): scenarios 1-11 against the live system --
daphne, a Celery worker with beat, the demo world and real agent worker processes (demo_agents.worker),
on PostgreSQL and Redis. Every fact is read back from recorded data and written to the report
(reports/run-control.html and .json)."""

from __future__ import annotations

import time
from collections import Counter

import pytest

from demo_agents.common import VERSIONS
from tests.acceptance.report import scenario
from tests.live import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240), pytest.mark.django_db(transaction=True)]

ADDRESS = "12 St James's Square, SW1Y 4JH London, UK"
AUTHORITY = [
    {"scope": s, "ttl_s": 3600}
    for s in ("inventory:*", "shipping:*", "payments:charge", "notifications:*", "address:verify")
]


def purchase(live, sku: str = "sku-1", qty: int = 2) -> dict:
    resp = live["worker"].post(
        "/runs",
        {
            "agent": "purchasing",
            "goal": f"buy {qty} x {sku}",
            "input": {"sku": sku, "qty": qty, "address": ADDRESS, "email": "ada@example.com"},
            "versions": VERSIONS,
            "authority": AUTHORITY,
        },
    )
    assert resp.status_code == 201, resp.text
    return resp.json()


def effect(api, run_id: str, tool: str, action: str, status: str | None = None) -> dict | None:
    for e in api.effects(run_id):
        if (
            e["tool"] == tool
            and e["action"] == action
            and e["decision"] == "authorized"
            and (status is None or e["status"] == status)
        ):
            return e
    return None


def wait_effect(api, run_id: str, tool: str, action: str, status: str, timeout: float = 60) -> dict:
    return wait_for(
        f"{tool}:{action} {status}", lambda: effect(api, run_id, tool, action, status), timeout, 0.1
    )


def wait_state(api, run_id: str, states: set[str], timeout: float = 60) -> dict:
    return wait_for(
        f"run in {states}", lambda: (r := api.run(run_id))["state"] in states and r, timeout, 0.2
    )


def world_commits(world, system: str, key: str) -> int:
    return sum(
        1
        for r in world.requests(system=system, key=key)
        if r["committed"] and r["method"] == "POST"
    )


def assert_no_duplicates(api, world, run_id: str) -> dict:
    ledger = [
        e for e in api.effects(run_id) if e["decision"] == "authorized" and e["tool"] != "address"
    ]
    keys = Counter(e["idempotency_key"] for e in ledger)
    per_key = {
        e["idempotency_key"]: world_commits(world, e["tool"], e["idempotency_key"])
        for e in ledger
        if e["status"] == "committed"
    }
    assert all(n == 1 for n in keys.values()) and all(n == 1 for n in per_key.values()), (
        keys,
        per_key,
    )
    return per_key


def audit_verifies(live) -> dict:
    result = live["people"]["ian"].get("/audit/verify").json()
    assert result["ok"], result
    return result


def test_scenarios_1_and_2_pause_during_inflight_effect_then_resume_after_the_world_changes(live):
    s1 = scenario(1, "Pause during an in-flight side effect")
    worker, world, otto, ian = (
        live["worker"],
        live["world"],
        live["people"]["otto"],
        live["people"]["ian"],
    )
    live["start_workers"](1)
    world.set_fault("payments", "slow", action="charge", count=1, delay_ms=4000)
    run = purchase(live)
    rid = run["id"]
    charge = wait_effect(worker, rid, "payments", "charge", "in_flight")
    token = worker.run(rid)["fencing_token"]
    # The run sets a timer (as its SDK would) that falls due while it is paused.
    assert (
        worker.post(
            f"/runs/{rid}/events",
            {
                "fencing_token": token,
                "events": [{"kind": "timer_set", "data": {"name": "payment_reminder", "in_s": 2}}],
            },
        ).status_code
        == 201
    )

    narrow = otto.preview(rid, "pause", scope="run")
    s1.fact(
        "children listed, not in scope when scope=run",
        narrow["children"],
        "POST interventions/preview scope=run",
    )
    assert narrow["children"] and not any(c["in_scope"] for c in narrow["children"])
    resp = otto.intervene(rid, "pause", "price feed looks stale; hold spending", scope="tree")
    assert resp.status_code == 202, resp.text
    receipt = resp.json()["receipt"]
    s1.fact("children listed with scope=tree", receipt["children_listed"], "pause receipt")
    assert all(c["in_scope"] for c in receipt["children_listed"])
    s1.fact(
        "in-flight charge named as may still complete",
        receipt["in_flight_effects"],
        "pause receipt",
    )
    assert [e["id"] for e in receipt["in_flight_effects"]] == [charge["id"]]
    assert "may still complete" in receipt["in_flight_effects"][0]["note"]
    s1.fact("authority grants still active, with expiry", receipt["authority"], "pause receipt")
    assert {g["scope"] for g in receipt["authority"]} >= {"payments:charge", "inventory:*"}
    s1.fact("checkpoint a resume would start from", receipt["resume_from"], "pause receipt")
    assert receipt["resume_from"]["step"] == "label"

    denied = worker.post(
        f"/runs/{rid}/effects",
        {
            "fencing_token": token,
            "step": "notify",
            "tool": "notifications",
            "action": "enqueue",
            "idempotency_key": f"{rid}:late-notify",
            "args": {"to": "ada@example.com"},
        },
    )
    s1.fact(
        "a declaration after the pause commits is denied, with the reason",
        denied.json(),
        "POST /runs/{id}/effects",
    )
    assert denied.status_code == 409 and denied.json()["reason"] == "run_paused"
    late = wait_effect(worker, rid, "payments", "charge", "committed", timeout=30)
    s1.fact(
        "the in-flight charge's late outcome is recorded after the pause",
        late,
        "GET /runs/{id}/effects",
    )
    assert late["late"] is True
    paused = wait_state(worker, rid, {"paused"}, 30)
    history = worker.history(rid)["events"]
    fired = [e for e in history if e["kind"] == "timer_fired"]
    fired = fired or wait_for(
        "timer to fire",
        lambda: [e for e in worker.history(rid)["events"] if e["kind"] == "timer_fired"],
        15,
    )
    s1.fact("a timer fired during the pause and was recorded", fired, "GET /runs/{id}/history")
    assert fired[0]["data"]["run_state"] in ("pausing", "paused")
    audit = ian.get("/audit", action="intervention.pause", run_id=rid).json()["events"]
    s1.fact(
        "who paused and why",
        [{k: a[k] for k in ("actor", "role", "reason", "outcome")} for a in audit],
        "GET /audit",
    )
    assert audit[0]["actor"] == "otto" and audit[0]["reason"].startswith("price feed")
    s1.fact(
        "run is paused, lease released",
        {"state": paused["state"], "leases": paused["leases"][:1]},
        "GET /runs/{id}",
    )

    s2 = scenario(2, "Resume after the world changes")
    world.set_price("sku-1", 14.0)
    # A new deployment of the agent replaces the old one and bumps the payments tool; its first claim
    # reports the new versions.
    live["procs"].stop({"acc-worker-1"})
    live["start_workers"](1, AGENT_TOOL_VERSIONS="payments=3.2")
    other = purchase(live, "sku-3", 1)
    wait_for(
        "the new worker to claim",
        lambda: any(a["worker"] == "acc-worker-2" for a in worker.run(other["id"])["attempts"]),
        30,
    )
    blocked = otto.intervene(rid, "resume", "price rechecked by on-call")
    assert blocked.status_code == 202, blocked.text
    job = wait_for(
        "revalidation",
        lambda: (
            (i := otto.get(f"/interventions/{blocked.json()['id']}").json())["status"] != "pending"
            and i
        ),
        30,
    )
    report = job["receipt"]["job"]["report"]
    checks = {c["name"]: c for c in report["checks"]}
    s2.fact("revalidation report: six checks", report, "GET /interventions/{id}")
    s2.fact("durable boundary named", checks["boundary"]["details"], "revalidation report")
    assert checks["boundary"]["details"]["step"] in ("label", "charge")
    s2.fact("version difference", checks["versions"]["details"]["diff"], "revalidation report")
    assert {"name": "tools.payments", "then": "3.1", "now": "3.2"} in checks["versions"]["details"][
        "diff"
    ]
    s2.fact("stale assumption", checks["assumptions"]["details"]["stale"], "revalidation report")
    assert any(
        a["key"] == "price:sku-1" and a["current"] == 14.0
        for a in checks["assumptions"]["details"]["stale"]
    )
    s2.fact("authority available now", checks["authority"]["details"], "revalidation report")
    s2.fact(
        "steps that will run again and their idempotency protection",
        checks["replay"],
        "revalidation report",
    )
    assert checks["replay"]["ok"]
    assert job["status"] == "failed" and worker.run(rid)["state"] == "paused", (
        job["status"],
        report["ok"],
        report["failing"],
        worker.run(rid)["state"],
    )
    s2.fact(
        "resume blocked while checks fail",
        {"status": job["status"], "failing": report["failing"]},
        "GET /interventions/{id}",
    )
    refused = otto.intervene(rid, "resume", "ship it anyway", override_reason="I say so")
    s2.fact("an operator may not override", refused.json(), "POST interventions")
    assert refused.status_code == 403
    ok = ian.intervene(
        rid,
        "resume",
        "price rise within the customer's quote; payments 3.2 is compatible",
        override_reason="incident commander accepts the price change and the tool bump",
    )
    assert ok.status_code == 202, ok.text
    done = wait_for(
        "override resume",
        lambda: (
            (i := ian.get(f"/interventions/{ok.json()['id']}").json())["status"] != "pending" and i
        ),
        30,
    )
    s2.fact(
        "override recorded with a reason",
        {k: done[k] for k in ("actor", "override", "override_reason", "status")},
        "GET /interventions/{id}",
    )
    assert done["status"] == "completed" and done["override"]
    final = wait_state(worker, rid, {"succeeded", "failed"}, 60)
    assert final["state"] == "succeeded", final
    s2.fact(
        "after resume the run completes from the boundary, attempt 2",
        final["attempts"],
        "GET /runs/{id}",
    )
    s2.fact(
        "no effect duplicated: each committed key committed once in the world",
        assert_no_duplicates(worker, world, rid),
        "ledger vs world /admin/requests",
    )
    s2.fact("audit chain verifies", audit_verifies(live), "GET /audit/verify")


def test_scenario_3_cancel_after_one_effect_commits(live):
    s3 = scenario(3, "Cancel after one effect commits")
    worker, world, otto = live["worker"], live["world"], live["people"]["otto"]
    live["start_workers"](1)
    world.set_fault("shipping", "slow", action="create_label", count=1, delay_ms=3000)
    run = purchase(live)
    rid = run["id"]
    reserve = wait_effect(worker, rid, "inventory", "reserve", "committed")
    resp = otto.intervene(rid, "cancel", "customer withdrew the order", scope="tree")
    assert resp.status_code == 202, resp.text
    receipt = resp.json()["receipt"]
    s3.fact(
        "reservation listed as committed, with its compensation",
        receipt["committed_effects"],
        "cancel receipt",
    )
    assert receipt["committed_effects"][0]["id"] == reserve["id"]
    assert receipt["committed_effects"][0]["compensation"]["action"] == "release"
    final = wait_state(worker, rid, {"cancelled"}, 60)
    ledger = worker.effects(rid)
    later = [
        e
        for e in ledger
        if e["tool"] in ("payments", "notifications") and e["decision"] == "authorized"
    ]
    s3.fact(
        "no later step executed (charge, notify never authorised)", later, "GET /runs/{id}/effects"
    )
    assert later == []
    label = effect(worker, rid, "shipping", "create_label")
    if (
        label is not None
    ):  # in flight when the cancel committed: may complete, and is reported as such
        s3.fact("a label already in flight at the cancel", label, "GET /runs/{id}/effects")
    still = effect(worker, rid, "inventory", "reserve")
    s3.fact("the reservation is still committed in the ledger", still, "GET /runs/{id}/effects")
    assert still["status"] == "committed" and still["compensation_status"] is None
    held = world.requests(system="inventory", key=reserve["idempotency_key"])
    s3.fact(
        "the world still holds the reservation (nothing claims it disappeared)",
        held,
        "world /admin/requests",
    )
    assert sum(1 for r in held if r["committed"]) == 1
    assert not [r for r in world.requests(system="inventory", action="release") if r["committed"]]
    s3.fact("run cancelled", final["state"], "GET /runs/{id}")
    s3.fact("audit chain verifies", audit_verifies(live), "GET /audit/verify")


def test_scenario_4_retry_an_ambiguous_timeout(live):
    s4 = scenario(4, "Retry an ambiguous timeout")
    worker, world, otto = live["worker"], live["world"], live["people"]["otto"]
    live["start_workers"](
        1, AGENT_WORLD_TIMEOUT_S="2"
    )  # the world answers after 4 s: the agent gives up first
    world.set_fault("payments", "timeout", action="charge", count=1, delay_ms=4000)
    rid = purchase(live)["id"]
    failed = wait_state(worker, rid, {"failed"}, 60)
    charge = effect(worker, rid, "payments", "charge")
    s4.fact("the charge is unknown after the timeout", charge, "GET /runs/{id}/effects")
    assert (
        charge["status"] == "unknown" and failed["attempts"][-1]["failure_class"] == "world_timeout"
    )
    refused = otto.intervene(rid, "retry", "transient timeout")
    s4.fact("retry refused until reconciled", refused.json(), "POST interventions kind=retry")
    assert refused.status_code == 409 and refused.json()["error"] == "effects_unresolved"
    rec = otto.intervene(rid, "reconcile", "ask payments whether the charge went through")
    done = wait_for(
        "reconciliation",
        lambda: (
            (i := otto.get(f"/interventions/{rec.json()['id']}").json())["status"] != "pending"
            and i
        ),
        30,
    )
    settled = effect(worker, rid, "payments", "charge")
    s4.fact(
        "reconciliation asked the world by idempotency key and found the charge",
        settled["reconciliation"],
        "GET /runs/{id}/effects",
    )
    assert (
        done["status"] == "completed" and settled["status"] == "committed" and settled["reconciled"]
    )
    ok = otto.intervene(rid, "retry", "charge confirmed by the processor; finish the order")
    assert ok.status_code == 202, ok.text
    final = wait_state(worker, rid, {"succeeded", "failed"}, 60)
    assert final["state"] == "succeeded", final
    a1, a2 = final["attempts"][0], final["attempts"][-1]
    s4.fact("the new attempt has its own id", {"first": a1, "retry": a2}, "GET /runs/{id}")
    assert a1["id"] != a2["id"] and a2["number"] == 2
    replay = effect(worker, rid, "payments", "charge")
    s4.fact(
        "it reused the key",
        {"key": replay["idempotency_key"], "attempt": replay["attempt_id"]},
        "GET /runs/{id}/effects",
    )
    assert replay["idempotency_key"] == charge["idempotency_key"]
    charges = world_commits(world, "payments", charge["idempotency_key"])
    s4.fact("the world holds exactly one charge", charges, "world /admin/requests")
    assert (
        charges == 1
        and len([r for r in world.requests(system="payments", action="charge") if r["committed"]])
        == 1
    )
    s4.fact("audit chain verifies", audit_verifies(live), "GET /audit/verify")


def test_scenario_5_compensate_a_partially_completed_run(live):
    s5 = scenario(5, "Compensate a partially completed run")
    worker, world, ian = live["worker"], live["world"], live["people"]["ian"]
    live["start_workers"](1)
    rid = purchase(live)["id"]
    assert wait_state(worker, rid, {"succeeded", "failed"}, 60)["state"] == "succeeded"
    world.set_fault("payments", "reject", action="refund", count=1)  # the first refund fails
    preview = ian.preview(rid, "compensate")
    s5.fact(
        "ledger of completed effects and available compensations, in reverse order",
        preview["plan"],
        "preview",
    )
    resp = ian.intervene(rid, "compensate", "order placed against a stale price; unwind it")
    assert resp.status_code == 202, resp.text
    done = wait_for(
        "the plan to finish",
        lambda: (
            (i := ian.get(f"/interventions/{resp.json()['id']}").json())["status"] != "pending"
            and i.get("receipt", {}).get("job")
            and i
        ),
        90,
    )
    plan = done["receipt"]["job"]["plan"]
    order = [f"{s['tool']}:{s['action']}" for s in plan["steps"]]
    s5.fact("reverse execution order", order, "compensation plan")
    assert (
        order.index("payments:charge")
        < order.index("shipping:create_label")
        < order.index("inventory:reserve")
    )
    refund = next(s for s in plan["steps"] if s["action"] == "charge")
    s5.fact(
        "the injected refund failure was recorded and retried", refund, "compensation plan step"
    )
    assert refund["status"] == "done" and refund["attempts"] >= 2 and refund["failures"]
    s5.fact("irreversible / called-out actions", plan["called_out"], "compensation plan")
    # The customer notification is declared irreversible: called out, never attempted, so a normal
    # compensation ends completed rather than partially_failed on an "already sent" cancel.
    assert [(c["tool"], c["action"], c["irreversible"]) for c in plan["called_out"]] == [
        ("notifications", "enqueue", True)
    ]
    assert all(s["tool"] != "notifications" for s in plan["steps"])
    s5.fact("final plan status", done["receipt"]["job"]["plan_status"], "GET /interventions/{id}")
    assert done["receipt"]["job"]["plan_status"] == "completed"
    undo = {}
    for step in plan["steps"]:
        undo[f"{step['compensation']['tool']}:{step['compensation']['action']}"] = world_commits(
            world, step["compensation"]["tool"], step["compensation_key"]
        )
    s5.fact(
        "reservation released, label voided, charge refunded — each exactly once in the world",
        undo,
        "world /admin/requests",
    )
    assert undo == {"inventory:release": 1, "shipping:void_label": 1, "payments:refund": 1}
    s5.fact("audit chain verifies", audit_verifies(live), "GET /audit/verify")


def test_scenario_6_transfer_ownership_under_pressure(live):
    s6 = scenario(6, "Transfer ownership under pressure")
    worker, people = live["worker"], live["people"]
    otto, ian, sam = people["otto"], people["ian"], people["sam"]
    live["start_workers"](1)
    rid = purchase(live, "sku-2", 8)["id"]  # 240: above the approval threshold
    wait_state(worker, rid, {"awaiting_approval"}, 60)
    take = otto.intervene(
        rid,
        "transfer",
        "on-call takes the run from the agent's lane",
        options={"to": "otto", "facets": ["assignment", "decision_authority"]},
    )
    assert take.status_code == 202, take.text
    s6.fact(
        "on-call takes assignment and decision authority",
        take.json()["receipt"]["records"],
        "transfer receipt",
    )
    hand = ian.intervene(
        rid,
        "transfer",
        "payments specialist takes the decision",
        options={"to": "olga", "facets": ["decision_authority"]},
        override_reason="incident commander reassigns during the incident",
    )
    assert hand.status_code == 202, hand.text
    r = hand.json()["receipt"]
    s6.fact(
        "separate records for assignment, execution lease and decision authority",
        r["after"],
        "transfer receipt",
    )
    assert r["after"]["assignment"] == "otto" and r["after"]["decision_authority"] == "olga"
    s6.fact(
        "reason and overriding actor",
        {
            "reason": hand.json()["reason"],
            "overriding_actor": r["overriding_actor"],
            "override_reason": hand.json()["override_reason"],
        },
        "transfer receipt",
    )
    assert r["overriding_actor"] == "ian"
    s6.fact(
        "unresolved effects and pending decisions at handoff",
        {
            "unresolved_effects": r["unresolved_effects"],
            "pending_approvals": r["pending_approvals"],
        },
        "transfer receipt",
    )
    assert r["pending_approvals"]
    revoke = sam.intervene(
        rid,
        "revoke_authority",
        "card processor incident: no more charges",
        options={"scope": "payments:charge"},
    )
    s6.fact("security responder revokes a grant", revoke.json()["receipt"], "revoke receipt")
    assert revoke.status_code == 202, revoke.text
    conflict = otto.intervene(rid, "cancel", "I still think we should cancel")
    s6.fact(
        "a conflicting action by the former owner is rejected",
        conflict.json(),
        "POST interventions",
    )
    assert conflict.status_code == 403 and conflict.json()["error"] == "not_decision_authority"
    s6.fact("who may now resume, cancel, compensate or close", r["who_may_now"], "transfer receipt")
    denied = ian.get("/audit", run_id=rid, outcome="denied").json()["events"]
    assert any(e["actor"] == "otto" and e["action"] == "intervention.cancel" for e in denied)
    s6.fact("audit chain verifies", audit_verifies(live), "GET /audit/verify")


def test_scenario_7_recover_after_a_worker_disappears(live):
    s7 = scenario(7, "Recover after a worker disappears")
    worker, world, ian = live["worker"], live["world"], live["people"]["ian"]
    first, second = live["start_workers"](2)
    world.set_fault("payments", "slow", action="charge", count=1, delay_ms=3000)
    rid = purchase(live)["id"]
    charge = wait_effect(worker, rid, "payments", "charge", "in_flight")
    run = worker.run(rid)
    holder, old_token = run["leases"][0]["worker"], run["fencing_token"]
    live["procs"].sigkill(holder)  # between dispatching the charge and recording its outcome
    s7.fact(
        "worker killed with SIGKILL while the charge was in flight",
        {"worker": holder, "effect": charge["id"]},
        "test harness",
    )
    orphaned = wait_for(
        "orphan detection",
        lambda: [
            e
            for e in worker.history(rid)["events"]
            if e["kind"] == "state_changed" and e["data"]["to"] == "orphaned"
        ],
        30,
    )
    s7.fact(
        "the lease expired and the run was detected as orphaned",
        orphaned[0],
        "GET /runs/{id}/history",
    )
    final = wait_state(worker, rid, {"succeeded", "failed", "paused"}, 90)
    recoveries = [
        i
        for i in ian.get(f"/runs/{rid}/interventions").json()["interventions"]
        if i["kind"] == "recover"
    ]
    report = recoveries[0]["receipt"]["job"]["report"]
    s7.fact("state rebuilt from checkpoint + history", report["rebuilt"], "recovery report")
    s7.fact("history chain verifies", report["history"], "recovery report")
    assert report["history"]["ok"]
    s7.fact("versions checked", report["versions"], "recovery report")
    s7.fact(
        "orphaned effect reconciled with the world", report["reconciliation"], "recovery report"
    )
    assert any(x.get("outcome") == "committed" for x in report["reconciliation"])
    s7.fact("chosen next action and why it is safe", report["decision"], "recovery report")
    assert report["decision"]["action"] == "redrive" and report["decision"]["why"]
    zombie = worker.post(
        f"/runs/{rid}/effects",
        {
            "fencing_token": old_token,
            "step": "notify",
            "tool": "notifications",
            "action": "enqueue",
            "idempotency_key": f"{rid}:zombie",
            "args": {},
        },
    )
    s7.fact(
        "a zombie write with the dead worker's fencing token is refused",
        zombie.json(),
        "POST /runs/{id}/effects",
    )
    assert zombie.status_code == 409 and zombie.json()["reason"] == "lease_lost"
    assert final["state"] == "succeeded", final
    s7.fact("the run completes on another worker", final["attempts"], "GET /runs/{id}")
    assert final["attempts"][-1]["worker"] != holder
    s7.fact(
        "no duplicated effect",
        assert_no_duplicates(worker, world, rid),
        "ledger vs world /admin/requests",
    )
    s7.fact("audit chain verifies", audit_verifies(live), "GET /audit/verify")


def test_scenario_8_hold_intake_during_an_incident(live):
    s8 = scenario(8, "Hold intake for an agent, then release it")
    worker, ian = live["worker"], live["people"]["ian"]
    live["start_workers"](1)
    shown = ian.post("/intake/holds/preview", {"scope": "agent", "target": "purchasing"}).json()
    s8.fact(
        "the hold's preview: what it covers, what continues", shown, "POST /intake/holds/preview"
    )
    resp = ian.post(
        "/intake/holds",
        {
            "scope": "agent",
            "target": "purchasing",
            "reason": "card processor flapping",
            "preview_digest": shown["digest"],
        },
    )
    assert resp.status_code == 202, resp.text
    hold = resp.json()
    s8.fact("the hold's receipt", hold["receipt"], "POST /intake/holds")
    rid = purchase(live)["id"]
    time.sleep(3)  # a worker is long-polling for purchasing all along
    s8.fact("the new run is accepted and stays queued", worker.run(rid)["state"], "GET /runs/{id}")
    assert worker.run(rid)["state"] == "queued" and worker.run(rid)["attempts"] == []
    seen = ian.get("/intake").json()
    s8.fact("the held queue with its age", seen["queued"], "GET /intake")
    assert seen["queued"]["runs"][0]["id"] == rid and seen["queued"]["runs"][0]["age_s"] >= 3
    rel = ian.post(f"/intake/holds/{hold['id']}/release", {"reason": "processor stable again"})
    assert rel.status_code == 200, rel.text
    s8.fact("the release's receipt", rel.json()["receipt"]["release"], "POST .../release")
    final = wait_state(worker, rid, {"succeeded", "failed"}, 60)
    s8.fact("released: the run is claimed and completes", final["state"], "GET /runs/{id}")
    assert final["state"] == "succeeded"
    audit = ian.get("/audit", object_type="intake_hold").json()["events"]
    actions = sorted(a["action"] for a in audit)
    s8.fact("both decisions audited", actions, "GET /audit")
    assert actions == ["intervention.hold_intake", "intervention.release_intake"]
    s8.fact("audit chain verifies", audit_verifies(live), "GET /audit/verify")


def test_scenario_9_redrive_a_cancelled_run_from_a_chosen_checkpoint(live):
    s9 = scenario(9, "Redrive a cancelled run from a chosen checkpoint")
    worker, world, otto = live["worker"], live["world"], live["people"]["otto"]
    live["start_workers"](1)
    world.set_fault("shipping", "slow", action="create_label", count=1, delay_ms=3000)
    rid = purchase(live)["id"]
    wait_effect(worker, rid, "inventory", "reserve", "committed")
    assert otto.intervene(rid, "cancel", "customer called: wrong address").status_code == 202
    wait_state(worker, rid, {"cancelled"}, 60)
    wait_for(
        "every effect's outcome known",
        lambda: all(e["status"] not in ("in_flight", "unknown") for e in worker.effects(rid)),
        30,
    )
    first = otto.preview(rid, "redrive")
    cp = next(c for c in first["checkpoints"] if c["step"] == "reserve")
    shown = otto.preview(rid, "redrive", options={"checkpoint_seq": cp["seq"]})
    s9.fact("the chosen checkpoint", shown["redrive_from"], "redrive preview")
    s9.fact(
        "every effect committed after it: compensation, reversible, what re-executes under which key",
        shown["committed_after"],
        "redrive preview",
    )
    assert all(r["choice"] == "keep" and r["idempotency_key"] for r in shown["committed_after"])
    assert all("reserve" != r["step"] for r in shown["committed_after"])
    resp = otto.intervene(
        rid,
        "redrive",
        "address corrected; carry on from the reservation",
        options={"checkpoint_seq": cp["seq"]},
        preview_digest=shown["digest"],
    )
    assert resp.status_code == 202, resp.text
    s9.fact("the redrive's receipt", resp.json()["receipt"], "POST interventions")
    final = wait_state(worker, rid, {"succeeded", "failed"}, 90)
    assert final["state"] == "succeeded", final["state"]
    started = [e for e in worker.history(rid)["events"] if e["kind"] == "attempt_started"]
    s9.fact("the new attempt starts from that checkpoint", started[-1]["data"], "GET history")
    assert started[-1]["data"]["checkpoint"] == cp["seq"]
    s9.fact(
        "each effect exactly once in the world (kept effects replayed)",
        assert_no_duplicates(worker, world, rid),
        "world /admin/requests",
    )
    s9.fact("audit chain verifies", audit_verifies(live), "GET /audit/verify")


def test_scenario_10_two_cancels_never_force_terminate_stops_waiting(live):
    s10 = scenario(10, "Two cancels at once; terminate stops waiting for a stuck worker")
    worker, world = live["worker"], live["world"]
    otto, olga, ian = (live["people"][n] for n in ("otto", "olga", "ian"))
    live["start_workers"](1)
    world.set_fault("payments", "slow", action="charge", count=1, delay_ms=15000)
    rid = purchase(live)["id"]
    charge = wait_effect(worker, rid, "payments", "charge", "in_flight")
    seen = otto.preview(rid, "cancel", "customer withdrew")
    first = otto.intervene(rid, "cancel", "customer withdrew", preview_digest=seen["digest"])
    assert first.status_code == 202, first.text
    s10.fact("the first cancel moves the run to cancelling", first.json()["receipt"], "receipt")
    assert first.json()["receipt"]["state"] == "cancelling"
    second = olga.intervene(rid, "cancel", "stop it", preview_digest=seen["digest"])
    s10.fact("a second operator's cancel is refused, naming the first", second.json(), "409")
    assert second.status_code == 409, second.text
    assert second.json()["existing_cancel"]["intervention"] == first.json()["id"]
    again = otto.intervene(rid, "cancel", "customer withdrew", preview_digest=seen["digest"])
    s10.fact("the same operator's same request gets the original receipt", again.json(), "200")
    assert again.status_code == 200 and again.json()["id"] == first.json()["id"]
    still = worker.run(rid)
    assert still["state"] == "cancelling" and still["leases"][0]["status"] == "active"
    s10.fact("still cancelling, the worker's lease live: nothing forced", still["leases"][0], "run")

    shown = ian.preview(rid, "terminate", "the charge call hangs")
    s10.fact("terminate's preview names what becomes unknown", shown["become_unknown"], "preview")
    assert [e["id"] for e in shown["become_unknown"]] == [charge["id"]]
    done = ian.intervene(rid, "terminate", "the charge call hangs", preview_digest=shown["digest"])
    assert done.status_code == 202, done.text
    receipt = done.json()["receipt"]
    s10.fact("terminate's receipt: lease ended, effect to reconcile", receipt, "receipt")
    assert receipt["state"] == "cancelled" and receipt["must_reconcile"] == [charge["id"]]
    now = effect(worker, rid, "payments", "charge")
    s10.fact("the in-flight charge is unknown, not assumed", now, "GET /runs/{id}/effects")
    assert now["status"] in ("unknown", "committed")  # the worker may report it at once
    late = wait_for(
        "the worker's late outcome",
        lambda: (e := effect(worker, rid, "payments", "charge")) and e["stale_lease"] and e,
        40,
        0.5,
    )
    s10.fact("the worker's late report is recorded, flagged stale", late, "GET /runs/{id}/effects")
    assert worker.run(rid)["state"] == "cancelled"
    denials = [
        e
        for e in ian.get("/audit", run_id=rid, action="intervention.cancel").json()["events"]
        if e["outcome"] == "denied"
    ]
    s10.fact("the refused cancel is audited", denials, "GET /audit")
    assert len(denials) == 1
    s10.fact("no duplicated effect", assert_no_duplicates(worker, world, rid), "ledger vs world")
    s10.fact("audit chain verifies", audit_verifies(live), "GET /audit/verify")


def test_scenario_11_redrive_compensating_first_then_doing_it_again_under_a_new_key(live):
    s11 = scenario(11, "Redrive a failed run from a checkpoint, compensating an effect first")
    worker, world, otto = live["worker"], live["world"], live["people"]["otto"]
    live["start_workers"](1)
    world.set_fault("payments", "reject", action="charge", count=1, status=402)
    rid = purchase(live)["id"]
    failed = wait_state(worker, rid, {"failed", "succeeded"}, 90)
    assert failed["state"] == "failed", failed["state"]
    label = effect(worker, rid, "shipping", "create_label", "committed")
    assert label is not None and effect(worker, rid, "payments", "charge", "failed")
    s11.fact("the run failed at the declined charge, the label committed", label, "GET effects")
    first = otto.preview(rid, "redrive")
    cp = next(c for c in first["checkpoints"] if c["step"] == "reserve")
    shown = otto.preview(
        rid, "redrive", options={"checkpoint_seq": cp["seq"], "compensate_first": [label["id"]]}
    )
    chosen = {r["id"]: r for r in shown["committed_after"]}[label["id"]]
    s11.fact("the preview: the label is compensated first, then done again", chosen, "preview")
    assert chosen["choice"] == "compensate_first" and chosen["reversible"] is True
    assert "new key" in chosen["re_execution"] and not shown["blocked_by"]
    resp = otto.intervene(
        rid,
        "redrive",
        "wrong label address; the card is fixed",
        options={"checkpoint_seq": cp["seq"], "compensate_first": [label["id"]]},
        preview_digest=shown["digest"],
    )
    assert resp.status_code == 202, resp.text
    receipt = resp.json()["receipt"]
    s11.fact("the receipt: compensating before anything starts", receipt, "POST interventions")
    assert receipt["state"] == "compensating" and receipt["compensate_first"] == [
        label["idempotency_key"]
    ]
    final = wait_state(worker, rid, {"succeeded", "failed", "compensation_failed"}, 120)
    assert final["state"] == "succeeded", final["state"]
    events = worker.history(rid)["events"]
    settled = next(i for i, e in enumerate(events) if e["kind"] == "compensation_finished")
    assert events[settled]["data"]["status"] == "completed", events[settled]
    started = [i for i, e in enumerate(events) if e["kind"] == "attempt_started"]
    assert started[-1] > settled, "the new attempt started before the compensation settled"
    assert events[started[-1]]["data"]["checkpoint"] == cp["seq"]
    s11.fact("the new attempt starts from the checkpoint", events[started[-1]]["data"], "history")
    labels = [
        e
        for e in worker.effects(rid)
        if e["tool"] == "shipping"
        and e["action"] == "create_label"
        and e["decision"] == "authorized"
    ]
    old = next(e for e in labels if e["id"] == label["id"])
    new = [e for e in labels if e["id"] != label["id"]]
    s11.fact("the old label compensated, a new one under a fresh key", labels, "GET effects")
    assert old["compensation_status"] == "compensated"
    assert len(new) == 1 and new[0]["status"] == "committed"
    assert new[0]["idempotency_key"] != label["idempotency_key"]
    assert world_commits(world, "shipping", new[0]["idempotency_key"]) == 1
    voided = [
        r
        for r in world.requests(system="shipping", action="void_label")
        if r["committed"] and not r["replayed"]
    ]
    s11.fact("the world voided the old label once", voided, "world /admin/requests")
    assert len(voided) == 1
    s11.fact("no duplicated effect", assert_no_duplicates(worker, world, rid), "ledger vs world")
    s11.fact("audit chain verifies", audit_verifies(live), "GET /audit/verify")
