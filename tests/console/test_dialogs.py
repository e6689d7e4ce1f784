"""Console intervention dialogs: preview before confirm, receipt after, domain errors inline with their
HTTP status, CSRF, the reconcile form, the approvals inbox and the contracts page."""

from __future__ import annotations

import re

import pytest
from django.test import Client
from django.utils.html import escape

from audit.models import AuditEvent
from interventions.models import Intervention
from interventions.plugins import REGISTRY
from runs.models import Approval, Effect, Run
from runs.states import State
from tests.conftest import Api, claim, declare, start_run
from tests.interventions.helpers import intervene, running_run

pytestmark = pytest.mark.django_db


def browser(username: str, **kwargs) -> Client:
    client = Client(**kwargs)
    assert client.login(username=username, password=f"pw-{username}")
    return client


def token_of(html: bytes) -> str:
    match = re.search(rb'name="preview_digest" value="([0-9a-f]+)"', html)
    assert match, html.decode()[:2000]
    return match.group(1).decode()


def open_dialog(client: Client, run_id: str, kind: str, **params):
    return client.get(
        f"/runs/{run_id}/interventions/new/", {"kind": kind, **params}, HTTP_HX_REQUEST="true"
    )


def confirm(client: Client, run_id: str, kind: str, token: str, **fields):
    return client.post(
        f"/runs/{run_id}/interventions/",
        {"kind": kind, "preview_digest": token, **fields},
        HTTP_HX_REQUEST="true",
    )


def test_operator_previews_then_confirms_a_pause_and_sees_the_receipt(cast, worker):
    run, lease = running_run(worker)
    assert (
        declare(worker, run["id"], lease["lease"]["fencing_token"], key="k-inflight").status_code
        == 201
    )
    otto = browser("otto")
    dialog = open_dialog(otto, run["id"], "pause")
    assert dialog.status_code == 200
    html = dialog.content.decode()
    assert (
        "Preview — nothing has changed yet" in html and "k-inflight" in html
    )  # the in-flight effect is named
    assert 'data-state="running"' in html and 'data-state="pausing"' in html
    assert 'name="reason"' in html and "required" in html and 'name="suspend_authority"' in html
    assert Run.objects.get(pk=run["id"]).state == State.RUNNING  # a preview changes nothing

    preview = otto.post(
        f"/runs/{run['id']}/interventions/preview/",
        {"kind": "pause", "scope": "tree"},
        HTTP_HX_REQUEST="true",
    )
    assert preview.status_code == 200 and b"<html" not in preview.content
    token = token_of(preview.content)
    resp = confirm(otto, run["id"], "pause", token, scope="tree", reason="supplier price changed")
    assert resp.status_code == 200, resp.content.decode()[:3000]
    receipt = resp.content.decode()
    assert (
        "Receipt · Pause" in receipt
        and "supplier price changed" in receipt
        and "k-inflight" in receipt
    )
    assert (
        'id="run-header" class="panel" hx-swap-oob="true"' in receipt
    )  # the page behind refreshes too
    intervention = Intervention.objects.get(run_id=run["id"], kind="pause")
    assert intervention.reason == "supplier price changed" and intervention.scope == "tree"
    assert intervention.actor_label == "user:otto"
    assert Run.objects.get(pk=run["id"]).state == State.PAUSING
    assert AuditEvent.objects.filter(
        action="intervention.pause", outcome="allowed", component="console"
    ).exists()


def test_viewer_gets_403_for_dialog_preview_and_confirm_and_the_refusal_is_audited(cast, worker):
    run, _ = running_run(worker)
    vera = browser("vera")
    assert open_dialog(vera, run["id"], "pause").status_code == 403
    preview = vera.post(
        f"/runs/{run['id']}/interventions/preview/", {"kind": "pause"}, HTTP_HX_REQUEST="true"
    )
    assert preview.status_code == 403 and b'data-status="403"' in preview.content
    resp = confirm(vera, run["id"], "pause", "whatever", reason="I want to")
    assert resp.status_code == 403 and b"forbidden" in resp.content
    assert Run.objects.get(pk=run["id"]).state == State.RUNNING
    assert AuditEvent.objects.filter(
        action="intervention.pause", outcome="denied", actor="vera"
    ).exists()


