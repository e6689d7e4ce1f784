"""A standing capability freeze in a real browser against a real daphne: an incident commander
freezes payments:charge over the purchasing agent on the fleet page (preview, reason, confirm,
receipt); a run that starts afterwards is refused with the freeze named in the SDK's error; the run
page and the run list show it; restore on the fleet page lifts it for every run at once.

Needs Debian's chromium at /usr/bin/chromium and the `playwright` Python package (never
`playwright install`)."""

from __future__ import annotations

import os

import pytest

from tests.live import Procs, server_env, start_daphne

CHROMIUM = "/usr/bin/chromium"
if not os.path.exists(CHROMIUM):
    pytest.skip(f"{CHROMIUM} is absent: apt-get install -y chromium", allow_module_level=True)

from playwright.sync_api import expect, sync_playwright  # noqa: E402

from controlplane_sdk import Client  # noqa: E402
from controlplane_sdk.errors import EffectDenied  # noqa: E402
from tests.e2e.test_console_browser import CHROMIUM_ARGS, _server_password  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def live_console(postgres_only, tmp_path):
    procs = Procs(tmp_path)
    env = server_env(tmp_path, LEASE_TTL_S="300")
    try:
        yield start_daphne(procs, env, ready_path="/accounts/login/")
    finally:
        procs.stop()


def _login(page, base: str, who: str, path: str = "/") -> None:
    page.goto(f"{base}{path}")
    page.fill("#id_username", who)
    page.fill("#id_password", f"pw-{who}")
    page.click("button[type=submit]")


def _started(sdk: Client, goal: str) -> tuple[dict, int]:
    run = sdk.create_run(
        agent="purchasing",
        goal=goal,
        input={},
        authority=[{"scope": "payments:charge", "ttl_s": 3600}],
    )
    claim = sdk.claim(run["id"], "worker-7")
    return run, claim.lease.fencing_token


def _charge(sdk: Client, run_id: str, token: int, key: str):
    return sdk.declare_effect(
        run_id, token, step="charge", tool="payments", action="charge", idempotency_key=key
    )


def test_a_standing_freeze_set_and_restored_in_the_console_covers_later_runs(
    cast, worker_token, live_console
):
    _server_password(cast["ian"][0], "pw-ian")
    sdk = Client(live_console, worker_token)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page()
        _login(page, live_console, "ian", "/fleet/")
        page.fill("#z-capability", "payments:charge")
        page.select_option("#z-over", "agent")
        page.fill("#z-agent", "purchasing")
        page.get_by_role("button", name="Preview freeze").click()
        card = page.get_by_test_id("freeze-card")
        expect(card).to_contain_text("Freeze payments:charge over agent purchasing")
        expect(card).to_contain_text("created, claimed, resumed, retried or delegated")
        page.fill("#z-reason", "card processor flapping")
        page.get_by_test_id("freeze-confirm").click()
        receipt = page.get_by_test_id("freeze-receipt")
        expect(receipt).to_contain_text("Frozen: payments:charge over agent purchasing")
        row = page.locator("#freeze-list tr[data-live='1']")
        expect(row).to_have_count(1)
        freeze_id = row.get_attribute("data-freeze")

        # A run that starts after the freeze: its charge is refused, the SDK's error names it.
        run, token = _started(sdk, "buy 2 of sku-1 after the freeze")
        with pytest.raises(EffectDenied) as denied:
            _charge(sdk, run["id"], token, "k-after")
        err = denied.value
        assert err.reason == "capability_frozen"
        assert (
            err.freeze and err.freeze["id"] == freeze_id and err.freeze["frozen_by"] == "user:ian"
        )
        assert "card processor flapping" in str(err) and freeze_id in err.why

        # The run page and the run list show it.
        page.goto(f"{live_console}/runs/{run['id']}/")
        banner = page.get_by_test_id("standing-freeze")
        expect(banner).to_contain_text("payments:charge is frozen")
        expect(banner).to_contain_text("card processor flapping")
        expect(banner).to_contain_text("user:ian")
        page.goto(f"{live_console}/")
        expect(page.locator("#standing-freezes")).to_contain_text("card processor flapping")
        expect(page.locator(f"#run-row-{run['id']} [data-testid=row-frozen]")).to_contain_text(
            "payments:charge"
        )

        # Restore on the fleet page: preview, reason, confirm; lifted for every run at once.
        page.goto(f"{live_console}/fleet/")
        page.get_by_test_id(f"restore-{freeze_id}").click()
        expect(page.get_by_test_id("restore-card")).to_contain_text("Lifts it for")
        page.fill("#z-lift", "processor stable again")
        page.get_by_test_id("restore-confirm").click()
        expect(page.get_by_test_id("freeze-receipt")).to_contain_text("Restored: payments:charge")
        expect(page.locator("#freeze-list tr[data-live='1']")).to_have_count(0)
        expect(page.locator(f"#freeze-{freeze_id}")).to_contain_text("processor stable again")
        page.goto(f"{live_console}/runs/{run['id']}/")
        expect(page.get_by_test_id("standing-freeze")).to_have_count(0)
        browser.close()

    assert _charge(sdk, run["id"], token, "k-after-restore").decision == "authorized"
    later, later_token = _started(sdk, "buy 1 of sku-3 after the restore")
    assert _charge(sdk, later["id"], later_token, "k-later").decision == "authorized"
    sdk.close()
