"""Receipts are living documents (issue 18, item 3): the headline is the truth now, read from the
database at render time, with the decision-time snapshot below it; the drain of a pause or cancel is
its own fact (history + audit) on the run page and the receipt. And the resume preview runs the
revalidation job's own checks (item 4): "will be blocked: price of sku-1 changed 12.50 → 14.50",
the way out, and a re-observe tick that changes the preview without writing anything."""

from __future__ import annotations

import re

import pytest
from django.test import Client

from audit.models import AuditEvent
from interventions import registry
from interventions.models import Intervention
from interventions.reconcile import reconcile_run_effects
from interventions.registry import AssumptionCheck
from interventions.resume import revalidate_run
from runs.models import Assumption, Effect, HistoryEvent, Run
from tests.conftest import claim, declare, start_run
from tests.interventions.helpers import commit, intervene

pytestmark = pytest.mark.django_db

EPOCH = re.compile(r"(?<![\d.])1[5-9]\d{8}(?:\.\d+)?(?![\d.])")


def browser(username: str) -> Client:
    client = Client()
    assert client.login(username=username, password=f"pw-{username}")
    return client


def headline(html: str) -> str:
    m = re.search(r'data-testid="receipt-now"[^>]*><strong>(.*?)</strong>', html, re.S)
    assert m, html[:3000]
    return m.group(1)


def pausing_with_a_charge_in_flight(worker, as_user) -> tuple[dict, dict, dict, Intervention]:
    run = start_run(worker)
    lease = claim(worker, run["id"])["lease"]
    effect = declare(worker, run["id"], lease["fencing_token"], key="k-charge").json()
    resp = intervene(as_user("otto"), run["id"], "pause", "supplier called")
    assert resp.status_code == 202, resp.content
    assert Run.objects.get(pk=run["id"]).state == "pausing"
    return run, lease, effect, Intervention.objects.get(run_id=run["id"], kind="pause")


def test_it_records_the_drain_as_its_own_fact_when_the_pause_completes(cast, worker, as_user):
    run, lease, effect, _ = pausing_with_a_charge_in_flight(worker, as_user)
    assert not HistoryEvent.objects.filter(run_id=run["id"], kind="drained").exists()
    out = worker.post(
        f"/effects/{effect['id']}/outcome",
        {"fencing_token": lease["fencing_token"], "status": "committed"},
    )
    assert out.status_code == 200, out.content
    assert not HistoryEvent.objects.filter(run_id=run["id"], kind="drained").exists()
    worker.post(f"/leases/{lease['id']}/release", {"fencing_token": lease["fencing_token"]})

    drained = HistoryEvent.objects.get(run_id=run["id"], kind="drained")
    assert drained.data["from"] == "pausing" and drained.data["state"] == "paused"
    [settled] = drained.data["settled"]
    assert settled["idempotency_key"] == "k-charge" and settled["status"] == "committed"
    assert settled["after_s"] >= 0 and drained.data["unresolved"] == []
    audit = AuditEvent.objects.get(action="run.drained", run_id=run["id"])
    assert audit.context["settled"][0]["idempotency_key"] == "k-charge"
    # the drain follows the state change in the same chain: the history still verifies
    seqs = list(
        HistoryEvent.objects.filter(run_id=run["id"]).order_by("seq").values_list("kind", flat=True)
    )
    assert seqs[-2:] == ["state_changed", "drained"]


def test_a_pause_with_nothing_in_flight_drains_at_once(cast, worker, as_user):
    run = start_run(worker)
    claim(worker, run["id"])
    assert intervene(as_user("otto"), run["id"], "pause", "quiet").status_code == 202
    drained = HistoryEvent.objects.get(run_id=run["id"], kind="drained")
    assert drained.data["settled"] == [] and drained.data["state"] == "paused"
    page = browser("otto").get(f"/runs/{run['id']}/").content.decode()
    assert 'data-testid="drained"' in page and "nothing was in flight" in page


