"""Console reports: a resume's revalidation report, a compensation plan and its progress, and a recovery's
decision (the recovery gate) -- on the receipt in the dialog, on the job refresh and on the run page.

State is made through the real services: interventions issued from the console dialog (or by the beat
scan), the follow-up jobs called directly (what the Celery task does), fakes registered through
interventions.registry for the external systems (restored afterwards).
"""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone
from django.utils.html import escape

from interventions import registry
from interventions.compensate import run_compensation_plan
from interventions.models import CompensationPlan, CompensationStep, Intervention
from interventions.recover import run_recovery, scan_expired_leases
from interventions.registry import AssumptionCheck, CompensationResult, ReconcileResult
from interventions.resume import revalidate_run
from runs.models import Agent, ExecutionLease, Run
from tests.conftest import claim, declare, start_run
from tests.interventions.helpers import commit, intervene

pytestmark = pytest.mark.django_db

NEW_VERSIONS = {"code": "1.0.0", "model": "m-1", "tools": {"payments": "3.2"}, "config_hash": "abc"}


def browser(username: str) -> Client:
    client = Client()
    assert client.login(username=username, password=f"pw-{username}")
    return client


def issue(client: Client, run_id: str, kind: str, reason: str, **fields):
    """Open the dialog, then confirm what its preview showed: the console's own path."""
    dialog = client.get(
        f"/runs/{run_id}/interventions/new/", {"kind": kind, **fields}, HTTP_HX_REQUEST="true"
    )
    match = re.search(rb'name="preview_digest" value="([0-9a-f]+)"', dialog.content)
    assert dialog.status_code == 200 and match, dialog.content.decode()[:3000]
    resp = client.post(
        f"/runs/{run_id}/interventions/",
        {"kind": kind, "reason": reason, "preview_digest": match.group(1).decode(), **fields},
        HTTP_HX_REQUEST="true",
    )
    assert resp.status_code == 200, resp.content.decode()[:3000]
    return resp.content.decode()


def job(client: Client, intervention: Intervention) -> str:
    resp = client.get(f"/interventions/{intervention.pk}/job/", HTTP_HX_REQUEST="true")
    assert resp.status_code == 200
    return resp.content.decode()


def section(html: str, element_id: str) -> str:
    start = html.index(f'id="{element_id}"')
    return html[start : html.index("</section>", start)]


def in_order(html: str, *needles: str) -> bool:
    at = [html.index(n) for n in needles]
    return at == sorted(at)


# --- resume: the revalidation report -----------------------------------------------------------------


@pytest.fixture
def price_checker():
    registry.load_adapters()
    saved = dict(registry._checkers)
    registry.assumption_checker("test.price")(
        lambda key, value, meta: AssumptionCheck(
            ok=False, current_value=14.5, detail="supplier raised the price"
        )
    )
    yield
    registry._checkers.clear()
    registry._checkers.update(saved)


def paused_run_with_a_changed_world(worker) -> dict:
    """reserve committed, checkpoint 1, charge committed after it; an assumption the world then broke;
    paused; the agent's workers now run payments 3.2 (the run pinned 3.1)."""
    run = start_run(worker)
    token = claim(worker, run["id"])["lease"]["fencing_token"]
    commit(
        worker,
        run["id"],
        token,
        "order-42-reserve",
        tool="inventory",
        action="reserve",
        step="reserve",
    )
    worker.post(
        f"/runs/{run['id']}/checkpoints",
        {"fencing_token": token, "step": "reserve", "state": {"reserved": True}},
    )
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
    return run


