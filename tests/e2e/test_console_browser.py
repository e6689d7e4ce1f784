"""The console in a real browser against a real daphne: log in, open a run, preview and confirm a pause,
read the receipt, then watch the state badge change without a reload when the worker lets go of the
lease (a WebSocket push from the server process that committed the transition).

Needs Debian's chromium at /usr/bin/chromium (apt-get install chromium) and the `playwright` Python
package; `playwright install` is never used (no browser download).
"""

from __future__ import annotations

import os

import httpx
import pytest

from tests.live import Procs, server_env, start_daphne

CHROMIUM = "/usr/bin/chromium"
if not os.path.exists(CHROMIUM):
    pytest.skip(
        f"{CHROMIUM} is absent: apt-get install -y chromium (Debian's build; never `playwright install`)",
        allow_module_level=True,
    )

from playwright.sync_api import expect, sync_playwright  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture
def live_console(postgres_only, tmp_path):
    """daphne serving controlplane.asgi against the test database (committed rows: transaction=True)."""
    procs = Procs(tmp_path)
    env = server_env(tmp_path, LEASE_TTL_S="300")  # static files without DEBUG (SERVE_STATIC)
    try:
        yield start_daphne(procs, env, ready_path="/accounts/login/")
    finally:
        procs.stop()


def _server_password(user, raw: str) -> None:
    """The suite hashes with MD5 for speed; the server process only knows its real hashers."""
    from django.contrib.auth.hashers import PBKDF2PasswordHasher

    hasher = PBKDF2PasswordHasher()
    user.password = hasher.encode(raw, hasher.salt())
    user.save(update_fields=["password"])


def test_operator_pauses_a_run_and_sees_the_badge_change_live(cast, worker_token, live_console):
    _server_password(cast["otto"][0], "pw-otto")
    api = httpx.Client(
        base_url=f"{live_console}/api/v1",
        headers={"Authorization": f"Bearer {worker_token}"},
        timeout=10,
    )
    run = api.post(
        "/runs",
        json={
            "agent": "purchasing",
            "goal": "buy 2 of sku-1",
            "input": {},
            "authority": [{"scope": "payments:charge", "ttl_s": 3600}],
        },
    ).json()
    lease = api.post(f"/runs/{run['id']}/claim", json={"worker": "worker-7"}).json()["lease"]
    token = lease["fencing_token"]
    effect = api.post(
        f"/runs/{run['id']}/effects",
        json={
            "fencing_token": token,
            "step": "charge",
            "tool": "payments",
            "action": "charge",
            "idempotency_key": "order-42-charge",
            "args": {"amount": 100},
        },
    ).json()
    assert effect["status"] == "in_flight"  # so the pause waits for the worker: "pausing" first

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page()
        page.goto(f"{live_console}/runs/{run['id']}/")
        expect(page).to_have_url(f"{live_console}/accounts/login/?next=/runs/{run['id']}/")
        page.fill("#id_username", "otto")
        page.fill("#id_password", "pw-otto")
        page.click("button[type=submit]")
        expect(page.locator("#run-header [data-state]").first).to_have_attribute(
            "data-state", "running"
        )
        expect(page.locator("#run-live.ws-open")).to_have_count(
            1, timeout=10_000
        )  # the socket is up
        page.evaluate("window.__noReload = 'still here'")

        listing = browser.new_page()
        listing.goto(
            f"{live_console}/"
        )  # browser.new_page() is a fresh context: it logs in on its own
        listing.fill("#id_username", "otto")
        listing.fill("#id_password", "pw-otto")
        listing.click("button[type=submit]")
        row = listing.locator(f"#run-row-{run['id']} [data-state]")
        expect(row).to_have_attribute("data-state", "running")
        expect(listing.locator("#run-live.ws-open")).to_have_count(1, timeout=10_000)

        page.click("button[data-kind=pause]")
        dialog = page.locator("#dialog")
        expect(dialog.get_by_text("Preview — nothing has changed yet")).to_be_visible()
        expect(
            dialog.get_by_text("order-42-charge").first
        ).to_be_visible()  # the in-flight effect is named
        page.fill("#d-reason", "supplier price changed")
        dialog.get_by_role("button", name="Confirm pause").click()
        expect(dialog.get_by_text("Receipt · Pause")).to_be_visible()
        expect(dialog.get_by_text("supplier price changed").first).to_be_visible()
        badge = page.locator("#run-header [data-state]").first
        expect(badge).to_have_attribute("data-state", "pausing")

        # The worker finishes the in-flight call and gives the lease back: the server commits
        # pausing -> paused and pushes; the badge changes with no reload.
        api.post(
            f"/effects/{effect['id']}/outcome", json={"fencing_token": token, "status": "committed"}
        )
        api.post(
            f"/leases/{lease['id']}/release",
            json={"fencing_token": token, "reason": "paused at boundary"},
        )
        expect(badge).to_have_attribute("data-state", "paused", timeout=10_000)
        expect(row).to_have_attribute("data-state", "paused", timeout=10_000)
        assert page.evaluate("window.__noReload") == "still here"

        # A new run joins the open list above the first row (a row patch, not a table redraw),
        # and the counts are patched beside it.
        listing.evaluate("window.__listStays = document.querySelector('#run-table')")
        newer = api.post(
            "/runs", json={"agent": "purchasing", "goal": "buy 3 of sku-2", "input": {}}
        ).json()
        first = listing.locator("#run-rows > tr").first
        expect(first).to_have_attribute("id", f"run-row-{newer['id']}", timeout=10_000)
        expect(listing.locator("#run-counts .chip", has_text="queued")).to_have_count(1)
        assert listing.evaluate("window.__listStays === document.querySelector('#run-table')")
        expect(page.locator(f"#effect-{effect['id']} .st-committed")).to_have_count(1)
        browser.close()
