"""Page objects for the operator console, for browser tests (Playwright, sync API).

Every selector the browser tests use lives here, so a change to the console's markup is fixed in one
place. Selectors prefer what an operator sees (roles, button names, visible text); where the console
marks an element for tests (``data-testid``, ``data-state``, ``data-kind``) that mark is preferred to
layout classes. Each locator accepts both the current markup and the card markup being introduced
(``data-testid="preview-card"`` / ``receipt-card`` / ``confirm-button``).

Needs Debian's chromium at /usr/bin/chromium; ``playwright install`` is never used.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

from playwright.sync_api import Browser, BrowserContext, Locator, Page, expect
from playwright.sync_api import Error as PlaywrightError

CHROMIUM = "/usr/bin/chromium"
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
VIEWPORT = {"width": 1440, "height": 1000}


@functools.cache
def server_password_hash(raw: str) -> str:
    """A password hash the *server* process can check (the suite hashes with MD5 for speed, the server
    only knows its real hashers). Computed once: PBKDF2 is slow on purpose."""
    from django.contrib.auth.hashers import PBKDF2PasswordHasher

    return PBKDF2PasswordHasher().encode(raw, "console-pages-salt")


def server_password(user: Any, raw: str) -> None:
    """Give one test user a password the server can check."""
    user.password = server_password_hash(raw)
    user.save(update_fields=["password"])


class Console:
    """One browser; one logged-in context per person (each operator has their own session)."""

    def __init__(self, browser: Browser, base: str):
        self.browser, self.base = browser, base
        self.contexts: list[BrowserContext] = []

    def login(self, username: str, password: str) -> Page:
        context = self.browser.new_context(viewport=VIEWPORT)
        self.contexts.append(context)
        page = context.new_page()
        page.goto(f"{self.base}/accounts/login/")
        page.get_by_label("username").fill(username)
        page.get_by_label("password").fill(password)
        page.get_by_role("button", name="Log in").click()
        expect(page).not_to_have_url(re.compile(r"/accounts/login/"))
        return page

    def close(self) -> None:
        for context in self.contexts:
            context.close()


class RunList:
    """The run list (``/``): find a run as an operator would, by its id."""

    def __init__(self, page: Page, base: str):
        self.page, self.base = page, base

    def open(self) -> RunList:
        self.page.goto(f"{self.base}/")
        return self

    def search_box(self) -> Locator:
        return self.page.locator(
            "[data-testid=run-search], input[type=search], input[name=q]"
        ).first

    def find(self, run_id: str) -> RunPage:
        """Type the id's first characters into the search box when there is one, then follow the
        run's link (the short id shown in the list)."""
        short = run_id[:8]
        if self.search_box().count():
            self.search_box().fill(short)
            self.search_box().press("Enter")
        # The link may carry the full id or a unique prefix of it (both resolve).
        link = self.page.locator(f"a[href*='/runs/{short}']").first
        expect(link).to_be_visible(timeout=15_000)
        link.click()
        expect(self.page).to_have_url(re.compile(re.escape(short)))
        return RunPage(self.page, self.base, run_id)


