"""Scenario 12 of the run-control test: a standing freeze set through the fleet API holds against
runs created after it -- a real agent worker's and an SDK client's -- and restore lifts it for both
at once. The declaration's refusal names the freeze, who set it and why (the ledger, the SDK's
error); a browser shows it on the run page and the run list. The live system is the package's
(tests/acceptance/conftest.py)."""

from __future__ import annotations

import os

import pytest

from controlplane_sdk import Client, EffectDenied
from tests.acceptance.report import scenario
from tests.acceptance.test_run_control import audit_verifies, purchase, wait_state

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240), pytest.mark.django_db(transaction=True)]

CHROMIUM = "/usr/bin/chromium"
PASSWORD = "freeze-stands"
FREEZE = {"capability": "payments:charge", "over": "agent", "agent": "purchasing"}
WHY = "card processor flapping"


def _denied_charges(api, run_id: str) -> list[dict]:
    return [
        e
        for e in api.effects(run_id)
        if (e["tool"], e["action"], e["decision"]) == ("payments", "charge", "denied")
    ]


def _sdk_charge(sdk: Client, run_id: str, token: int, key: str):
    return sdk.declare_effect(
        run_id, token, step="charge", tool="payments", action="charge", idempotency_key=key
    )


def test_scenario_12_a_standing_freeze_holds_for_runs_created_after_it(live):
    s12 = scenario(12, "A standing freeze over an agent holds for runs created after it")
    worker, ian = live["worker"], live["people"]["ian"]

    shown = ian.post("/fleet/freezes/preview", FREEZE).json()
    s12.fact("the freeze's preview: what it covers, now and later", shown, "POST .../preview")
    assert "created, claimed, resumed, retried or delegated" in shown["covers_later"]
    set_ = ian.post("/fleet/freezes", {**FREEZE, "reason": WHY, "digest": shown["digest"]})
    assert set_.status_code == 201, set_.text
    freeze = set_.json()["freeze"]
    s12.fact("the freeze's receipt", set_.json(), "POST /fleet/freezes")
    assert (freeze["live"], freeze["frozen_by"], freeze["reason"]) == (True, "user:ian", WHY)

    # A run created after the freeze, run by a real agent worker: its charge is refused.
    (name,) = live["start_workers"](1)
    rid = purchase(live)["id"]
    failed = wait_state(worker, rid, {"failed", "succeeded"}, 90)
    assert failed["state"] == "failed", failed["state"]
    live["procs"].stop({name})  # the SDK below claims its own run; no worker competes for it
    (denial,) = _denied_charges(worker, rid)
    s12.fact("the worker's charge is denied in the ledger", denial, "GET /runs/{id}/effects")
    assert denial["reason"] == "capability_frozen", denial
    (audited,) = [
        e
        for e in ian.get("/audit", run_id=rid, action="effect.declare").json()["events"]
        if e["outcome"] == "denied"
    ]
    why = audited["context"]["detail"]
    s12.fact("the refusal names the freeze, who set it and why", audited["context"], "GET /audit")
    assert freeze["id"] in why and "user:ian" in why and WHY in why, why

    # The run page and the run list show it (a viewer's browser).
    if os.path.exists(CHROMIUM):
        s12.fact("the console shows the freeze", _console_shows(live, rid), "browser")

    # An SDK client's run, also created after the freeze: the SDK's error names it. (Its lease
    # lives LEASE_TTL_S: claimed here, heartbeaten before the restore and after it.)
    sdk = Client(live["url"], live["worker_secret"])
    run = sdk.create_run(
        agent="purchasing", goal="charge after the freeze", input={},
        authority=[{"scope": "payments:charge", "ttl_s": 3600}],
    )  # fmt: skip
    lease = sdk.claim(run["id"], "sdk-worker").lease
    token = lease.fencing_token
    with pytest.raises(EffectDenied) as refused:
        _sdk_charge(sdk, run["id"], token, "k-during")
    err = refused.value
    s12.fact(
        "the SDK's error: reason, the freeze, who set it, why",
        {"reason": err.reason, "freeze": err.freeze, "message": str(err)},
        "controlplane_sdk.EffectDenied",
    )
    assert err.reason == "capability_frozen" and err.freeze
    assert (err.freeze["id"], err.freeze["frozen_by"]) == (freeze["id"], "user:ian")
    assert err.freeze["reason"] == WHY and WHY in str(err)

    # Restore lifts it for every run at once: the SDK's run charges; the worker's run, retried, too.
    sdk.heartbeat(lease.id, token)
    lift = ian.post(f"/fleet/freezes/{freeze['id']}/restore/preview").json()
    done = ian.post(
        f"/fleet/freezes/{freeze['id']}/restore",
        {"reason": "processor stable again", "digest": lift["digest"]},
    )
    assert done.status_code == 200, done.text
    s12.fact("the restore's receipt", done.json(), "POST .../restore")
    sdk.heartbeat(lease.id, token)
    assert _sdk_charge(sdk, run["id"], token, "k-after").decision == "authorized"
    sdk.close()
    retried = live["people"]["otto"].intervene(rid, "retry", "processor stable again")
    assert retried.status_code == 202, retried.text
    live["start_workers"](1)
    final = wait_state(worker, rid, {"succeeded", "failed"}, 90)
    s12.fact("the worker's run, retried after the restore, completes", final["state"], "GET run")
    assert final["state"] == "succeeded"
    audit = ian.get("/audit", object_type="standing_freeze").json()["events"]
    actions = sorted(a["action"] for a in audit)
    s12.fact("both decisions audited", actions, "GET /audit")
    assert actions == ["capability.standing_freeze", "capability.standing_restore"]
    s12.fact("audit chain verifies", audit_verifies(live), "GET /audit/verify")


def _console_shows(live, run_id: str) -> dict[str, str]:
    """A viewer's browser: the run page's freeze banner and the run list's note and row mark."""
    from django.contrib.auth.models import User
    from playwright.sync_api import expect, sync_playwright

    from tests.e2e.console_pages import Console, new_browser, server_password_hash

    User.objects.filter(username="vera").update(password=server_password_hash(PASSWORD))
    with sync_playwright() as p:  # no ORM call from here on: Playwright runs a loop in this thread
        browser = new_browser(p)
        console = Console(browser, live["url"])
        try:
            page = console.login("vera", PASSWORD)
            page.goto(f"{live['url']}/runs/{run_id}/")
            banner = page.get_by_test_id("standing-freeze")
            expect(banner).to_contain_text("payments:charge is frozen")
            expect(banner).to_contain_text(WHY)
            expect(banner).to_contain_text("user:ian")
            seen = {"run page": banner.inner_text()}
            page.goto(f"{live['url']}/")
            note = page.locator("#standing-freezes")
            expect(note).to_contain_text(WHY)
            mark = page.locator(f"#run-row-{run_id} [data-testid=row-frozen]")
            expect(mark).to_contain_text("payments:charge")
            seen |= {"run list": note.inner_text(), "run row": mark.inner_text()}
        finally:
            console.close()
            browser.close()
    return seen