def test_confirm_needs_a_reason_and_the_previewed_options(cast, worker):
    run, _ = running_run(worker)
    otto = browser("otto")
    token = token_of(open_dialog(otto, run["id"], "pause").content)
    no_reason = confirm(otto, run["id"], "pause", token, reason="  ")
    assert no_reason.status_code == 422 and b"a reason is required" in no_reason.content
    changed = confirm(otto, run["id"], "pause", token, reason="r", suspend_authority="on")
    assert changed.status_code == 409 and b'data-testid="preview-changed"' in changed.content
    # Only the preview is redrawn (the form keeps what was typed): the new one, with its digest.
    assert changed["HX-Retarget"] == "#preview" and changed["HX-Reswap"] == "outerHTML"
    assert b'name="reason"' not in changed.content and token_of(changed.content) != token
    assert Run.objects.get(pk=run["id"]).state == State.RUNNING
    assert not Intervention.objects.filter(run_id=run["id"]).exists()


def test_csrf_is_enforced_on_console_posts(cast, worker):
    run, _ = running_run(worker)
    otto = browser("otto", enforce_csrf_checks=True)
    page = otto.get(f"/runs/{run['id']}/").content.decode()
    token = token_of(open_dialog(otto, run["id"], "pause").content)
    refused = otto.post(
        f"/runs/{run['id']}/interventions/",
        {"kind": "pause", "preview_digest": token, "reason": "r"},
    )
    assert refused.status_code == 403 and b"CSRF" in refused.content
    assert Run.objects.get(pk=run["id"]).state == State.RUNNING
    csrf = re.search(r'hx-headers=\'\{"X-CSRFToken": "([^"]+)"\}\'', page).group(
        1
    )  # what htmx sends
    ok = otto.post(
        f"/runs/{run['id']}/interventions/",
        {"kind": "pause", "preview_digest": token, "reason": "r"},
        HTTP_X_CSRFTOKEN=csrf,
        HTTP_HX_REQUEST="true",
    )
    assert ok.status_code == 200 and Run.objects.get(pk=run["id"]).state in (
        State.PAUSING,
        State.PAUSED,
    )


def test_a_domain_error_is_shown_inline_with_its_status(cast, worker, as_user):
    run, _ = running_run(worker)
    intervene(
        as_user("otto"),
        run["id"],
        "transfer",
        options={"facets": ["decision_authority"], "to": "olga"},
    )
    otto = browser("otto")
    # otto no longer holds decision authority; an operator may not override: the preview says so.
    dialog = open_dialog(otto, run["id"], "cancel")
    assert (
        dialog.status_code == 200
        and b'data-status="403"' in dialog.content
        and b"not_decision_authority" in dialog.content
    )
    assert b"olga holds decision authority" in dialog.content
    # ian may override, with a reason, and the field is offered to him.
    ian = browser("ian")
    html = open_dialog(ian, run["id"], "cancel").content
    assert b'name="override_reason"' in html and b'data-status="403"' in html
    preview = ian.post(
        f"/runs/{run['id']}/interventions/preview/",
        {"kind": "cancel", "override_reason": "olga is off shift"},
        HTTP_HX_REQUEST="true",
    )
    assert preview.status_code == 200
    resp = confirm(
        ian,
        run["id"],
        "cancel",
        token_of(preview.content),
        override_reason="olga is off shift",
        reason="incident 42",
    )
    assert resp.status_code == 200 and b"override" in resp.content
    assert Run.objects.get(pk=run["id"]).state == State.CANCELLING