class RunPage:
    """The run page: its state badge, effect ledger, actions and the intervention dialog."""

    def __init__(self, page: Page, base: str, run_id: str):
        self.page, self.base, self.run_id = page, base, run_id

    def reload(self) -> RunPage:
        self.page.goto(f"{self.base}/runs/{self.run_id}/")
        return self

    # -- what the page says ----------------------------------------------------------------------
    def badge(self) -> Locator:
        return self.page.locator("[data-testid=run-state], #run-header [data-state]").first

    def lease_holder(self) -> str:
        """The worker holding the run's execution lease, as the run header names it."""
        cell = self.page.locator(
            "[data-testid=lease-holder], dt:text-is('execution lease holder') + dd code"
        ).first
        expect(cell).to_be_visible()
        return cell.inner_text().strip()

    def expect_state(self, *states: str, timeout: float = 30_000) -> str:
        """Wait for the header badge to show one of ``states`` (pushed live; no reload)."""
        pattern = re.compile("^(" + "|".join(map(re.escape, states)) + ")$")
        expect(self.badge()).to_have_attribute("data-state", pattern, timeout=timeout)
        return self.badge().get_attribute("data-state") or ""

    def ledger(self) -> Locator:
        return self.page.locator("#run-ledger, [data-testid=run-ledger]").first

    def effect_row(self, tool: str, action: str, status: str | None = None) -> Locator:
        """The ledger row of ``tool:action`` (optionally in ``status``)."""
        rows = self.ledger().locator("tr", has_text=f"{tool}:{action}")
        if status is not None:
            rows = rows.filter(has=self.page.locator(f".st-{status}, [data-status={status}]"))
        return rows.first

    def expect_effect(
        self, tool: str, action: str, status: str, timeout: float = 30_000
    ) -> Locator:
        row = self.effect_row(tool, action, status)
        expect(row).to_be_visible(timeout=timeout)
        return row

    def section(self, name: str) -> Locator:
        """A panel of the run page by its heading (``Timeline``, ``Recovery``, ``Interventions`` …)."""
        return self.page.locator("section", has=self.page.get_by_role("heading", name=name)).first

    def unfold(self, section: Locator) -> None:
        """Open every folded detail in a section (what an operator clicks to read it)."""
        section.evaluate("s => s.querySelectorAll('details').forEach(d => d.open = true)")

    def screenshot_section(self, name: str, path: Path) -> Path:
        """One panel, unfolded, as a PNG. A live push may redraw the panel mid-shot: try again."""
        path.parent.mkdir(parents=True, exist_ok=True)
        for attempt in range(3):
            section = self.section(name)
            try:
                self.unfold(section)
                section.screenshot(path=str(path))
                return path
            except PlaywrightError:
                if attempt == 2:
                    raise
        return path

    # -- acting -----------------------------------------------------------------------------------
    def action_button(self, kind: str) -> Locator:
        label = kind.replace("_", " ").capitalize()
        return self.page.locator(
            f"#run-actions button[data-kind={kind}], #run-actions button:text-matches('^{label}')"
        ).first

    def open_dialog(self, kind: str) -> Dialog:
        button = self.action_button(kind)
        expect(button).to_be_enabled(timeout=30_000)
        button.click()
        dialog = Dialog(self.page)
        expect(dialog.root.get_by_role("heading").first).to_be_visible()
        # Visible is not yet wired: htmx attaches the option's re-preview trigger when the swap
        # settles (static/console/console.js marks the form then). Changing an option before that
        # sends no preview and Confirm stays disabled.
        self.page.wait_for_function(
            "() => { const f = document.querySelector('#dialog form');"
            " return !f || f.hasAttribute('data-wired'); }"
        )
        return dialog

    def reconcile_button(self, tool: str, action: str) -> Locator:
        return self.effect_row(tool, action).get_by_role("button", name=re.compile("^Reconcile"))


