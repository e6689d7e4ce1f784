"""The console holds still while the world moves (issue 18), continued from test_console_stillness.py
(its daphnes, its load and its helpers): the Revoke dialog, the Workers page and the triage views
under about three facts a second, each on the embedded default (the SQLite live bus) and on Redis.

1. Revoke (item 8): nothing is pre-selected for a destructive choice; a person who picks a grant and
   types a reason for 10 s while the run moves keeps both, is told in place that the run changed, and
   revokes the grant they picked -- not the first one.
2. Workers (item 9): a worker that starts claiming, and a lease that runs out, are pushed to an open
   Workers page (no reload, no waiting for its 5 s refresh), while the versions the person unfolded
   stay unfolded through pushes and refreshes; what it shows is what a reload shows.
3. Triage (item 7): the "needs attention" list and the approvals inbox fill and empty live, each row
   with its reason in words, while the row the person selected (j/k) stays theirs as rows join above
   it; both agree with a reload.

Needs Debian's chromium at /usr/bin/chromium (``make browser``); ``playwright install`` is never used.
"""

from __future__ import annotations

import re
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from django.utils import timezone
from playwright.sync_api import Page, expect, sync_playwright

from controlplane_sdk import Client
from tests.e2e.console_pages import CHROMIUM_ARGS, VIEWPORT, server_password
from tests.e2e.test_console_stillness import (  # noqa: F401 (e2e_redis, servers: fixtures)
    AGREE_SANITY_S,
    CHROMIUM,
    TYPE_DELAY_MS,
    TYPED,
    Load,
    WaitingLoad,
    _login,
    _mark,
    _still,
    _type,
    e2e_redis,
    servers,
)

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]

AUTHORITY = [
    {"scope": "inventory:*", "ttl_s": 3600},
    {"scope": "payments:charge", "ttl_s": 3600},
]
VERSIONS = {"code": "agent 2.4.0", "tools": {"payments": "3.1", "inventory": "1.7"}}


def _run(api: str, worker_token: str, worker: str = "worker-7", **create: Any):
    sdk = Client(api, worker_token)
    run = sdk.create_run(
        "purchasing", create.pop("goal", "buy 2 of sku-1"), input={}, authority=AUTHORITY, **create
    )
    claim = sdk.claim(str(run["id"]), worker, versions=VERSIONS)
    return sdk, str(run["id"]), claim


def _orm(fn: Any) -> Any:
    """ORM calls from a test that drives Playwright's sync API go through another thread."""
    from django.db import connection

    def call() -> Any:
        try:
            return fn()
        finally:
            connection.close()  # the pool's connection goes back before the thread ends

    with ThreadPoolExecutor(1) as other:
        return other.submit(call).result()


def _bus(started: Any, layer: str, monkeypatch: Any) -> None:
    """The facts this process commits (the lease scan's) reach the daphnes' pages: on the embedded
    default through their SQLite bus file (core.live's sender reads the manager's shared cache)."""
    if layer == "embedded":
        from channels.layers import channel_layers

        from core.live_bus import SQLiteBusLayer

        bus = started.tmp / "var" / "live-bus.sqlite3"
        monkeypatch.setitem(channel_layers.backends, "default", SQLiteBusLayer(path=str(bus)))


# --- 1. the Revoke dialog ------------------------------------------------------------------------------

REVOKE_FIELDS = ("#dialog", "#intervention-form", "#d-reason", "#d-grant", "#d-gscope")