def test_the_resume_receipt_shows_the_revalidation_report_and_the_run_page_keeps_it(
    cast, worker, as_user, price_checker
):
    run = paused_run_with_a_changed_world(worker)
    otto = browser("otto")
    issue(otto, run["id"], "pause", "supplier called")
    assert Run.objects.get(pk=run["id"]).state == "paused"
    Agent.objects.filter(name="purchasing").update(current_versions=NEW_VERSIONS)

    receipt = issue(otto, run["id"], "resume", "world checked")
    resume = Intervention.objects.get(run_id=run["id"], kind="resume")
    assert 'data-job-status="pending"' in receipt and 'data-report="revalidation"' in receipt
    assert "checking the run against the world now" in receipt
    dialog = receipt[
        : receipt.index('<section id="run-header"')
    ]  # then the page behind, out of band
    assert (
        dialog.count('<span class="st st-pending">pending</span>') == 6
    )  # the six checks, not run yet

    revalidate_run(str(resume.pk))
    for html in (job(otto, resume), otto.get(f"/runs/{run['id']}/").content.decode()):
        report = html[html.index('data-report="revalidation"') :]
        assert 'data-outcome="blocked"' in html and "Blocked" in report
        assert re.search(r'data-check="versions">.*?st-fail', report, re.S)
        assert re.search(r'data-check="assumptions">.*?st-fail', report, re.S)
        assert re.search(r'data-check="boundary">.*?st-pass', report, re.S)
        assert re.search(r'data-check="replay">.*?st-pass', report, re.S)
        # the version diff, name then → now
        assert re.search(
            r'data-version="tools.payments"><td><code>tools.payments</code></td><td><code>3.1</code></td>'
            r"<td>→</td><td><code>3.2</code></td>",
            report,
        )
        # the stale assumption: key, recorded, current, problem
        stale = report[report.index('data-assumption="price:sku-1"') :]
        assert "12.5" in stale and "14.5" in stale and "supplier raised the price" in stale
        assert (
            "Resumes from checkpoint <strong>1</strong>, after step <code>reserve</code>" in report
        )
        # the step that runs again, its effect's key, protected
        replay = report[report.index('data-replay-step="charge"') :]
        assert (
            "payments:charge" in replay and "order-42-charge" in replay and ">protected<" in replay
        )
        assert "payments:charge" in report and "inventory:*" in report  # authority now
        assert "Not overridden" in report

    # An incident commander overrides with a reason; the report says who and why, and that it resumed.
    ian = as_user("ian")
    ok = intervene(
        ian,
        run["id"],
        "resume",
        "tool bump is compatible",
        override_reason="payments 3.2 is backwards compatible",
    )
    assert ok.status_code == 202, ok.content
    revalidate_run(ok.json()["id"])
    page = otto.get(f"/runs/{run['id']}/").content.decode()
    overridden = page[page.index(f'id="rp-{ok.json()["id"]}-completed"') :]
    assert 'data-outcome="resumed"' in overridden and "Resumed" in overridden
    assert re.search(
        r"overridden by <strong>[^<]*ian</strong> \(incident_commander\): “payments 3.2 is backwards compatible”",
        overridden,
    )
    assert 'data-state="queued"' in overridden


# --- compensate: the plan and its progress -------------------------------------------------------------

SAGA = [
    ("reserve", "inventory", "reserve", {"tool": "inventory", "action": "release"}),
    ("label", "shipping", "create_label", {"tool": "shipping", "action": "void_label"}),
    ("charge", "payments", "charge", {"tool": "payments", "action": "refund"}),
]
AUTHORITY = [
    {"scope": s, "ttl_s": 3600}
    for s in ("inventory:*", "shipping:*", "payments:charge", "notifications:*")
]


class Compensators:
    def __init__(self):
        self.failures: dict[tuple[str, str], list[CompensationResult]] = {}

    def __call__(self, effect, key: str) -> CompensationResult:
        injected = self.failures.get((effect.tool, effect.action))
        if injected:
            return injected.pop(0)
        return CompensationResult(ok=True, external_ref=f"undo-{effect.idempotency_key}")


@pytest.fixture
def compensators():
    registry.load_adapters()
    saved = dict(registry._compensators)
    fake = Compensators()
    for tool, action in [
        ("inventory", "reserve"),
        ("shipping", "create_label"),
        ("payments", "charge"),
        ("notifications", "enqueue"),
    ]:
        registry.compensator(tool, action)(fake)
    yield fake
    registry._compensators.clear()
    registry._compensators.update(saved)


def saga_run(worker) -> dict:
    """reserve, label, charge committed (each with a compensation), plus an irreversible notification and
    a note without compensation; then the run finished."""
    run = start_run(worker, authority=AUTHORITY)
    token = claim(worker, run["id"])["lease"]["fencing_token"]
    extra = [
        ("notify", "notifications", "enqueue", "irreversible"),
        ("note", "notifications", "enqueue", None),
    ]
    for step, tool, action, comp in [*SAGA, *extra]:
        body = {"step": step, "tool": tool, "action": action, "args": {"step": step}}
        if comp == "irreversible":
            body.update(compensation=None, irreversible=True)
        else:
            body["compensation"] = comp
        commit(worker, run["id"], token, f"order-1-{step}", **body)
    assert (
        worker.post(
            f"/runs/{run['id']}/finish", {"fencing_token": token, "outcome": "succeeded"}
        ).status_code
        == 200
    )
    return run