def test_a_cancel_drains_when_the_worker_finishes(cast, worker, as_user):
    run = start_run(worker)
    lease = claim(worker, run["id"])["lease"]
    assert intervene(as_user("otto"), run["id"], "cancel", "wrong order").status_code == 202
    assert Run.objects.get(pk=run["id"]).state == "cancelling"
    done = worker.post(
        f"/runs/{run['id']}/finish", {"fencing_token": lease["fencing_token"], "outcome": "failed"}
    )
    assert done.status_code == 200, done.content
    drained = HistoryEvent.objects.get(run_id=run["id"], kind="drained")
    assert drained.data["from"] == "cancelling" and drained.data["state"] == "cancelled"
    assert AuditEvent.objects.filter(action="run.drained", run_id=run["id"]).count() == 1


def test_the_pause_receipt_headline_is_the_truth_now_and_keeps_the_snapshot(cast, worker, as_user):
    run, lease, effect, pause = pausing_with_a_charge_in_flight(worker, as_user)
    otto = browser("otto")
    page = otto.get(f"/receipts/{pause.pk}/").content.decode()
    assert headline(page).startswith("Pausing — waiting for 1 effect in flight: payments:charge")
    assert 'data-final="0"' in page and f"/receipts/{pause.pk}/now/" in page  # it re-reads itself

    worker.post(
        f"/effects/{effect['id']}/outcome",
        {"fencing_token": lease["fencing_token"], "status": "committed"},
    )
    worker.post(f"/leases/{lease['id']}/release", {"fencing_token": lease["fencing_token"]})
    now = otto.get(f"/receipts/{pause.pk}/now/", HTTP_HX_REQUEST="true").content.decode()
    text = headline(now)
    assert re.match(
        r"Paused — drained at \d\d:\d\d:\d\d UTC: payments:charge committed [\d.]+ s after the pause$",
        text,
    ), text
    assert 'data-final="1"' in now and "hx-trigger" not in now  # nothing moves: it stops asking
    # the decision-time snapshot stays below, said as the past
    assert "Recorded at the decision" in now and "the run was pausing" in now
    assert now.index('data-testid="receipt-now"') < now.index('data-testid="receipt-then"')
    assert "k-charge" in now  # the in-flight table as it stood at the decision
    assert "now pausing" not in now
    # the run page shows the drain too, and its timeline names it
    run_page = otto.get(f"/runs/{run['id']}/").content.decode()
    assert 'data-testid="drained"' in run_page and "committed" in run_page
    assert re.search(r'class="tl-state[^"]*">.*?drained', run_page, re.S)


@pytest.fixture
def world_price():
    """An assumption checker reading a price the test moves, as the world's would (read-only)."""
    registry.load_adapters()
    saved = dict(registry._checkers)
    world = {"price": 12.5, "calls": 0}

    def check(key, value, meta):
        world["calls"] += 1
        return AssumptionCheck(ok=world["price"] == value, current_value=world["price"])

    registry.assumption_checker("test.price")(check)
    yield world
    registry._checkers.clear()
    registry._checkers.update(saved)


def paused_with_an_assumption(worker, as_user) -> dict:
    run = start_run(worker)
    token = claim(worker, run["id"])["lease"]["fencing_token"]
    worker.post(
        f"/runs/{run['id']}/events",
        {
            "fencing_token": token,
            "events": [
                {
                    "kind": "assumption",
                    "data": {"key": "price:sku-1", "value": 12.5, "checker": "test.price"},
                }
            ],
        },
    )
    commit(worker, run["id"], token, "order-42-charge")
    assert intervene(as_user("otto"), run["id"], "pause", "supplier called").status_code == 202
    assert Run.objects.get(pk=run["id"]).state == "paused"
    return run


def resume_dialog(client: Client, run_id: str, **fields) -> str:
    resp = client.post(
        f"/runs/{run_id}/interventions/preview/",
        {"kind": "resume", **fields},
        HTTP_HX_REQUEST="true",
    )
    assert resp.status_code == 200, resp.content[:2000]
    return resp.content.decode()