@pytest.mark.parametrize("layer", ["embedded", "redis"])
def test_the_revoke_dialog_preselects_nothing_and_keeps_the_chosen_grant_under_load(
    cast,
    worker_token,
    servers,  # noqa: F811 (the imported fixture)
    layer,
):
    from runs.models import AuthorityGrant

    console, api = servers(layer), servers(layer, "api")
    server_password(cast["sam"][0], "pw-sam")
    sdk, run_id, claim = _run(api, worker_token)
    with sync_playwright() as p:
        browser, page = _login(p, console, f"/runs/{run_id}/", who="sam")
        page.locator("#run-actions button[data-kind=revoke_authority]").click()
        page.wait_for_function("() => document.querySelector('#dialog form[data-wired]')")
        dialog = page.locator("#dialog")
        # Nothing is chosen for the person: no grant, no scope, a prompt (not "HTTP 422"), and no
        # Confirm to press by mistake.
        grant = dialog.locator("#d-grant")
        assert grant.input_value() == ""
        assert dialog.locator("#d-gscope").input_value() == ""
        assert "422" not in dialog.inner_text()
        expect(dialog.locator("[data-testid=preview-hint]")).to_contain_text("Choose")
        expect(dialog.locator("[data-testid=confirm-button]")).to_be_disabled()
        # The person picks the second grant: the one the busy run is charging with.
        options = dialog.locator("#d-grant option")
        assert options.count() == 3, options.all_inner_texts()  # the prompt and the two grants
        chosen = dialog.locator("#d-grant option", has_text="payments:charge").get_attribute(
            "value"
        )
        assert chosen and options.nth(1).get_attribute("value") != chosen
        grant.select_option(chosen)
        page.wait_for_load_state("networkidle")
        expect(dialog.locator("#preview [data-testid=confirm-button]")).to_be_enabled()
        _mark(page, REVOKE_FIELDS)
        effects_before = page.locator("#effects-body tr[id^=effect-]").count()
        with Load(sdk, run_id, claim.lease.fencing_token) as load:
            typed_for = _type(dialog.locator("#d-reason"))
        assert not load.errors, load.errors
        assert typed_for >= 9 and load.facts >= 25, (typed_for, load.facts)
        expect(page.locator("#effects-body tr[id^=effect-]")).to_have_count(
            effects_before + len(load.declared), timeout=10_000
        )

        def kept() -> None:
            assert _still(page, REVOKE_FIELDS) == [], _still(page, REVOKE_FIELDS)
            assert grant.input_value() == chosen
            assert dialog.locator("#d-reason").input_value() == TYPED
            assert dialog.locator("#d-gscope").input_value() == ""

        kept()
        assert page.evaluate("document.activeElement && document.activeElement.id") == "d-reason"
        note = dialog.locator("[data-testid=run-moved]")
        expect(note).to_be_visible(timeout=5_000)
        assert "new effect" in note.inner_text(), note.inner_text()
        # Confirm: the in-flight charges the preview named have changed, so it re-previews first.
        dialog.locator("[data-testid=confirm-button]").click()
        expect(dialog.locator("[data-testid=preview-changed]")).to_be_visible(timeout=20_000)
        kept()
        dialog.locator("[data-testid=confirm-button]").click()
        expect(dialog.locator("[data-testid=receipt-card]")).to_be_visible(timeout=20_000)
        assert TYPED in dialog.inner_text()
        # The grant the person picked is revoked, the other untouched; the page behind says so live.
        statuses = _orm(
            lambda: dict(
                AuthorityGrant.objects.filter(run_id=run_id).values_list("scope", "status")
            )
        )
        assert statuses == {"inventory:*": "active", "payments:charge": "revoked"}, statuses
        expect(page.locator("#run-authority")).to_contain_text("revoked", timeout=10_000)
        browser.close()


# --- comparing a page with a reload -------------------------------------------------------------------

# Each region as the live page shows it and as a fresh render of the same URL shows it (fetched with the
# page's own session). Times are compared by their instant; the ages written in words ("waiting 4 s",
# "for 2 min", "3 s ago") move on between two renders and are compared without their number.
SAME_JS = r"""
async (regions) => {
  const res = await fetch(location.pathname + location.search, {credentials: "same-origin"});
  const doc = new DOMParser().parseFromString(await res.text(), "text/html");
  const norm = (root) => {
    const el = root.cloneNode(true);
    el.querySelectorAll("time[datetime]").forEach((t) => (t.textContent = t.getAttribute("datetime")));
    return {
      ids: [...el.querySelectorAll("[id]")].map((x) => x.id).join(),
      text: el.textContent.replace(/\s+/g, " ")
        .replace(/\b\d+(\.\d+)? (s|min|h)\b/g, "#").replace(/just now|# ago|# # ?#?/g, "#").trim(),
    };
  };
  const out = {};
  for (const id of regions) {
    const live = document.getElementById(id), fresh = doc.getElementById(id);
    if (!live || !fresh) { out[id] = {same: !live && !fresh, live: !!live, fresh: !!fresh}; continue; }
    const a = norm(live), b = norm(fresh);
    out[id] = a.text === b.text && a.ids === b.ids ? {same: true} : {same: false, live: a, fresh: b};
  }
  return out;
}
"""