def test_four_eyes_refusal_is_shown_and_another_approver_decides(cast, worker, as_user):
    ian_api = as_user("ian")
    run = start_run(ian_api)  # ian started the run: he may never approve its actions
    lease = claim(worker, run["id"])
    asked = worker.post(
        f"/runs/{run['id']}/approvals",
        {
            "fencing_token": lease["lease"]["fencing_token"],
            "tool": "payments",
            "action": "charge",
            "args": {"amount": 900},
            "reason": "large charge",
        },
    )
    assert asked.status_code == 201, asked.content
    approval = Approval.objects.get(run_id=run["id"])
    ian = browser("ian")
    inbox = ian.get("/approvals/").content.decode()
    assert str(approval.pk)[:8] in inbox and "the service will refuse your decision" in inbox
    dialog = open_dialog(ian, run["id"], "approve", approval_id=str(approval.pk), origin="inbox")
    resp = confirm(
        ian,
        run["id"],
        "approve",
        token_of(dialog.content),
        approval_id=str(approval.pk),
        reason="looks fine",
        origin="inbox",
    )
    assert resp.status_code == 403 and b"separation_of_duties" in resp.content
    april = browser("april")
    dialog = open_dialog(april, run["id"], "approve", approval_id=str(approval.pk), origin="inbox")
    assert (
        b"large charge" in dialog.content and b"900" in dialog.content
    )  # what the approver is shown
    resp = confirm(
        april,
        run["id"],
        "approve",
        token_of(dialog.content),
        approval_id=str(approval.pk),
        reason="within budget",
        origin="inbox",
    )
    assert (
        resp.status_code == 200 and b'id="inbox" class="panel" hx-swap-oob="true"' in resp.content
    )
    assert Approval.objects.get(pk=approval.pk).status == Approval.APPROVED
    assert b"Nothing waiting for you" in april.get("/approvals/").content
    assert b"Nothing waiting for you" in browser("vera").get("/approvals/").content


def test_operator_reconciles_an_unknown_effect_with_evidence(cast, worker):
    run, lease = running_run(worker)
    token = lease["lease"]["fencing_token"]
    effect = declare(worker, run["id"], token, key="k-ambiguous").json()
    worker.post(f"/effects/{effect['id']}/outcome", {"fencing_token": token, "status": "unknown"})
    vera = browser("vera")
    assert vera.get(f"/effects/{effect['id']}/reconcile/").status_code == 403
    otto = browser("otto")
    form = otto.get(f"/effects/{effect['id']}/reconcile/", HTTP_HX_REQUEST="true")
    assert form.status_code == 200 and b"k-ambiguous" in form.content
    missing = otto.post(
        f"/effects/{effect['id']}/reconcile/", {"outcome": "committed", "reason": "r"}
    )
    assert missing.status_code == 422
    resp = otto.post(
        f"/effects/{effect['id']}/reconcile/",
        {
            "outcome": "committed",
            "evidence": "payments dashboard shows ch_9",
            "external_ref": "ch_9",
            "reason": "checked by hand",
        },
        HTTP_HX_REQUEST="true",
    )
    assert resp.status_code == 200, resp.content.decode()[:2000]
    settled = Effect.objects.get(pk=effect["id"])
    assert (
        settled.status == Effect.COMMITTED and settled.reconciled and settled.external_ref == "ch_9"
    )
    assert settled.reconciliation["evidence"] == "payments dashboard shows ch_9"
    again = otto.post(
        f"/effects/{effect['id']}/reconcile/",
        {"outcome": "failed", "evidence": "e", "reason": "r"},
        HTTP_HX_REQUEST="true",
    )
    assert again.status_code == 409 and b"already committed" in again.content
    # The refusal answers into the form's error slot only: the dialog and its fields hold still.
    assert again.headers["HX-Retarget"] == "#reconcile-error"
    assert b"<form" not in again.content and b'role="alert"' in again.content


def test_receipt_job_status_is_served_for_refresh(cast, worker):
    run, _ = running_run(worker)
    api = Api(Client(), cast["otto"][1])
    intervene(api, run["id"], "pause")
    worker.post(
        f"/leases/{Run.objects.get(pk=run['id']).leases.get().pk}/release", {"fencing_token": 1}
    )
    assert intervene(api, run["id"], "resume").status_code == 202
    resume = Intervention.objects.get(run_id=run["id"], kind="resume")
    resp = browser("otto").get(f"/interventions/{resume.pk}/job/", HTTP_HX_REQUEST="true")
    assert resp.status_code == 200 and f'id="job-{resume.pk}"'.encode() in resp.content
    assert b'data-job-status="pending"' in resp.content and b"every 5s" in resp.content