def test_the_compensation_plan_is_shown_in_order_with_its_progress_and_how_it_ended(
    cast, worker, compensators
):
    run = saga_run(worker)
    compensators.failures[("payments", "charge")] = [
        CompensationResult(
            ok=False,
            retryable=True,
            detail={"error": "timeout", "message": "payments did not answer"},
        ),
        CompensationResult(
            ok=False,
            retryable=False,
            detail={"error": "refund_refused", "message": "charge already disputed"},
        ),
    ]
    ian = browser("ian")
    receipt = issue(ian, run["id"], "compensate", "order cancelled by customer")
    intervention = Intervention.objects.get(run_id=run["id"], kind="compensate")
    plan = CompensationPlan.objects.get(intervention=intervention)
    assert 'data-job-status="pending"' in receipt and 'data-plan-status="pending"' in receipt
    assert "0 of 3 steps" in receipt and "executing in order" in receipt
    # the order: newest first, each original effect with its key, each compensation with its own
    assert in_order(
        receipt[receipt.index('data-report="compensation"') :],  # the plan's table, after the card
        'data-position="1"',
        "payments:refund",
        "compensate:order-1-charge",
        'data-position="2"',
        "shipping:void_label",
        "compensate:order-1-label",
        'data-position="3"',
        "inventory:release",
        "compensate:order-1-reserve",
    )
    assert 'data-called-out="order-1-notify"' in receipt and "irreversible" in receipt
    card = receipt[
        receipt.index('data-testid="receipt-card"') : receipt.index('data-report="compensation"')
    ]
    assert re.findall(r'<dt data-answer="([a-z_]+)"', card)[:2] == ["plan", "irreversible"]
    assert "notifications:enqueue (order-1-notify)" in card  # called out in the card's first lines
    assert 'data-called-out="order-1-note"' in receipt and "no compensation was declared" in receipt

    # While it runs: the first step failed once and waits for its backoff.
    CompensationPlan.objects.filter(pk=plan.pk).update(options={**plan.options, "backoff_s": 60})
    assert run_compensation_plan(str(plan.pk))["status"] == "retry_scheduled"
    running = job(ian, intervention)
    assert 'data-plan-status="running"' in running and 'data-job-status="pending"' in running
    first = running[running.index('data-position="1"') : running.index('data-position="2"')]
    assert (
        'data-step-status="pending"' in first
        and "timeout · payments did not answer" in first
        and "next attempt" in first
    )
    page = ian.get(f"/runs/{run['id']}/").content.decode()
    assert 'data-plan-status="running"' in section(page, "run-compensation")
    assert '<progress max="3" value="0"' in section(page, "run-compensation")

    # The retry is refused for good; the other two steps are done: partially_failed, never silently.
    CompensationStep.objects.filter(plan=plan, position=1).update(
        next_attempt_at=timezone.now() - timedelta(seconds=1)
    )
    assert run_compensation_plan(str(plan.pk)) == {
        "status": "partially_failed",
        "finished": True,
        "summary": CompensationPlan.objects.get(pk=plan.pk).result["summary"],
    }
    for html in (
        job(ian, intervention),
        section(ian.get(f"/runs/{run['id']}/").content.decode(), "run-compensation"),
    ):
        assert (
            'data-plan-status="partially_failed"' in html
            and "compensation partially_failed: 2 of 3 step(s) done" in html
        )
        assert '<progress max="3" value="3"' in html and "3 of 3 steps" in html
        assert in_order(
            html,
            "compensate:order-1-charge",
            "compensate:order-1-label",
            "compensate:order-1-reserve",
        )
        failed = html[html.index('data-position="1"') : html.index('data-position="2"')]
        assert (
            'data-step-status="failed"' in failed
            and "refund_refused · charge already disputed" in failed
        )
        assert "not retryable" in failed and re.search(
            r'<td class="num">2</td>', failed
        )  # two attempts
        done = html[html.index('data-position="2"') :]
        assert 'data-step-status="done"' in done and "undo-order-1-label" in done
    page = ian.get(f"/runs/{run['id']}/").content.decode()
    assert "<h2>Compensation <span" in page and not re.search(
        r'<section id="run-compensation"[^>]*hidden>', page
    )


def test_a_run_without_plans_or_recoveries_keeps_the_sections_hidden_for_later_pushes(cast, worker):
    run = start_run(worker)
    page = browser("vera").get(f"/runs/{run['id']}/").content.decode()
    assert re.search(r'<section id="run-compensation"[^>]*hidden>\s*</section>', page)
    assert re.search(r'<section id="run-recovery"[^>]*hidden>\s*</section>', page)
    part = browser("vera").get(f"/runs/{run['id']}/?part=compensation", HTTP_HX_REQUEST="true")
    assert part.status_code == 200 and b'id="run-compensation"' in part.content