class Dialog:
    """The intervention dialog: options, reason, preview, Confirm; then the receipt or the refusal."""

    def __init__(self, page: Page):
        self.page = page
        self.root = page.locator("#dialog")
        self.stale_confirms = 0  # confirms refused because the run had moved on since the preview

    def preview(self) -> Locator:
        return self.root.locator("[data-testid=preview-card], #preview").first

    def preview_text(self) -> str:
        """What the preview says, folded parts opened, lower-cased (see :meth:`text`)."""
        preview = self.preview()
        preview.evaluate("p => p.querySelectorAll('details').forEach(x => x.open = true)")
        return preview.inner_text().lower()

    def confirm_button(self) -> Locator:
        return self.root.locator("[data-testid=confirm-button], #preview button[type=submit]").first

    def receipt(self) -> Locator:
        return self.root.locator("[data-testid=receipt-card], [id^=receipt-]").first

    def error(self) -> Locator:
        return self.root.get_by_role("alert").first

    def text(self) -> str:
        """What the dialog says, with every folded part ("more", long values) opened first, as an
        operator reading it all would; lower-cased, so a heading's capital does not matter."""
        self.root.evaluate("d => d.querySelectorAll('details').forEach(x => x.open = true)")
        return self.root.inner_text().lower()

    def choose_scope(self, scope: str) -> Dialog:
        label = "this run and its descendants" if scope == "tree" else "this run"
        self.root.get_by_role("radio", name=label, exact=True).check()
        self.wait_preview()
        return self

    def select(self, label: str | re.Pattern[str], value: str) -> Dialog:
        self.root.get_by_label(label, exact=isinstance(label, str)).select_option(value)
        self.wait_preview()
        return self

    def fill(self, label: str | re.Pattern[str], value: str) -> Dialog:
        self.root.get_by_label(label).fill(value)
        return self

    def check(self, label: str, on: bool = True) -> Dialog:
        box = self.root.get_by_role("checkbox", name=label, exact=True)
        box.check() if on else box.uncheck()
        self.wait_preview()
        return self

    def reason(self, text: str) -> Dialog:
        return self.fill(re.compile(r"^reason"), text)

    def override(self, text: str) -> Dialog:
        self.root.get_by_label(re.compile(r"^override reason")).fill(text)
        self.wait_preview()
        return self

    def wait_preview(self) -> None:
        """A changed option re-previews; wait until the new preview has landed."""
        self.page.wait_for_load_state("networkidle")
        expect(self.preview()).to_be_visible()

    def confirm(self) -> Dialog:
        """Click Confirm. If the run moved on since the preview was drawn, the console refuses the
        stale confirm and shows the new preview: read it (it is in the dialog) and confirm again."""
        button = self.confirm_button()
        moved = self.root.locator("[data-testid=show-new-preview]")
        if button.is_disabled() and moved.is_visible():
            moved.click()  # the dialog holds still: a blocked preview is re-read on request
            self.wait_preview()
        expect(button).to_be_enabled()
        button.click()
        done = self.root.locator(
            "[data-testid=receipt-card], [id^=receipt-], [role=alert], [data-testid=preview-changed]"
        ).first
        expect(done).to_be_visible(timeout=20_000)
        for _ in range(4):
            if self.receipt().count() or not re.search(r"preview.stale|changed since", self.text()):
                break
            self.stale_confirms += 1
            button = self.confirm_button()
            try:  # disabled while the new preview is being drawn
                for _ in range(75):  # <= 15 s
                    if button.is_enabled():
                        break
                    if moved.is_visible():
                        # the run moved again while the new preview was read (a busy run under
                        # load): the dialog holds still and offers the newer one, as before
                        moved.click()
                        self.wait_preview()
                    self.page.wait_for_timeout(200)
                expect(button).to_be_enabled(timeout=1_000)
            except AssertionError:
                raise AssertionError(
                    "Confirm stays disabled on the preview shown after a stale confirm; the "
                    "dialog says:\n" + self.text()[:4000]
                ) from None
            button.click()
            expect(done).to_be_visible(timeout=20_000)
        return self

    def expect_receipt(self, timeout: float = 20_000) -> Locator:
        receipt = self.receipt()
        expect(receipt).to_be_visible(timeout=timeout)
        return receipt

    def expect_job(self, *statuses: str, timeout: float = 60_000) -> str:
        """The receipt's follow-up job (revalidation, compensation, reconciliation) reaching one of
        ``statuses``; the receipt refreshes itself."""
        pattern = re.compile("^(" + "|".join(map(re.escape, statuses)) + ")$")
        job = self.root.locator("[data-job-status]").first
        expect(job).to_have_attribute("data-job-status", pattern, timeout=timeout)
        return job.get_attribute("data-job-status") or ""

    def screenshot(self, path: Path) -> Path:
        """The whole dialog, unclipped by the side sheet's scrolling, as one PNG."""
        path.parent.mkdir(parents=True, exist_ok=True)
        self.root.evaluate(
            "d => { d.style.position = 'absolute'; d.style.bottom = 'auto';"
            " d.style.maxHeight = 'none'; d.style.overflow = 'visible'; d.style.height = 'auto'; }"
        )
        self.root.screenshot(path=str(path))
        return path

    def close(self) -> None:
        self.root.get_by_role("button", name=re.compile("^Close")).first.click()
        expect(self.root).to_be_empty()


def new_browser(playwright: Any) -> Browser:
    return playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