def test_contracts_page_lists_every_kind_the_state_table_and_the_matrix(cast):
    html = browser("vera").get("/contracts/").content.decode()
    for kind, c in REGISTRY.items():
        assert f'id="contract-{kind}"' in html
        assert escape(c.spec.summary) in html
    assert 'id="state-table"' in html and "no_unresolved_effects" in html and "audit_export" in html


@pytest.mark.parametrize("kind", sorted(REGISTRY))
def test_every_kinds_dialog_opens_with_a_preview_or_an_inline_refusal(cast, worker, kind):
    run, lease = running_run(worker)
    declare(worker, run["id"], lease["lease"]["fencing_token"], key="k-1")
    resp = open_dialog(browser("ada"), run["id"], kind)
    assert resp.status_code == 200
    html = resp.content.decode()
    assert f'name="kind" value="{kind}"' in html and 'name="reason"' in html
    assert (
        "Preview — nothing has changed yet" in html
        or 'class="error"' in html
        or 'data-testid="preview-hint"' in html  # input not given yet: a prompt, not an error
    )
    assert "HTTP 4" not in html


# --- cards: the answer first, digests, blocking problems, receipts' permalinks ------------------------

MICROSECONDS = re.compile(r"\d{2}:\d{2}:\d{2}\.\d{3,6}")
PYTHON_DICT = re.compile(r"\{'|&#x27;\w+&#x27;:|\{&#x27;")


def answers_of(html: str, testid: str = "preview-card") -> list[str]:
    """The answer keys of a card, in the order they are drawn."""
    start = html.index(f'data-testid="{testid}"')
    return re.findall(r'<dt data-answer="([a-z_]+)"', html[start:])


def digest_of(html: bytes) -> str:
    return token_of(html)


def basis_of(html: bytes) -> str:
    match = re.search(rb'name="preview_basis" value="([^"]*)"', html)
    assert match
    return match.group(1).decode().replace("&quot;", '"')


def sections_of(html: bytes) -> str:
    match = re.search(rb'name="preview_sections" value="([^"]*)"', html)
    assert match
    return match.group(1).decode().replace("&quot;", '"')


def assert_readable(html: str) -> None:
    assert not MICROSECONDS.search(html), MICROSECONDS.search(html)
    assert not PYTHON_DICT.search(html), html[max(0, PYTHON_DICT.search(html).start() - 200) :][
        :400
    ]


def inflight_run_with_child(worker) -> dict:
    run, lease = running_run(worker)
    token = lease["lease"]["fencing_token"]
    assert declare(worker, run["id"], token, key="k-charge").status_code == 201
    start_run(worker, parent_run_id=run["id"], goal="verify address")
    return run


FIRST_ANSWERS = {
    "pause": ["stops", "may_still_complete", "children", "authority", "timers", "resume_from"],
    "cancel": ["stops", "committed", "may_still_complete", "children"],
    "transfer": ["facets", "unresolved", "approvals", "authority"],
    "suspend_authority": ["grants", "declarations", "may_still_complete"],
    "reconcile": ["to_reconcile"],
    "close": ["final", "committed", "unresolved"],
    "resume": ["checks", "runs_again"],
    "retry": ["next_attempt", "from_checkpoint", "keys", "last_attempt"],
    "compensate": ["plan", "irreversible", "skipped"],
    "recover": ["dead_lease", "to_reconcile", "rebuild_from", "versions", "prefer"],
}
STATE_FOR = {
    "resume": State.PAUSED,
    "retry": State.FAILED,
    "compensate": State.CANCELLED,
    "recover": State.ORPHANED,
    "close": State.FAILED,
}


@pytest.mark.parametrize("kind", sorted(FIRST_ANSWERS))
def test_each_preview_card_starts_with_its_answer_lines(cast, worker, kind):
    from tests.conftest import place_run_in

    run = inflight_run_with_child(worker)
    if kind in STATE_FOR:
        place_run_in(run["id"], STATE_FOR[kind])
    ada = browser("ada")
    # a destructive choice is never pre-selected (the grant to suspend or revoke): it is given here
    chosen = (
        {"grant_scope": "payments:*"} if kind in ("suspend_authority", "revoke_authority") else {}
    )
    dialog = open_dialog(ada, run["id"], kind, to="ian", **chosen)
    html = dialog.content.decode()
    assert dialog.status_code == 200 and 'data-testid="preview-card"' in html, html[:3000]
    expected = FIRST_ANSWERS[kind]
    assert answers_of(html)[: len(expected)] == expected
    assert 'data-testid="confirm-button"' in html
    assert_readable(html)


