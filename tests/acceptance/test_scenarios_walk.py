"""The seven scenarios of the operator's run-control test (docs/operator/scenarios.md), walked through the
console in a real browser, as an operator would: log in with the role the scenario needs, find the run
in the list, open it, open the intervention's dialog, read the preview, confirm, and read the receipt.
A screenshot of each receipt is saved as ``reports/scenario-<n>-<name>.png``; ``make walk`` copies them
into docs/img/ for the operator guide.

The runs and their effects are produced by real agent worker processes (``demo_agents.worker``, the
SDK) against the demo world, on the same live system as tests/acceptance/test_run_control.py (daphne,
Celery worker + beat, PostgreSQL, Redis). What the *agent's* side does by hand -- a timer, a
declaration after the pause, a zombie write -- goes through the worker API with the worker's token, as
a scripted worker would; every operator action goes through the console only. The assertions are on
what the console shows; the world's own request log backs up "exactly once".

Agents run at full speed (DEMO_STEP_SECONDS=0); where the operator must catch an effect in flight,
the world is told to take its time committing that one call (a ``slow`` fault).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.acceptance.report import REPORT_DIR
from tests.acceptance.test_run_control import (
    assert_no_duplicates,
    effect,
    purchase,
    wait_effect,
    wait_state,
    world_commits,
)
from tests.live import wait_for

CHROMIUM = "/usr/bin/chromium"
if not os.path.exists(CHROMIUM):
    pytest.skip(
        f"{CHROMIUM} is absent: make browser (Debian's chromium; never `playwright install`)",
        allow_module_level=True,
    )

from playwright.sync_api import Page, expect, sync_playwright  # noqa: E402

from tests.e2e.console_pages import (  # noqa: E402
    Console,
    Dialog,
    RunList,
    RunPage,
    new_browser,
    server_password_hash,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(240),
    pytest.mark.django_db(transaction=True),
]

PASSWORD = "walk-the-console"
#: what the walk had to work around, by scenario: a fact that only a reload showed (the page was not
#: live to it), a Confirm left enabled on a blocked preview. Written to reports/scenario-walk.json.
RELOADS: list[tuple[int, str]] = []


@pytest.fixture(scope="module", autouse=True)
def _walk_notes() -> Iterator[None]:
    yield
    REPORT_DIR.mkdir(parents=True, exist_ok=True)
    notes = {
        "screenshots": sorted(p.name for p in REPORT_DIR.glob("scenario-*.png")),
        "workarounds": [{"scenario": n, "note": note} for n, note in RELOADS],
    }
    (REPORT_DIR / "scenario-walk.json").write_text(json.dumps(notes, indent=2) + "\n")


@pytest.fixture
def console(live) -> Iterator[Console]:
    """A browser for this test. Started after the database work of the fixtures and stopped before
    their teardown: Playwright's sync API runs an event loop in this thread, and Django refuses ORM
    calls while one runs."""
    from django.contrib.auth.models import User

    User.objects.update(password=server_password_hash(PASSWORD))  # one hash for everyone: fast
    with sync_playwright() as p:
        browser = new_browser(p)
        c = Console(browser, live["url"])
        try:
            yield c
        finally:
            c.close()
            browser.close()


def shot(dialog_or_page: Dialog | Page, number: int, name: str) -> Path:
    path = REPORT_DIR / f"scenario-{number}-{name}.png"
    if isinstance(dialog_or_page, Dialog):
        return dialog_or_page.screenshot(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    dialog_or_page.screenshot(path=str(path), full_page=True)
    return path


def open_run(console: Console, who: str, run_id: str) -> RunPage:
    """Log in as ``who``, find the run in the list by its id and open it."""
    page = console.login(who, PASSWORD)
    return RunList(page, console.base).open().find(run_id)


def see_effect(
    run: RunPage, scenario: int, tool: str, action: str, status: str, timeout: float = 30
) -> None:
    """Wait for the ledger to show ``tool:action`` in ``status`` live, as long as the fact itself may
    take (a slow world call); only if it has not arrived by then, reload like an operator would and
    note the live-update gap. (A 3 s live wait noted slow facts as gaps: the world was still working.)"""
    try:
        run.expect_effect(tool, action, status, timeout=timeout * 1000)
        return
    except AssertionError:
        pass
    RELOADS.append((scenario, f"{tool}:{action} {status} on the run page"))
    deadline = timeout
    while deadline > 0:
        run.reload()
        if run.effect_row(tool, action, status).count():
            return
        run.page.wait_for_timeout(1000)
        deadline -= 1.5
    run.expect_effect(tool, action, status, timeout=1)


def confirm(dialog: Dialog, scenario: int) -> None:
    dialog.confirm()
    if dialog.stale_confirms:
        RELOADS.append((scenario, f"{dialog.stale_confirms} confirm(s) refused as preview_stale"))


def see_state(run: RunPage, scenario: int, *states: str, timeout: float = 60) -> str:
    try:  # live for the whole wait: a reload is noted only when the push never came
        return run.expect_state(*states, timeout=timeout * 1000)
    except AssertionError:
        RELOADS.append((scenario, f"state {'/'.join(states)} in the run header"))
        run.reload()
        return run.expect_state(*states, timeout=timeout * 1000)


def test_walk_1_and_2_pause_in_flight_then_resume_after_the_world_changes(live, console):
    worker, world = live["worker"], live["world"]
    # The charge takes the world 20 s (from the moment it reaches the world): long enough to pause
    # around it on a loaded machine.
    live["start_workers"](1, AGENT_WORLD_TIMEOUT_S="40")
    world.set_fault("payments", "slow", action="charge", count=1, delay_ms=20_000)
    rid = purchase(live)["id"]
    # The operator is watching the run page before the charge is dispatched.
    otto = open_run(console, "otto", rid)
    # Before the charge comes the address-check child (claimed by the same worker process): on a
    # loaded machine that can take longer than the page's own live wait, so the ledger is read
    # first, naming the child's state if the charge never comes (CI once timed out here, blind).
    seen: dict = {}

    def charge_in_flight():
        run = worker.run(rid)
        seen.update(
            state=run["state"], children=[(c["agent"], c["state"]) for c in run["children"]]
        )
        return effect(worker, rid, "payments", "charge", "in_flight")

    try:
        wait_for("the charge to be in flight", charge_in_flight, 120, 0.2)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\nrun and children: {seen}\n{live['procs'].logs()}") from None
    see_effect(otto, 1, "payments", "charge", "in_flight")
    charge = effect(worker, rid, "payments", "charge")
    assert charge is not None
    child = wait_for("the address-check child", lambda: worker.run(rid)["children"], 10)[0]
    token = worker.run(rid)["fencing_token"]
    # The agent's SDK sets a timer that falls due during the pause.
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

    # --- scenario 1: pause while the charge is dispatched and has no outcome
    dialog = otto.open_dialog("pause")
    dialog.choose_scope("run")
    narrow = dialog.preview_text()
    assert charge["idempotency_key"] in narrow  # the in-flight charge, named before confirming
    assert child["id"][:8] in narrow  # the child is listed even when not in scope
    dialog.choose_scope("tree")
    dialog.reason("price feed looks stale; hold spending")
    confirm(dialog, 1)
    dialog.expect_receipt()
    receipt = dialog.text()
    assert "may still complete" in receipt and charge["idempotency_key"] in receipt
    assert child["id"][:8] in receipt  # children, with their scope
    assert "payments:charge" in receipt and "inventory:*" in receipt  # authority stays active
    assert "price feed looks stale" in receipt and "otto" in receipt  # who and why
    assert re.search(r"\blabel\b", receipt)  # the checkpoint a resume would start from
    # New effects are denied from the moment the pause committed: the agent tries one while its
    # charge is still in flight (before it lets go of the lease).
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
    assert denied.status_code == 409 and denied.json()["reason"] == "run_paused"
    shot(dialog, 1, "pause")
    dialog.close()
    see_effect(otto, 1, "notifications", "enqueue", "denied")
    expect(otto.effect_row("notifications", "enqueue", "denied")).to_contain_text("run_paused")
    # The in-flight charge completes after the pause; the console flags its outcome as late.
    see_effect(otto, 1, "payments", "charge", "committed")
    expect(otto.effect_row("payments", "charge", "committed")).to_contain_text("late")
    see_state(otto, 1, "paused")
    # The timer kept running through the pause and its firing was recorded.
    expect(otto.section("Timeline")).to_contain_text("timer fired", timeout=15_000)

    # --- scenario 2: the price changes and the payments tool is bumped while paused
    world.set_price("sku-1", 14.0)
    live["procs"].stop({"acc-worker-1"})
    live["start_workers"](1, AGENT_TOOL_VERSIONS="payments=3.2")
    other = purchase(live, "sku-3", 1)
    wait_for(
        "the new deployment to claim",
        lambda: any(a["worker"] == "acc-worker-2" for a in worker.run(other["id"])["attempts"]),
        30,
    )
    otto.reload()
    dialog = otto.open_dialog("resume")
    expect(dialog.root.get_by_label(re.compile("^override reason"))).to_have_count(0)
    dialog.reason("price rechecked by on-call")
    confirm(dialog, 2)
    dialog.expect_receipt()
    assert dialog.expect_job("failed", "completed") == "failed"  # blocked by revalidation
    blocked = dialog.text()
    assert "tools.payments" in blocked and "3.1" in blocked and "3.2" in blocked  # version diff
    assert "price:sku-1" in blocked and "14" in blocked  # the stale assumption
    assert "blocked" in blocked
    # … and names the durable boundary, the authority now, and what runs again under its key
    for shown in ("checkpoint", "authority", "again"):
        assert shown in blocked, shown
    shot(dialog, 2, "resume-blocked")
    dialog.close()
    assert otto.expect_state("paused")

    ian = open_run(console, "ian", rid)
    dialog = ian.open_dialog("resume")
    dialog.override("incident commander accepts the price change and the tool bump")
    dialog.reason("price rise within the customer's quote; payments 3.2 is compatible")
    confirm(dialog, 2)
    dialog.expect_receipt()
    assert dialog.expect_job("completed", "failed") == "completed"
    resumed = dialog.text()
    assert "overridden by" in resumed and "ian" in resumed
    assert "resumed" in resumed
    shot(dialog, 2, "resume")
    dialog.close()
    see_state(ian, 2, "succeeded", timeout=60)
    assert wait_state(worker, rid, {"succeeded"}, 5)
    assert_no_duplicates(worker, world, rid)  # nothing ran twice in the world


def test_walk_3_cancel_after_one_effect_commits(live, console):
    worker, world = live["worker"], live["world"]
    # The label takes the world 12 s: the operator cancels while it is in flight.
    live["start_workers"](1, AGENT_WORLD_TIMEOUT_S="30")
    world.set_fault("shipping", "slow", action="create_label", count=1, delay_ms=12_000)
    rid = purchase(live)["id"]
    otto = open_run(console, "otto", rid)
    see_effect(otto, 3, "inventory", "reserve", "committed")
    dialog = otto.open_dialog("cancel")
    dialog.choose_scope("tree")
    dialog.reason("customer withdrew the order")
    confirm(dialog, 3)
    dialog.expect_receipt()
    receipt = dialog.text()
    reserve = effect(worker, rid, "inventory", "reserve")
    assert reserve and reserve["idempotency_key"] in receipt  # listed as committed …
    assert "release" in receipt and "in flight" in receipt.replace(
        "_", " "
    )  # compensation; the label
    shot(dialog, 3, "cancel")
    dialog.close()
    see_state(otto, 3, "cancelled", timeout=60)
    otto.reload()
    expect(otto.effect_row("inventory", "reserve", "committed")).to_be_visible()
    expect(otto.ledger().locator("tr", has_text="payments:charge")).to_have_count(0)
    expect(otto.ledger().locator("tr", has_text="notifications:enqueue")).to_have_count(0)
    assert world_commits(world, "inventory", reserve["idempotency_key"]) == 1
    assert not [r for r in world.requests(system="inventory", action="release") if r["committed"]]


def test_walk_4_retry_an_ambiguous_timeout(live, console):
    worker, world = live["worker"], live["world"]
    live["start_workers"](1, AGENT_WORLD_TIMEOUT_S="2")
    world.set_fault("payments", "timeout", action="charge", count=1, delay_ms=4000)
    rid = purchase(live)["id"]
    otto = open_run(console, "otto", rid)
    see_state(otto, 4, "failed", timeout=60)
    see_effect(otto, 4, "payments", "charge", "unknown")
    charge = effect(worker, rid, "payments", "charge")
    assert charge is not None

    dialog = otto.open_dialog("retry")
    refused = dialog.preview_text()
    assert "unresolved" in refused or "unknown" in refused
    if dialog.confirm_button().is_enabled():  # issue 10: Confirm must be disabled while blocked
        RELOADS.append((4, "retry preview: Confirm enabled although the preview is blocked"))
        dialog.reason("transient timeout")
        dialog.confirm_button().click()
        expect(dialog.error()).to_contain_text("effects_unresolved")
    shot(dialog, 4, "retry-refused")
    dialog.close()

    dialog = otto.open_dialog("reconcile")
    dialog.reason("ask payments whether the charge went through")
    confirm(dialog, 4)
    dialog.expect_receipt()
    assert dialog.expect_job("completed", "failed") == "completed"
    assert charge["idempotency_key"] in dialog.text()
    shot(dialog, 4, "reconcile")
    dialog.close()
    see_effect(otto, 4, "payments", "charge", "committed")
    expect(otto.effect_row("payments", "charge", "committed")).to_contain_text("reconciled")

    dialog = otto.open_dialog("retry")
    dialog.reason("charge confirmed by the processor; finish the order")
    confirm(dialog, 4)
    dialog.expect_receipt()
    shot(dialog, 4, "retry")
    dialog.close()
    see_state(otto, 4, "succeeded", timeout=60)
    attempts = otto.section("Attempts")
    expect(attempts.locator("tbody tr")).to_have_count(2)
    final = worker.run(rid)
    a1, a2 = final["attempts"][0], final["attempts"][-1]
    expect(attempts).to_contain_text(a1["id"][:8])
    expect(attempts).to_contain_text(a2["id"][:8])  # the new attempt has its own id
    expect(otto.ledger().locator("tr", has_text=charge["idempotency_key"])).not_to_have_count(0)
    assert world_commits(world, "payments", charge["idempotency_key"]) == 1


def test_walk_5_compensate_a_partially_completed_run(live, console):
    worker, world = live["worker"], live["world"]
    live["start_workers"](1)
    rid = purchase(live)["id"]
    assert wait_state(worker, rid, {"succeeded", "failed"}, 60)["state"] == "succeeded"
    world.set_fault("payments", "reject", action="refund", count=1)  # the first refund fails
    ian = open_run(console, "ian", rid)
    dialog = ian.open_dialog("compensate")
    plan = dialog.preview_text()
    for step in ("payments", "shipping", "inventory"):
        assert step in plan
    assert "irreversible" in plan  # the customer notification is called out
    dialog.reason("order placed against a stale price; unwind it")
    confirm(dialog, 5)
    dialog.expect_receipt()
    assert dialog.expect_job("completed", "failed", timeout=90_000) == "completed"
    receipt = dialog.text()
    order = [
        receipt.find(s) for s in ("payments:charge", "shipping:create_label", "inventory:reserve")
    ]
    assert all(i >= 0 for i in order) and order == sorted(order), order  # reverse execution order
    assert "irreversible" in receipt and "notifications:enqueue" in receipt
    shot(dialog, 5, "compensate")
    dialog.close()
    plan_row = [
        s
        for s in ian.section("Compensation").inner_text().splitlines()
        if "payments" in s and ("refund" in s or "charge" in s)
    ]
    assert plan_row
    for tool, action in (
        ("inventory", "release"),
        ("shipping", "void_label"),
        ("payments", "refund"),
    ):
        assert sum(1 for r in world.requests(system=tool, action=action) if r["committed"]) == 1


def test_walk_6_transfer_ownership_under_pressure(live, console):
    worker = live["worker"]
    live["start_workers"](1)
    rid = purchase(live, "sku-2", 8)["id"]  # above the approval threshold
    wait_state(worker, rid, {"awaiting_approval"}, 60)

    otto = open_run(console, "otto", rid)
    dialog = otto.open_dialog("transfer")
    dialog.select(re.compile(r"^to \(person"), "otto")
    dialog.reason("on-call takes the run from the agent's lane")
    confirm(dialog, 6)
    dialog.expect_receipt()
    assert "otto" in dialog.text()
    shot(dialog, 6, "transfer-to-on-call")
    dialog.close()

    ian = open_run(console, "ian", rid)
    dialog = ian.open_dialog("transfer")
    dialog.check("assignment", on=False)
    dialog.select(re.compile(r"^to \(person"), "olga")
    dialog.override("incident commander reassigns during the incident")
    dialog.reason("payments specialist takes the decision")
    confirm(dialog, 6)
    dialog.expect_receipt()
    handoff = dialog.text()
    assert "olga" in handoff and "otto" in handoff  # decision authority vs assignment, separately
    assert "incident commander reassigns" in handoff  # the override reason and the overriding actor
    assert "approval" in handoff and "pending" in handoff  # the pending decision at handoff
    assert re.search(r"who may", handoff, re.I)  # who may now resume, cancel, compensate, close
    shot(dialog, 6, "transfer")
    dialog.close()

    sam = open_run(console, "sam", rid)
    dialog = sam.open_dialog("revoke_authority")
    grant = next(g for g in worker.run(rid)["authority"] if g["scope"] == "payments:charge")
    dialog.select("grant", grant["id"])
    dialog.reason("card processor incident: no more charges")
    confirm(dialog, 6)
    dialog.expect_receipt()
    assert "payments:charge" in dialog.text()
    shot(dialog, 6, "revoke")
    dialog.close()

    otto.reload()
    dialog = otto.open_dialog("cancel")
    assert "olga" in dialog.text()  # told who holds decision authority before confirming
    dialog.reason("I still think we should cancel")
    if dialog.confirm_button().is_enabled():
        dialog.confirm_button().click()
    # Refused: by the server (403 not_decision_authority) or, before that, by a blocked preview.
    expect(dialog.error()).to_contain_text(re.compile(r"decision.authority", re.I))
    shot(dialog, 6, "former-owner-refused")
    dialog.close()


def test_walk_7_recover_after_a_worker_disappears(live, console):
    worker, world = live["worker"], live["world"]
    live["start_workers"](2)
    world.set_fault("payments", "slow", action="charge", count=1, delay_ms=3000)
    page = console.login("ian", PASSWORD)  # the operator is at the console before it happens
    rid = purchase(live)["id"]
    # The harness kills the worker the moment its charge is dispatched (a crash does not wait for
    # the operator); the operator then finds the run with its charge stuck in flight and the dead
    # worker still named as the lease holder, until the lease expires (6 s) and recovery runs.
    wait_effect(worker, rid, "payments", "charge", "in_flight")
    run = worker.run(rid)
    holder, old_token = run["leases"][0]["worker"], run["fencing_token"]
    live["procs"].sigkill(holder)  # between dispatching the charge and recording its outcome
    ian = RunList(page, console.base).open().find(rid)
    try:
        ian.expect_effect("payments", "charge", "in_flight", timeout=3_000)
        assert ian.lease_holder() == holder
    except AssertionError:  # a slow machine: recovery was quicker than the page
        RELOADS.append((7, "the orphaned charge was already reconciled when the run page opened"))

    see_state(ian, 7, "orphaned", "recovering", "running", "succeeded", timeout=30)
    see_state(ian, 7, "succeeded", timeout=90)
    ian.reload()
    timeline = ian.section("Timeline").inner_text().lower()
    assert "orphaned" in timeline  # the lease expired and the run was detected as orphaned
    recovery = ian.section("Recovery")
    ian.unfold(recovery)
    text = recovery.inner_text().lower()
    assert "verified" in text  # the history chain verifies
    assert "redrive" in text  # the chosen next action …
    assert "committed" in text  # … after the orphaned charge was reconciled with the world
    ian.screenshot_section("Recovery", REPORT_DIR / "scenario-7-recover.png")

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
    assert zombie.status_code == 409 and zombie.json()["reason"] == "lease_lost"
    see_effect(ian, 7, "notifications", "enqueue", "denied")
    expect(ian.effect_row("notifications", "enqueue", "denied")).to_contain_text("lease_lost")
    assert_no_duplicates(worker, world, rid)
    assert effect(worker, rid, "payments", "charge", "committed")
