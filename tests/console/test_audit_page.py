"""Console audit review: the trail with filters, chain verification naming the first broken link, and
the JSON Lines export behind the audit_export permission."""

from __future__ import annotations

import json

import pytest
from django.test import Client

from audit.anchors.write import write_anchor
from audit.models import AuditChain, AuditEvent
from tests.conftest import claim, start_run

pytestmark = pytest.mark.django_db


def browser(username: str) -> Client:
    client = Client()
    assert client.login(username=username, password=f"pw-{username}")
    return client


def test_audit_page_lists_events_and_filters_them(cast, worker):
    run = start_run(worker)
    claim(worker, run["id"])
    otto = browser("otto")
    html = otto.get("/audit/").content.decode()
    assert "run.create" in html and "run.claim" in html
    only_claims = otto.get(
        "/audit/", {"action": "run.claim"}, HTTP_HX_REQUEST="true"
    ).content.decode()
    assert only_claims.lstrip().startswith('<section id="events"') and "run.claim" in only_claims
    assert "<html" not in only_claims
    by_run = otto.get("/audit/", {"run": run["id"], "outcome": "denied"}).content.decode()
    assert "No audit event matches" in by_run


def test_verify_answers_first_intact_with_every_check(cast, worker, settings, tmp_path):
    settings.ANCHOR_DIR = str(tmp_path / "anchors")
    run = start_run(worker)
    claim(worker, run["id"])
    resp = browser("ian").get("/audit/verify/", HTTP_HX_REQUEST="true")
    assert resp.status_code == 200
    html = resp.content.decode()
    events, chains = AuditEvent.objects.count(), AuditChain.objects.count()
    assert 'data-chain="ok"' in html
    assert f"Intact: {events} events in {chains} chains, 1 run histories" in html
    assert "not anchored yet" in html and "cannot be ruled out" in html
    write_anchor()
    html = browser("sam").get("/audit/verify/", HTTP_HX_REQUEST="true").content.decode()
    assert "anchored" in html and "not anchored yet" not in html and "last anchor" in html


def test_verify_needs_the_audit_verify_permission(cast, worker):
    start_run(worker)
    vera = browser("vera")
    assert vera.get("/audit/verify/", HTTP_HX_REQUEST="true").status_code == 403
    assert b"Verifying needs the audit_verify permission" in vera.get("/audit/").content
    assert b"Verify everything" in browser("ian").get("/audit/").content


def test_verify_names_the_first_broken_link_with_its_chain(cast, worker):
    run = start_run(worker)
    claim(worker, run["id"])
    key = f"run:{run['id']}"
    head = AuditChain.objects.get(key=key)
    AuditChain.objects.filter(key=key).update(seq=head.seq + 1)  # a row "missing" at the end
    html = browser("ian").get("/audit/verify/", HTTP_HX_REQUEST="true").content.decode()
    assert 'data-chain="broken"' in html
    assert f"Broken: audit chain {key} broken at seq {head.seq + 1}: deleted" in html


def test_verify_names_a_broken_run_history_too(cast, worker):
    from runs.models import Run

    run = start_run(worker)
    claim(worker, run["id"])
    Run.objects.filter(pk=run["id"]).update(history_seq=99)
    html = browser("ian").get("/audit/verify/", HTTP_HX_REQUEST="true").content.decode()
    assert 'data-chain="broken"' in html and f"history: run {run['id']} history broken" in html


def test_export_needs_the_audit_export_permission(cast, worker):
    start_run(worker)
    otto = browser("otto")
    assert b"Export needs the audit_export permission" in otto.get("/audit/").content
    assert otto.get("/audit/export.jsonl").status_code == 403
    sam = browser("sam")
    assert b"Export JSON Lines" in sam.get("/audit/").content
    resp = sam.get("/audit/export.jsonl")
    assert resp.status_code == 200 and resp["Content-Type"] == "application/x-ndjson"
    assert "attachment" in resp["Content-Disposition"]
    lines = b"".join(resp.streaming_content).decode().splitlines()
    assert len(lines) == AuditEvent.objects.count()
    rows = [json.loads(line) for line in lines]
    assert [r["order"] for r in rows] == sorted(r["order"] for r in rows)  # the reading order
    assert all(r["hash"] and "prev_hash" in r for r in rows)