def test_pause_card_names_the_in_flight_effect_with_its_age_and_the_child_in_scope(cast, worker):
    run = inflight_run_with_child(worker)
    html = open_dialog(browser("otto"), run["id"], "pause", scope="tree").content.decode()
    in_flight = re.search(r'<tr data-testid="in-flight">(.*?)</tr>', html, re.S).group(1)
    assert "payments:charge" in in_flight and "k-charge" in in_flight
    assert re.search(
        r'<time datetime="\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ" title="[^"]+ UTC">(just now|\d+ s ago)</time>',
        in_flight,
    )
    child = re.search(r'<tr data-testid="child">(.*?)</tr>', html, re.S).group(1)
    assert "<td>yes</td>" in child  # in scope with scope=tree
    assert 'class="copy" data-copy="' in child  # the child's id is copyable


def test_compensate_plan_is_a_table_in_reverse_order_with_irreversible_rows_marked(cast, worker):
    from tests.conftest import place_run_in
    from tests.interventions.helpers import commit

    run, lease = running_run(worker)
    token = lease["lease"]["fencing_token"]
    commit(
        worker,
        run["id"],
        token,
        "k-reserve",
        step="reserve",
        tool="inventory",
        action="reserve",
        compensation={"tool": "inventory", "action": "release"},
    )
    commit(
        worker,
        run["id"],
        token,
        "k-notify",
        step="notify",
        tool="inventory",
        action="notify_supplier",
        compensation=None,
        irreversible=True,
    )
    commit(worker, run["id"], token, "k-charge", step="charge")
    place_run_in(run["id"], State.CANCELLED)
    html = open_dialog(browser("ian"), run["id"], "compensate").content.decode()
    assert 'data-testid="preview-card"' in html, html[:3000]
    plan = html[html.index('data-answer-for="plan"') :]
    plan = plan[: plan.index("</table>")]
    rows = re.findall(r"<tr[^>]*>(.*?)</tr>", plan, re.S)[1:]  # after the header
    keys = [re.search(r"k-(\w+)", r).group(0) for r in rows]
    assert keys == ["k-charge", "k-notify", "k-reserve"]  # newest first, the irreversible in place
    assert 'data-mark="irreversible"' in plan
    marked = re.search(r'<tr class="irreversible"[^>]*>(.*?)</tr>', plan, re.S).group(1)
    assert "k-notify" in marked and "irreversible" in marked
    assert "inventory:notify_supplier (k-notify)" in html  # called out in the second line too
    assert_readable(html)


def test_a_stale_digest_is_refused_with_what_changed_on_the_console(cast, worker):
    run, lease = running_run(worker)
    otto = browser("otto")
    dialog = open_dialog(otto, run["id"], "pause")
    digest, sections = digest_of(dialog.content), sections_of(dialog.content)
    basis = basis_of(dialog.content)
    # the run moves on while the dialog is open: an effect is dispatched
    assert (
        declare(worker, run["id"], lease["lease"]["fencing_token"], key="k-late").status_code == 201
    )
    check = otto.post(
        f"/runs/{run['id']}/interventions/preview/",
        {"kind": "pause", "preview_basis": basis, "check": "1", "reason": "half typed"},
        HTTP_HX_REQUEST="true",
    )
    # said in place; the preview itself is not redrawn under the operator
    assert check.status_code == 200 and b'data-testid="run-moved"' in check.content
    assert b"1 new effect" in check.content and b"k-late" not in check.content
    # a blocked preview (Confirm disabled) is re-read on request: the note's button, not a check
    assert b'data-testid="show-new-preview"' in check.content
    assert (
        b"hx-vals='{&quot;check&quot;: &quot;&quot;}'" in check.content
        or b'"check": ""' in check.content
    )
    resp = confirm(otto, run["id"], "pause", digest, reason="r", preview_sections=sections)
    assert resp.status_code == 409 and b'data-testid="preview-changed"' in resp.content
    assert b"in flight effects" in resp.content and b"k-late" in resp.content  # the new preview
    assert resp["HX-Retarget"] == "#preview"
    assert Run.objects.get(pk=run["id"]).state == State.RUNNING
    fresh = confirm(otto, run["id"], "pause", digest_of(resp.content), reason="r")
    assert fresh.status_code == 200 and b'data-testid="receipt-card"' in fresh.content