def _agrees(page: Page, regions: list[str], what: str, within_s: float) -> float:
    """Seconds until every region agrees with a fresh render (polled every 0.1 s)."""
    started, last = time.monotonic(), {}
    while time.monotonic() - started < within_s:
        last = page.evaluate(SAME_JS, regions)
        if all(r["same"] for r in last.values()):
            return round(time.monotonic() - started, 2)
        page.wait_for_timeout(100)
    diff = []
    for region, r in last.items():
        if not r["same"]:
            live, fresh = r.get("live"), r.get("fresh")
            if not isinstance(live, dict) or not isinstance(fresh, dict):
                diff.append(f"#{region}: live {bool(live)}, fresh {bool(fresh)}")
                continue
            at = next(
                (
                    i
                    for i, (x, y) in enumerate(zip(live["text"], fresh["text"], strict=False))
                    if x != y
                ),
                min(len(live["text"]), len(fresh["text"])),
            )
            diff.append(
                f"#{region}:\n  live : …{live['text'][max(at - 80, 0) : at + 160]}\n"
                f"  fresh: …{fresh['text'][max(at - 80, 0) : at + 160]}\n"
                f"  ids live {live['ids'][:300]}\n  ids fresh {fresh['ids'][:300]}"
            )
    raise AssertionError(f"{what}: the live page disagrees with a reload:\n" + "\n".join(diff))


def _no_reload(page: Page) -> None:
    page.evaluate("window.__same_page = true")


def _same_page(page: Page) -> bool:
    return bool(page.evaluate("window.__same_page === true"))


# --- 2. the Workers page --------------------------------------------------------------------------------