# --- recover: the recovery gate ----------------------------------------------------------------------------

VERSIONS = {"code": "1.0.0", "model": "m-1", "tools": {"payments": "3.1"}, "config_hash": "abc"}


class World:
    def __init__(self):
        self.committed = {"order-9-charge": "ch_1"}
        self.answer_unknown = False

    def reconcile(self, tool: str, action: str, key: str) -> ReconcileResult:
        if self.answer_unknown:
            return ReconcileResult("unknown", evidence={"error": "unavailable"})
        if key in self.committed:
            return ReconcileResult(
                "committed", external_ref=self.committed[key], evidence={"found": True, "key": key}
            )
        return ReconcileResult("not_found", evidence={"found": False, "key": key})


@pytest.fixture
def world():
    registry.load_adapters()
    saved = dict(registry._reconcilers)
    fake = World()
    for tool in ("inventory", "payments"):
        registry.reconciler(tool)(fake.reconcile)
    yield fake
    registry._reconcilers.clear()
    registry._reconcilers.update(saved)


def orphaned_run(worker) -> dict:
    """reserve committed, checkpoint 1, charge dispatched -- then worker-7 vanished."""
    run = start_run(
        worker,
        authority=[{"scope": s, "ttl_s": 3600} for s in ("inventory:*", "payments:charge")],
        versions=VERSIONS,
    )
    lease = worker.post(
        f"/runs/{run['id']}/claim", {"worker": "worker-7", "versions": VERSIONS}
    ).json()["lease"]
    token = lease["fencing_token"]
    commit(
        worker,
        run["id"],
        token,
        "order-9-reserve",
        step="reserve",
        tool="inventory",
        action="reserve",
        compensation={"tool": "inventory", "action": "release"},
    )
    worker.post(
        f"/runs/{run['id']}/checkpoints",
        {"fencing_token": token, "step": "reserve", "state": {"reserved": "res-1"}},
    )
    worker.post(
        f"/runs/{run['id']}/events",
        {"fencing_token": token, "events": [{"kind": "step_started", "data": {"step": "charge"}}]},
    )
    assert declare(worker, run["id"], token, key="order-9-charge").status_code == 201
    ExecutionLease.objects.filter(run_id=run["id"]).update(expires_at="2000-01-01T00:00:00Z")
    return run | {"token": token}


def test_the_recovery_gate_shows_what_was_found_and_why_the_redrive_is_safe(cast, worker, world):
    run = orphaned_run(worker)
    assert scan_expired_leases() == [run["id"]]  # the beat scan orphans it and issues the recovery
    intervention = Intervention.objects.get(run_id=run["id"], kind="recover")
    otto = browser("otto")
    pending = section(otto.get(f"/runs/{run['id']}/").content.decode(), "run-recovery")
    assert "Recovery gate" in pending and "reconciling the run with the world" in pending
    assert "worker <code>worker-7</code>, fencing token <strong>1</strong>" in pending

    run_recovery(str(intervention.pk))
    intervention.refresh_from_db()
    why = intervention.receipt["job"]["why"]
    assert "same idempotency keys" in why
    page = otto.get(f"/runs/{run['id']}/").content.decode()
    for html in (section(page, "run-recovery"), job(otto, intervention)):
        gate = html[html.index('class="decision gate ok"') :]
        assert "Chosen: redrive" in gate and "why this is safe" in gate and escape(why) in gate
        assert "next attempt starts from checkpoint 1 <code>reserve</code>" in gate
        assert "fencing token 1 and older are refused" in gate
        assert "<dt>trigger</dt><dd>lease_expired</dd>" in html
        assert "worker <code>worker-7</code>, fencing token <strong>1</strong>" in html
        assert re.search(r"checkpoint 1 <code>reserve</code> \+ \d+ history events? after it", html)
        assert "steps to run again: <code>charge</code>" in html
        assert re.search(
            r'<span class="st st-pass">verified</span> \d+ events', html
        )  # history chain
        assert re.search(
            r"<dt>checkpoint</dt><dd><span class=\"st st-pass\">ok</span>\s*seq 1", html
        )
        assert (
            '<span class="st st-pass">runnable</span> a worker reports the run&#x27;s versions'
            in html
        )
        reconciled = html[html.index('data-reconciled="order-9-charge"') :]
        assert (
            "payments:charge" in reconciled
            and "st-in_flight" in reconciled
            and "st-committed" in reconciled
        )
        assert "ch_1" in reconciled and "answer:</span> committed" in reconciled
        assert '<h4>Unresolved after reconciliation</h4>\n  <p class="muted">none</p>' in html


