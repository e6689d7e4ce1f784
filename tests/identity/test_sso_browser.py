"""The SSO login in a real browser (Debian's chromium through Playwright) through the real
django-oauth-toolkit IdP process (tests/identity/conftest.py), arriving by a notification's link:
the login brings the person back to the exact approval, marked and scrolled into view."""

from __future__ import annotations

import os

import pytest
from django.contrib.auth import get_user_model

from audit.models import AuditEvent
from core.roles import roles_of
from runs.models import Approval
from tests.interventions.helpers import running_run

CHROMIUM = "/usr/bin/chromium"
if not os.path.exists(CHROMIUM):
    pytest.skip(f"{CHROMIUM} is absent: apt-get install -y chromium", allow_module_level=True)

from playwright.sync_api import expect, sync_playwright  # noqa: E402

from tests.e2e.test_console_browser import CHROMIUM_ARGS  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_a_browser_signs_in_through_the_idp_and_lands_on_the_linked_approval(
    live_server, sso, worker
):
    sso.set_users({"sam": ["secops"]})
    run, _ = running_run(worker)
    asked = worker.post(
        f"/runs/{run['id']}/approvals",
        {"fencing_token": 1, "tool": "payments", "action": "charge", "args": {"amount": 5}},
    )
    approval = asked.json()["id"]
    # What a notification carries (notifications/messages.py): no token, only where to look.
    link = f"{live_server.url}/runs/{run['id']}/?approval={approval}#approval-{approval}"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 500})
            page.goto(link)
            assert "/accounts/login/" in page.url
            page.click("#sso-login")  # "Sign in with Test IdP"
            page.wait_for_url(f"{sso.url}/login/**")
            page.fill("input[name=username]", "sam")
            page.fill("input[name=password]", "idp-pass-1")
            page.click("button[type=submit]")
            page.wait_for_url(f"{live_server.url}/runs/{run['id']}/?approval={approval}*")
            row = page.locator(f"#approval-{approval}")
            expect(row).to_have_class("linked-approval")
            expect(row).to_be_in_viewport()
            expect(row.get_by_role("button", name="Approve…")).to_be_visible()
            assert page.context.cookies(live_server.url)  # a session here, not at the IdP's origin
        finally:
            browser.close()
    # The database is read after the browser is closed (Playwright's sync loop runs in this thread).
    assert Approval.objects.get(pk=approval).status == Approval.PENDING
    sam = get_user_model().objects.get(username="sam")
    assert sorted(roles_of(sam)) == ["approver", "security_responder"]
    assert AuditEvent.objects.filter(action="login", actor="sam").exists()
