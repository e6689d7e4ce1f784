"""Console intervention dialogs: preview before confirm, receipt after, domain errors inline with their
HTTP status, CSRF, the reconcile form, the approvals inbox and the contracts page."""

from __future__ import annotations

import re

import pytest
from django.test import Client
from django.utils.html import escape

from audit.models import AuditEvent
from interventions.contracts import CONTRACT_SPECS
from interventions.models import Intervention
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
    match = re.search(rb'name="preview_token" value="([0-9a-f]+)"', html)
    assert match, html.decode()[:2000]
    return match.group(1).decode()


def open_dialog(client: Client, run_id: str, kind: str, **params):
    return client.get(
        f"/runs/{run_id}/interventions/new/", {"kind": kind, **params}, HTTP_HX_REQUEST="true"
    )


def confirm(client: Client, run_id: str, kind: str, token: str, **fields):
    return client.post(
        f"/runs/{run_id}/interventions/",
        {"kind": kind, "preview_token": token, **fields},
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
    assert preview.status_code == 403 and b"HTTP 403" in preview.content
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
    assert changed.status_code == 409 and b"preview_stale" in changed.content
    assert b"also suspend" in changed.content  # the dialog is back, with the new preview
    assert Run.objects.get(pk=run["id"]).state == State.RUNNING
    assert not Intervention.objects.filter(run_id=run["id"]).exists()


def test_csrf_is_enforced_on_console_posts(cast, worker):
    run, _ = running_run(worker)
    otto = browser("otto", enforce_csrf_checks=True)
    page = otto.get(f"/runs/{run['id']}/").content.decode()
    token = token_of(open_dialog(otto, run["id"], "pause").content)
    refused = otto.post(
        f"/runs/{run['id']}/interventions/",
        {"kind": "pause", "preview_token": token, "reason": "r"},
    )
    assert refused.status_code == 403 and b"CSRF" in refused.content
    assert Run.objects.get(pk=run["id"]).state == State.RUNNING
    csrf = re.search(r'hx-headers=\'\{"X-CSRFToken": "([^"]+)"\}\'', page).group(
        1
    )  # what htmx sends
    ok = otto.post(
        f"/runs/{run['id']}/interventions/",
        {"kind": "pause", "preview_token": token, "reason": "r"},
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
        and b"HTTP 403" in dialog.content
        and b"not_decision_authority" in dialog.content
    )
    assert b"olga holds decision authority" in dialog.content
    # ian may override, with a reason, and the field is offered to him.
    ian = browser("ian")
    html = open_dialog(ian, run["id"], "cancel").content
    assert b'name="override_reason"' in html and b"HTTP 403" in html
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
    for kind, spec in CONTRACT_SPECS.items():
        assert f'id="contract-{kind}"' in html
        assert escape(spec["summary"]) in html
    assert 'id="state-table"' in html and "no_unresolved_effects" in html and "audit_export" in html


@pytest.mark.parametrize("kind", sorted(CONTRACT_SPECS))
def test_every_kinds_dialog_opens_with_a_preview_or_an_inline_refusal(cast, worker, kind):
    run, lease = running_run(worker)
    declare(worker, run["id"], lease["lease"]["fencing_token"], key="k-1")
    resp = open_dialog(browser("ada"), run["id"], kind)
    assert resp.status_code == 200
    html = resp.content.decode()
    assert f'name="kind" value="{kind}"' in html and 'name="reason"' in html
    assert "Preview — nothing has changed yet" in html or 'class="error"' in html