def test_a_run_that_has_not_moved_answers_the_check_with_204(cast, worker):
    run, _ = running_run(worker)
    otto = browser("otto")
    dialog = open_dialog(otto, run["id"], "pause").content
    again = otto.post(
        f"/runs/{run['id']}/interventions/preview/",
        {"kind": "pause", "preview_basis": basis_of(dialog), "check": "1"},
        HTTP_HX_REQUEST="true",
    )
    assert again.status_code == 204
    # the check polls only where no live run header says it for free (the approvals inbox)
    assert (
        b"every 5s [!document.querySelector(" in dialog
        and b"#run-live.ws-open #run-header" in dialog
    )
    # and no element of the dialog inherits the form's target (#dialog): each names its own
    assert b'id="preview" data-digest' in dialog and b'hx-trigger="every 4s' not in dialog


def test_a_stale_digest_is_refused_on_the_api_and_a_fresh_one_is_accepted(cast, worker, as_user):
    run, lease = running_run(worker)
    otto = as_user("otto")
    body = {"kind": "pause", "reason": "r"}
    seen = otto.post(f"/runs/{run['id']}/interventions/preview", body).json()["digest"]
    assert (
        declare(worker, run["id"], lease["lease"]["fencing_token"], key="k-late").status_code == 201
    )
    stale = intervene(otto, run["id"], "pause", preview_digest=seen)
    assert stale.status_code == 409
    assert stale.json()["error"] == "preview_stale" and stale.json()["field"] == "preview_digest"
    now = otto.post(f"/runs/{run['id']}/interventions/preview", body).json()["digest"]
    assert stale.json()["preview_digest"] == now != seen
    assert intervene(otto, run["id"], "pause", preview_digest=now).status_code == 202
    assert AuditEvent.objects.filter(action="intervention.pause", outcome="denied").exists()


def test_retry_with_a_blocking_problem_disables_confirm_and_refuses_the_post(cast, worker):
    run, lease = running_run(worker)
    token = lease["lease"]["fencing_token"]
    effect = declare(worker, run["id"], token, key="k-lost").json()
    worker.post(f"/effects/{effect['id']}/outcome", {"fencing_token": token, "status": "unknown"})
    from tests.conftest import place_run_in

    place_run_in(run["id"], State.FAILED)
    otto = browser("otto")
    html = open_dialog(otto, run["id"], "retry").content.decode()
    assert 'data-testid="blocking"' in html and "must be reconciled first" in html
    button = re.search(r'<button type="submit"[^>]*data-testid="confirm-button"[^>]*>', html).group(
        0
    )
    assert "disabled" in button
    resp = confirm(otto, run["id"], "retry", digest_of(html.encode()), reason="again")
    assert resp.status_code == 409 and b"effects_unresolved" in resp.content
    assert Run.objects.get(pk=run["id"]).state == State.FAILED


@pytest.mark.parametrize("username", ["vera", "otto", "april", "ian", "sam", "ada"])
def test_every_role_opens_a_receipt_permalink(cast, worker, as_user, username):
    run = inflight_run_with_child(worker)
    receipt = intervene(as_user("otto"), run["id"], "pause", scope="tree").json()
    client = browser(username)
    page = client.get(f"/receipts/{receipt['id']}/")
    html = page.content.decode()
    assert page.status_code == 200 and 'data-testid="receipt-card"' in html
    assert answers_of(html, "receipt-card")[:3] == ["stops", "may_still_complete", "children"]
    assert "k-charge" in html
    assert_readable(html)
    run_page = client.get(f"/runs/{run['id']}/").content.decode()
    assert f'href="/receipts/{receipt["id"]}/"' in run_page