def test_an_escalated_recovery_says_why_a_person_must_decide(cast, worker, world, settings):
    settings.RECOVERY_AUTOMATIC = False  # an operator starts it from the console instead
    run = orphaned_run(worker)
    world.answer_unknown = True
    scan_expired_leases()
    assert Run.objects.get(pk=run["id"]).state == "orphaned"
    otto = browser("otto")
    receipt = issue(otto, run["id"], "recover", "worker-7 is gone", prefer="redrive")
    intervention = Intervention.objects.get(run_id=run["id"], kind="recover")
    assert 'data-job-status="pending"' in receipt and 'data-report="recovery"' in receipt
    assert "reconciling the run with the world (1 effect to ask about)" in receipt

    run_recovery(str(intervention.pk))
    html = job(otto, intervention)
    gate = html[html.index('class="decision gate bad"') :]
    assert "Escalated to a person" in gate and "why a person must decide" in gate
    assert "1 effect(s) still of unknown outcome after asking the world: order-9-charge" in gate
    assert "a person decides: reconcile, resume, compensate or cancel" in gate
    unresolved = html[html.index("<h4>Unresolved after reconciliation</h4>") :]
    assert "order-9-charge" in unresolved.split("</table>")[0]
    assert "the external system could not answer" in html and "unavailable" in html
    assert 'data-state="paused"' in gate


def test_a_recovery_that_compensates_points_to_its_plan_and_the_plan_shows_its_progress(
    cast, worker, world, compensators, settings
):
    settings.RECOVERY_AUTOMATIC = False
    run = orphaned_run(worker)
    scan_expired_leases()
    ian = browser("ian")
    issue(ian, run["id"], "recover", "undo the order instead", prefer="compensate")
    intervention = Intervention.objects.get(run_id=run["id"], kind="recover")
    run_recovery(str(intervention.pk))
    plan = CompensationPlan.objects.get(intervention=intervention)
    page = ian.get(f"/runs/{run['id']}/").content.decode()
    gate = section(page, "run-recovery")
    assert "Chosen: compensate" in gate and "compensation was preferred" in gate
    assert (
        "It started compensation plan" in gate
        and f'<code class="id" title="{plan.pk}">' in gate
        and "st-pending" in gate
    )
    assert in_order(
        section(page, "run-compensation"), "compensate:order-9-charge", "compensate:order-9-reserve"
    )
    assert run_compensation_plan(str(plan.pk))["status"] == "completed"
    page = ian.get(f"/runs/{run['id']}/").content.decode()
    assert 'data-plan-status="completed"' in section(page, "run-compensation")
    row = page[
        page.index(f'id="rp-{intervention.pk}-completed-completed-2-0-2"') :
    ]  # the receipt redrawn with it
    assert 'data-report="recovery"' in row and 'data-plan-status="completed"' in row


def test_the_resume_preview_shows_each_check_as_pass_or_fail_and_what_runs_again(
    cast, worker, price_checker
):
    run = paused_run_with_a_changed_world(worker)
    otto = browser("otto")
    issue(otto, run["id"], "pause", "supplier called")
    Agent.objects.filter(name="purchasing").update(current_versions=NEW_VERSIONS)
    html = otto.get(
        f"/runs/{run['id']}/interventions/new/", {"kind": "resume"}, HTTP_HX_REQUEST="true"
    ).content.decode()
    card = html[html.index('data-testid="preview-card"') :]
    assert re.findall(r'<dt data-answer="([a-z_]+)"', card)[:2] == ["checks", "runs_again"]

    def check(name: str) -> str:
        return re.search(rf'<tr[^>]*data-testid="check-{name}">(.*?)</tr>', card, re.S).group(1)

    assert (
        "st-fail" in check("versions") and "3.1" in check("versions") and "3.2" in check("versions")
    )
    assert "st-fail" in check("assumptions") and "price:sku-1" in check("assumptions")
    assert "st-pass" in check("unknown_effects") and "st-pass" in check("authority")
    runs_again = card[card.index('data-answer-for="runs_again"') :]
    runs_again = runs_again[: runs_again.index("</dd>")]
    assert "checkpoint 1 · reserve" in runs_again
    assert "order-42-charge" in runs_again and "replays the recorded result" in runs_again
    assert "order-42-reserve" not in runs_again  # before the checkpoint: it does not run again
    assert Run.objects.get(pk=run["id"]).state == "paused"  # the dry run changed nothing
