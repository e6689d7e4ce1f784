"""Issue 18, items 3 and 4, in a real browser on a real daphne (embedded live bus, and Redis) and the
demo world, with the worker writing about 3 facts a second while it drains: the pause receipt's
headline moves from "Pausing — waiting for 1 effect in flight" to "Paused — drained at …" while the
dialog stays open (no reload), and the resume preview reads the world's price through the adapter's
read-only checker and says "will be blocked: price of sku-2 changed 12.00 → 14.50"; ticking
re-observe changes the preview, unticking brings the warning back.

Needs Debian's chromium at /usr/bin/chromium and the `playwright` package (never `playwright install`).
"""

from __future__ import annotations

import os
import time

import httpx
import pytest

from tests.live import Procs, server_env, start_daphne, start_world

CHROMIUM = "/usr/bin/chromium"
if not os.path.exists(CHROMIUM):
    pytest.skip(f"{CHROMIUM} is absent: apt-get install -y chromium", allow_module_level=True)

from playwright.sync_api import expect, sync_playwright  # noqa: E402

from controlplane_sdk import Client  # noqa: E402
from tests.e2e.test_console_browser import CHROMIUM_ARGS, _server_password  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


@pytest.fixture(params=["embedded", "redis"])
def console_and_world(postgres_only, tmp_path, request):
    """daphne on the embedded live bus (no Redis) or on Redis, and the demo world."""
    if request.param == "redis" and not os.environ.get("REDIS_URL"):
        pytest.skip("needs Redis (REDIS_URL)")
    procs = Procs(tmp_path)
    try:
        world = start_world(procs, server_env(tmp_path))
        env = server_env(tmp_path, LEASE_TTL_S="300", WORLD_URL=world)
        if request.param == "embedded":
            env["REDIS_URL"] = ""
        yield start_daphne(procs, env, ready_path="/accounts/login/"), world
    finally:
        procs.stop()


def _checkpoints(sdk: Client, run_id: str, token: int, seconds: float, rate: float = 3.0) -> int:
    """The worker keeps writing (checkpoints while it drains), about ``rate`` facts a second."""
    written, until = 0, time.monotonic() + seconds
    while time.monotonic() < until:
        sdk.checkpoint(run_id, token, f"draining-{written}", {"i": written})
        written += 1
        time.sleep(1 / rate)
    return written


def test_the_receipt_headline_moves_live_and_the_resume_preview_says_it_will_be_blocked(
    cast, worker_token, console_and_world
):
    base, world = console_and_world
    _server_password(cast["otto"][0], "pw-otto")
    httpx.post(f"{world}/admin/items", json={"sku": "sku-2", "price": 12.0, "stock": 10})
    sdk = Client(base, worker_token)
    run = sdk.create_run(
        "purchasing",
        "buy 1 of sku-2",
        input={},
        authority=[{"scope": "payments:charge", "ttl_s": 3600}],
    )
    run_id = str(run["id"])
    claim = sdk.claim(run_id, "worker-7")
    token = claim.lease.fencing_token
    sdk.append_events(run_id, token, [sdk.assumption_event("price:sku-2", 12.0, checker="price")])
    charge = sdk.declare_effect(
        run_id,
        token,
        step="charge",
        tool="payments",
        action="charge",
        idempotency_key="k-charge-sku-2",
        args={"amount": 12},
    )
    assert charge.status == "in_flight"

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page()
        page.goto(f"{base}/runs/{run_id}/")
        page.fill("#id_username", "otto")
        page.fill("#id_password", "pw-otto")
        page.click("button[type=submit]")
        page.click("#run-actions button[data-kind=pause]")
        page.fill("#d-reason", "the supplier called about sku-2")
        page.click("[data-testid=confirm-button]")
        now = page.locator("#dialog [data-testid=receipt-now]")
        expect(now).to_contain_text(
            "Pausing — waiting for 1 effect in flight: payments:charge", timeout=10_000
        )
        expect(page.locator("#dialog [data-testid=receipt-then]")).to_contain_text(
            "Recorded at the decision"
        )
        page.evaluate("window.__noReload = 'still here'")
        page.evaluate("document.querySelector('#dialog').__still = 1")
        # Live load while the receipt is open: the worker writes about 3 facts a second as it
        # drains; the receipt stays, its headline still the truth ("Pausing").
        page.evaluate(
            "window.__pushes = 0;"
            "document.addEventListener('htmx:wsAfterMessage', () => window.__pushes++)"
        )
        written = _checkpoints(sdk, run_id, token, seconds=4)
        assert written >= 8, written
        expect(now).to_contain_text("Pausing — waiting for 1 effect in flight")
        page.wait_for_function("() => window.__pushes > 0", timeout=10_000)
        assert page.evaluate("!!document.querySelector('#dialog').__still")  # not replaced

        sdk.record_outcome(charge.id, token, "committed")
        sdk.release_lease(claim.lease.id, token, "paused at a boundary")
        expect(now).to_contain_text("Paused — drained at", timeout=5_000)
        expect(now).to_contain_text("payments:charge committed")
        expect(now).to_contain_text("after the pause")
        expect(now).to_have_attribute("data-final", "1")
        assert page.evaluate("window.__noReload") == "still here"  # live, not reloaded
        # the snapshot below still says how it stood at the decision
        expect(page.locator("#dialog [data-testid=receipt-then]")).to_contain_text(
            "the run was pausing"
        )

        httpx.post(f"{world}/admin/prices", json={"sku": "sku-2", "price": 14.5})
        page.goto(f"{base}/runs/{run_id}/")
        expect(page.locator("#run-header [data-testid=drained]")).to_contain_text("committed")
        page.click("#run-actions button[data-kind=resume]")
        blocked = page.locator("#dialog [data-testid=will-be-blocked]")
        expect(blocked).to_contain_text(
            "Will be blocked: price of sku-2 changed 12.00 → 14.50", timeout=10_000
        )
        expect(blocked).to_contain_text("re-observe")
        confirm = page.locator("#dialog [data-testid=confirm-button]")
        expect(confirm).to_have_text("Confirm resume — will be blocked")
        expect(confirm).to_be_enabled()

        page.check("#dialog input[name=reobserve_assumptions]")
        expect(blocked).to_have_count(0, timeout=10_000)
        expect(confirm).to_have_text("Confirm resume")
        page.uncheck("#dialog input[name=reobserve_assumptions]")
        expect(blocked).to_have_count(1, timeout=10_000)
        browser.close()