def test_a_receipt_permalink_is_refused_without_a_role_or_a_session(cast, worker, as_user):
    from django.contrib.auth.models import User

    run, _ = running_run(worker)
    receipt = intervene(as_user("otto"), run["id"], "pause").json()
    User.objects.create_user("nobody", password="pw-nobody")
    assert browser("nobody").get(f"/receipts/{receipt['id']}/").status_code == 403
    anonymous = Client().get(f"/receipts/{receipt['id']}/")
    assert anonymous.status_code == 302 and "/login" in anonymous["Location"]
    missing = browser("otto").get("/receipts/00000000-0000-0000-0000-000000000000/")
    assert missing.status_code == 404


def test_the_confirm_receipt_links_its_permalink_and_draws_times_as_relative(cast, worker):
    run = inflight_run_with_child(worker)
    otto = browser("otto")
    digest = digest_of(open_dialog(otto, run["id"], "pause").content)
    html = confirm(otto, run["id"], "pause", digest, reason="hold").content.decode()
    intervention = Intervention.objects.get(run_id=run["id"])
    assert f'href="/receipts/{intervention.pk}/" data-testid="receipt-permalink"' in html
    assert "<time datetime=" in html
    assert_readable(html)


def test_the_approval_card_shows_the_exact_args_with_the_adapters_redaction_and_four_eyes(
    cast, worker, as_user
):
    from interventions import registry

    registry.load_adapters()
    saved = {k: dict(v) for k, v in registry._redactions.items()}
    registry.redaction("payments", {"card_number": "last4"})
    try:
        run = start_run(as_user("ian"))
        lease = claim(worker, run["id"])
        asked = worker.post(
            f"/runs/{run['id']}/approvals",
            {
                "fencing_token": lease["lease"]["fencing_token"],
                "tool": "payments",
                "action": "charge",
                "args": {"amount": 900, "payment": {"card_number": "4111111111111234"}},
                "reason": "large charge",
            },
        )
        assert asked.status_code == 201, asked.content
        approval = Approval.objects.get(run_id=run["id"])
        html = open_dialog(
            browser("april"), run["id"], "approve", approval_id=str(approval.pk)
        ).content.decode()
        assert answers_of(html)[:2] == ["decision", "args"]
        assert "••••1234" in html and "4111111111111234" not in html
        assert 'data-testid="blocking"' not in html
        ian = open_dialog(browser("ian"), run["id"], "approve", approval_id=str(approval.pk))
        assert b"four eyes" in ian.content and b'data-testid="blocking"' in ian.content
    finally:
        registry._redactions.clear()
        registry._redactions.update(saved)


def test_a_refusal_reads_as_words_not_python_lists(cast, worker):
    run, _ = running_run(worker)
    from tests.conftest import place_run_in

    place_run_in(run["id"], State.CANCELLED)
    html = open_dialog(browser("otto"), run["id"], "compensate").content.decode()
    assert (
        "Your role (operator) may not compensate: needs incident commander or admin — "
        "currently: ian, ada." in html
    )
    assert "[&#x27;" not in html and "HTTP 403" not in html


def test_the_recover_card_folds_the_checkpoint_state_instead_of_pasting_it(cast, worker):
    from tests.conftest import place_run_in

    run, lease = running_run(worker)
    state = {"cart": {"sku": "sku-1", "qty": 2}, "notes": "n" * 300}
    worker.post(
        f"/runs/{run['id']}/checkpoints",
        {"fencing_token": lease["lease"]["fencing_token"], "step": "reserve", "state": state},
    )
    place_run_in(run["id"], State.ORPHANED)
    html = open_dialog(browser("ian"), run["id"], "recover").content.decode()
    rebuilt = html[html.index('data-answer-for="rebuild_from"') :]
    rebuilt = rebuilt[: rebuilt.index("</dd>")]
    assert "checkpoint 1 · reserve" in rebuilt and "<details" in rebuilt
    assert rebuilt.index("<details") < rebuilt.index("sku-1")  # the state is folded away
    assert_readable(html)