def test_the_resume_preview_says_it_will_be_blocked_and_re_observe_changes_it(
    cast, worker, as_user, world_price
):
    run = paused_with_an_assumption(worker, as_user)
    otto = browser("otto")
    assert resume_dialog(otto, run["id"]).count('data-testid="will-be-blocked"') == 0  # holds

    world_price["price"] = 14.5
    opened = otto.get(
        f"/runs/{run['id']}/interventions/new/", {"kind": "resume"}, HTTP_HX_REQUEST="true"
    ).content.decode()
    assert 'data-testid="will-be-blocked"' in opened
    assert "Will be blocked: price of sku-1 changed 12.50 → 14.50" in opened
    assert "re-observe stale assumptions" in opened and "override reason" in opened  # ways out
    assert re.search(r'data-testid="confirm-button"[^>]*>Confirm resume — will be blocked<', opened)
    assert 'data-testid="confirm-button" disabled' not in opened  # confirming is still allowed

    ticked = resume_dialog(otto, run["id"], reobserve_assumptions="on")
    assert 'data-testid="will-be-blocked"' not in ticked
    assert re.search(r'data-testid="confirm-button"[^>]*>Confirm resume<', ticked)
    # the preview wrote nothing: the recorded value is still the old one
    assert Assumption.objects.get(run_id=run["id"]).value == 12.5

    # and the job the preview foresaw agrees with it
    assert intervene(as_user("otto"), run["id"], "resume", "try it").status_code == 202
    resume = Intervention.objects.get(run_id=run["id"], kind="resume")
    receipt = otto.get(f"/receipts/{resume.pk}/").content.decode()
    assert headline(receipt).startswith("Revalidating — the job is checking")
    revalidate_run(str(resume.pk))
    now = headline(otto.get(f"/receipts/{resume.pk}/now/").content.decode())
    assert now == (
        "Blocked — the resume was refused: price of sku-1 changed 12.50 → 14.50. "
        "The run is now paused"
    ), now


def test_a_reconcile_receipt_never_says_not_answered_above_completed(
    cast, worker, as_user, world_answers
):
    run = start_run(worker)
    token = claim(worker, run["id"])["lease"]["fencing_token"]
    effect = declare(worker, run["id"], token, key="k-unknown").json()
    worker.post(f"/effects/{effect['id']}/outcome", {"fencing_token": token, "status": "unknown"})
    assert Effect.objects.get(pk=effect["id"]).status == "unknown"
    assert intervene(as_user("otto"), run["id"], "reconcile", "ask the world").status_code == 202
    i = Intervention.objects.get(run_id=run["id"], kind="reconcile")
    otto = browser("otto")
    assert headline(otto.get(f"/receipts/{i.pk}/").content.decode()) == (
        "Asking the world about 1 effect by idempotency key"
    )
    reconcile_run_effects(str(i.pk))
    page = otto.get(f"/receipts/{i.pk}/").content.decode()
    assert headline(page) == "Completed — 1 of 1 settled"
    assert "not answered" not in page and "waiting for the job" not in page
    assert "the world answered committed" in page
    assert not EPOCH.search(page), EPOCH.search(page)
    assert "<summary>job</summary>" not in page  # no raw dump of the job record


def test_an_action_the_role_may_not_take_is_shown_disabled_with_who_may(cast, worker, as_user):
    run = start_run(worker)
    token = claim(worker, run["id"])["lease"]["fencing_token"]
    commit(worker, run["id"], token, "order-42-charge")
    assert intervene(as_user("otto"), run["id"], "pause", "look").status_code == 202
    page = browser("otto").get(f"/runs/{run['id']}/").content.decode()
    m = re.search(r'data-needs="compensate">(.*?)</span></span>', page, re.S)
    assert m, page[page.index('id="run-actions"') :][:2000]
    assert "disabled" in m.group(1)
    # from the role table (compensate: incident commander, admin) and who holds those roles now
    assert "needs incident commander or admin — currently: ian, ada" in m.group(1)
    assert 'data-kind="compensate"' not in page  # not an enabled button
    ian = browser("ian").get(f"/runs/{run['id']}/").content.decode()
    assert 'data-kind="compensate"' in ian and 'data-needs="compensate"' not in ian