class BeatingLoad(Load):
    """The same facts, and the worker's heartbeat every 6th step (about every 2 s)."""

    def __init__(self, *args: Any, lease_id: str, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.lease_id = lease_id

    def step(self, i: int) -> None:
        if i % 6 == 5:
            self.sdk.heartbeat(self.lease_id, self.token)
        super().step(i)


def _folded(page: Page, worker: str) -> Any:
    return page.locator(f"#workers tr[data-worker='{worker}'] details").first


@pytest.mark.parametrize("layer", ["embedded", "redis"])
def test_the_workers_page_follows_the_workers_live_and_keeps_what_was_unfolded(
    cast,
    worker_token,
    servers,  # noqa: F811 (the imported fixture)
    layer,
    monkeypatch,
):
    """worker-7 is busy (facts and heartbeats); worker-8 starts claiming and worker-9's lease runs
    out while a viewer reads worker-7's tool versions, unfolded."""
    from interventions.recover import scan_expired_leases
    from runs.models import ExecutionLease

    console, api = servers(layer), servers(layer, "api")
    _bus(servers, layer, monkeypatch)
    server_password(cast["vera"][0], "pw-vera")
    sdk, run_id, claim = _run(api, worker_token)
    _, doomed_id, _ = _run(api, worker_token, worker="worker-9", goal="the one whose worker dies")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_context(viewport=VIEWPORT).new_page()
        page.goto(f"{console}/workers/")
        page.fill("#id_username", "vera")
        page.fill("#id_password", "pw-vera")
        page.click("button[type=submit]")
        expect(page.locator("#workers tr[data-worker]")).to_have_count(2)
        expect(page.locator("#run-live.ws-open")).to_have_count(1, timeout=15_000)
        _no_reload(page)
        # Refreshed every 5 s (heartbeats), pushed on a claim or a lease's end: both counted.
        page.evaluate(
            "window.__refreshes = 0; window.__pushes = 0;"
            " document.body.addEventListener('htmx:afterSwap',"
            " (e) => { if (e.detail.elt && e.detail.elt.id === 'workers') window.__refreshes++; });"
            " document.body.addEventListener('htmx:oobAfterSwap',"
            " (e) => { if (e.detail.target && e.detail.target.id === 'workers') window.__pushes++; })"
        )
        # The person unfolds worker-7's tool versions to read them.
        _folded(page, "worker-7").locator("summary").click()
        assert _folded(page, "worker-7").evaluate("d => d.open")
        assert "inventory" in _folded(page, "worker-7").inner_text()
        seen: dict[str, float] = {}
        with BeatingLoad(sdk, run_id, claim.lease.fencing_token, lease_id=claim.lease.id) as load:
            started = time.monotonic()
            # A worker that starts claiming shows up, with the run it holds.
            new_sdk, new_id, _ = _run(api, worker_token, worker="worker-8", goal="a new worker")
            at = time.monotonic()
            row = page.locator("#workers tr[data-worker='worker-8']")
            expect(row).to_contain_text(new_id[:8], timeout=12_000)
            seen["worker-8 claimed"] = round(time.monotonic() - at, 2)
            # worker-9 dies: its lease runs out and the scan ends it (this process, as beat would).
            _orm(
                lambda: ExecutionLease.objects.filter(run_id=doomed_id).update(
                    expires_at=timezone.now()
                )
            )
            at = time.monotonic()
            assert doomed_id in _orm(scan_expired_leases)
            expiry = page.locator("#lease-expiries tr", has_text="worker-9")
            expect(expiry).to_contain_text(doomed_id[:8], timeout=12_000)
            seen["worker-9's lease ran out"] = round(time.monotonic() - at, 2)
            assert (
                doomed_id[:8]
                not in page.locator("#workers tr[data-worker='worker-9']").inner_text()
            )
            # The person keeps reading for the rest of the 10 s window, through more refreshes.
            page.wait_for_timeout(max(10_000 - (time.monotonic() - started) * 1000, 0))
        assert not load.errors, load.errors
        assert load.facts >= 25, load.facts
        page.wait_for_function("window.__refreshes >= 2", timeout=15_000)
        # The claim and the lease's end were pushed (a busy run's facts are not: nothing to redraw).
        pushes = page.evaluate("window.__pushes")
        assert 2 <= pushes <= 8, (pushes, load.facts)  # not one per fact of the busy run
        seen["pushes"] = pushes
        assert all(seen[k] <= AGREE_SANITY_S for k in seen if k != "pushes"), seen  # 1 s: printed
        # Refreshed, not reloaded; and what the person unfolded is still unfolded, and current.
        assert _same_page(page)
        folded = _folded(page, "worker-7")
        assert folded.evaluate("d => d.open"), (
            "a refresh folded the versions the person was reading"
        )
        assert "3.1" in folded.inner_text()
        seen["agrees with a reload"] = _agrees(page, ["workers"], "workers page", 12)
        text = page.locator("#workers tr[data-worker='worker-7']").inner_text()
        assert run_id[:8] in text and "alive" in text, text
        assert new_sdk  # worker-8's client, kept for its lease's lifetime
        print(f"workers page ({layer}): {seen}")
        browser.close()


def test_a_late_refresh_never_steps_the_workers_page_back_behind_a_push(
    cast,
    worker_token,
    servers,  # noqa: F811 (the imported fixture)
    monkeypatch,
):
    """A 5 s refresh reads the workers, then a claim commits and is pushed, then the refresh's answer
    arrives (held here by the browser's router): the page keeps the push's newer drawing. It holds
    because both replace ``#workers`` whole (outerHTML): the push detaches the element whose refresh
    is in flight, and htmx does not draw an answer for a detached element. A swap that kept the
    element (innerHTML) would step the page back here."""
    console, api = servers("embedded"), servers("embedded", "api")
    _bus(servers, "embedded", monkeypatch)
    server_password(cast["vera"][0], "pw-vera")
    _run(api, worker_token)
    held: list[Any] = []

    def hold_first_refresh(route: Any) -> None:
        if held or not route.request.headers.get("hx-request"):
            route.continue_()
            return
        held.append((route, route.fetch()))  # the server reads now; the page gets it later

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_context(viewport=VIEWPORT).new_page()
        page.goto(f"{console}/workers/")
        page.fill("#id_username", "vera")
        page.fill("#id_password", "pw-vera")
        page.click("button[type=submit]")
        expect(page.locator("#run-live.ws-open")).to_have_count(1, timeout=15_000)
        page.route(re.compile(r".*/workers/(\?.*)?$"), hold_first_refresh)
        deadline = time.monotonic() + 15
        while not held and time.monotonic() < deadline:
            page.wait_for_timeout(100)
        assert held, "no refresh of the Workers page within 15 s"
        _, new_id, _ = _run(api, worker_token, worker="worker-8", goal="claimed after the read")
        row = page.locator("#workers tr[data-worker='worker-8']")
        expect(row).to_contain_text(new_id[:8], timeout=5_000)  # pushed
        route, answer = held[0]
        assert "worker-8" not in answer.text()  # read before the claim committed
        route.fulfill(response=answer)
        page.wait_for_timeout(1_000)
        expect(row).to_contain_text(new_id[:8], timeout=1)  # the older reading was not drawn
        page.unroute_all(behavior="ignoreErrors")
        browser.close()


# --- 3. the triage views: "needs attention" and the approvals inbox ---------------------------------------

ROW_SELECTED = "document.querySelector('#run-rows tr.selected')"


@pytest.mark.parametrize("layer", ["embedded", "redis"])
def test_the_triage_views_fill_and_empty_live_with_their_reasons_and_keep_the_selection(
    cast,
    worker_token,
    servers,  # noqa: F811 (the imported fixture)
    layer,
):
    """otto watches "needs attention" with a run selected (j); april the approvals inbox. While the
    selected run keeps moving (it waits for an approval: checkpoints, outcomes), a newer run asks for
    an approval (joins both, above the selection), another's effect becomes unknown, a third asks an
    approval only an incident commander may give (april: "waiting on others"), and the first approval
    is decided (it leaves both)."""
    console, api = servers(layer), servers(layer, "api")
    for who in ("otto", "april"):
        server_password(cast[who][0], f"pw-{who}")
    april = httpx.Client(
        base_url=f"{api}/api/v1",
        headers={"Authorization": f"Bearer {cast['april'][1]}"},
        timeout=20,
    )
    sdk, busy_id, claim = _run(api, worker_token, goal="the busy one")
    token = claim.lease.fencing_token
    pending = [
        sdk.declare_effect(
            busy_id,
            token,
            step=f"hold-{i}",
            tool="payments",
            action="charge",
            idempotency_key=f"hold-{i}",
            args={"i": i},
        ).id
        for i in range(3)
    ]
    sdk.request_approval(
        busy_id, token, tool="payments", action="charge", args={"amount": 40}, reason="over"
    )
    others = [_run(api, worker_token, goal=f"run {n}") for n in ("asks", "unknown", "ic")]
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)

        def login(who: str, path: str) -> Page:
            page = browser.new_context(viewport=VIEWPORT).new_page()
            page.goto(f"{console}{path}")
            page.fill("#id_username", who)
            page.fill("#id_password", f"pw-{who}")
            page.click("button[type=submit]")
            expect(page.locator("#run-live.ws-open")).to_have_count(1, timeout=15_000)
            _no_reload(page)
            return page

        triage, inbox = login("otto", "/?attention=1"), login("april", "/approvals/")
        rows = triage.locator("#run-rows tr[id^=run-row-]")
        expect(rows).to_have_count(1)
        triage.keyboard.press("j")  # the busy run, selected
        expect(triage.locator(f"#run-row-{busy_id}.selected")).to_have_count(1)
        expect(inbox.locator("#inbox tr[id^=approval-]")).to_have_count(1)
        reasons = triage.locator(f"#run-row-{busy_id} [data-testid=attention-reasons]")
        expect(reasons).to_contain_text("approval of payments:charge waiting")

        seen: dict[str, float] = {}
        with WaitingLoad(sdk, busy_id, token, pending=pending) as load:
            started = time.monotonic()
            # A newer run asks for an approval: it joins both views, above the selected row.
            a_sdk, asks_id, a_claim = others[0]
            asked = a_sdk.request_approval(
                asks_id,
                a_claim.lease.fencing_token,
                tool="payments",
                action="charge",
                args={"amount": 90},
                reason="over the limit",
            )
            at = time.monotonic()
            expect(
                triage.locator(f"#run-row-{asks_id} [data-testid=attention-reasons]")
            ).to_contain_text("approval of payments:charge waiting", timeout=10_000)
            expect(inbox.locator(f"#approval-{asked.id} [data-testid=waiting]")).to_contain_text(
                "blocks the run for", timeout=10_000
            )
            seen["an approval asked"] = round(time.monotonic() - at, 2)
            # Another run's charge times out: the world may or may not have taken it.
            u_sdk, unknown_id, u_claim = others[1]
            charge = u_sdk.declare_effect(
                unknown_id,
                u_claim.lease.fencing_token,
                step="pay",
                tool="payments",
                action="charge",
                idempotency_key="pay-unknown",
                args={"amount": 7},
            )
            u_sdk.record_outcome(charge.id, u_claim.lease.fencing_token, "unknown")
            at = time.monotonic()
            expect(
                triage.locator(f"#run-row-{unknown_id} [data-testid=attention-reasons]")
            ).to_contain_text("unknown outcome of payments:charge for", timeout=10_000)
            seen["an outcome unknown"] = round(time.monotonic() - at, 2)
            # An approval april may not give: she sees it waiting on others, and why, and who may.
            i_sdk, ic_id, i_claim = others[2]
            ic = i_sdk.request_approval(
                ic_id,
                i_claim.lease.fencing_token,
                tool="payments",
                action="charge",
                args={"amount": 5000},
                reason="large refund",
                required_role="incident_commander",
            )
            at = time.monotonic()
            waiting = inbox.locator(f"#waiting-{ic.id}")
            expect(waiting).to_contain_text("blocks the run for", timeout=10_000)
            expect(waiting).to_contain_text("incident commander")
            seen["an approval for others"] = round(time.monotonic() - at, 2)
            # The first approval is decided (april, from another tab): it leaves both views.
            decided = april.post(
                f"/runs/{asks_id}/interventions",
                json={
                    "kind": "approve",
                    "reason": "checked with the customer",
                    "options": {"approval_id": str(asked.id)},
                },
            )
            assert decided.status_code == 202, decided.text
            at = time.monotonic()
            expect(triage.locator(f"#run-row-{asks_id}")).to_have_count(0, timeout=10_000)
            expect(inbox.locator(f"#approval-{asked.id}")).to_have_count(0, timeout=10_000)
            seen["an approval decided"] = round(time.monotonic() - at, 2)
            # The rest of the 10 s window: the busy run keeps moving under the selection.
            rest = len(TYPED) * TYPE_DELAY_MS / 1000 - (time.monotonic() - started)
            triage.wait_for_timeout(max(rest, 0) * 1000)
        assert not load.errors, load.errors
        assert load.facts >= 25, load.facts

        # No reload; the selection stayed on the run the person selected, although rows joined
        # above it and its own row was redrawn by every push; Enter opens that run.
        assert _same_page(triage) and _same_page(inbox)
        expect(rows).to_have_count(3)  # busy, unknown, ic (the decided one left)
        assert triage.evaluate(f"{ROW_SELECTED} && {ROW_SELECTED}.id") == f"run-row-{busy_id}"
        assert triage.evaluate(f"{ROW_SELECTED}.getAttribute('aria-selected')") == "true"
        expect(inbox.locator("#inbox tr[id^=approval-]")).to_have_count(1)  # the busy run's
        seen["triage agrees with a reload"] = _agrees(
            triage, ["run-rows", "run-counts"], "needs attention", 10
        )
        seen["inbox agrees with a reload"] = _agrees(inbox, ["inbox"], "approvals inbox", 10)
        print(f"triage views ({layer}): {seen}")
        triage.keyboard.press("Enter")
        triage.wait_for_url(re.compile(f"/runs/{busy_id}/"), timeout=10_000)
        browser.close()
