"""GET /api/v1/audit/verify runs what `manage.py audit_verify` runs (audit chains, run histories, the
ledger against the history, anchors once written) and answers first, for the roles that may."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test import Client

from audit.anchors.write import write_anchor
from audit.models import AuditChain, AuditEvent
from runs.models import Effect
from tests.conftest import Api, claim, declare, start_run

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("postgres_only")]


@pytest.fixture
def anchors_dir(settings, tmp_path):
    settings.ANCHOR_DIR = str(tmp_path / "anchors")


def _verify(cast, who: str = "ian"):
    return Api(Client(), cast[who][1]).get("/audit/verify")


def test_verify_answers_intact_with_the_figures_of_every_check(cast, worker, anchors_dir):
    run = start_run(worker)
    claim(worker, run["id"])
    declare(worker, run["id"], 1)
    resp = _verify(cast)
    assert resp.status_code == 200
    body = resp.json()
    events, chains = AuditEvent.objects.count(), AuditChain.objects.count()
    assert body["ok"] and body["failures"] == []
    assert body["answer"] == (
        f"Intact: {events:,} events in {chains:,} chains, 1 run histories, 1 ledger entries, "
        "not anchored yet"
    )
    assert {"chain", "history", "ledger"} <= set(body["report"]) and not body["anchors_checked"]
    write_anchor()
    body = _verify(cast, "sam").json()
    assert body["ok"] and body["anchors_checked"] and body["anchored_at"]
    assert body["answer"].startswith("Intact: ") and ", anchored " in body["answer"]
    assert body["report"]["anchors"]["ok"]


def test_verify_names_a_ledger_change_without_its_history(cast, worker, anchors_dir):
    run = start_run(worker)
    claim(worker, run["id"])
    declare(worker, run["id"], 1)
    effect = Effect.objects.get(run_id=run["id"])
    with connection.cursor() as cur:  # a status set by hand, with no decision behind it
        cur.execute("UPDATE runs_effect SET status = 'committed' WHERE id = %s", [effect.pk])
    body = _verify(cast).json()
    assert not body["ok"]
    assert body["answer"].startswith(f"Broken: ledger: effect {effect.pk}")
    assert "status_without_history" in body["answer"]


def test_verify_names_the_broken_audit_chain_and_position(cast, worker, anchors_dir):
    run = start_run(worker)
    claim(worker, run["id"])
    key = f"run:{run['id']}"
    with connection.cursor() as cur:
        cur.execute("SET session_replication_role = replica")
        cur.execute(
            "UPDATE audit_auditevent SET reason = 'nothing' WHERE chain = %s AND chain_seq = 1",
            [key],
        )
        cur.execute("SET session_replication_role = DEFAULT")
    body = _verify(cast).json()
    assert not body["ok"]
    assert body["answer"] == (
        f"Broken: audit chain {key} broken at seq 1: edited "
        "(seq 1's stored hash does not match its content)"
    )


def test_verify_is_for_the_roles_that_answer_for_the_trail(cast, worker, anchors_dir):
    start_run(worker)
    for who in ("vera", "otto", "april"):
        resp = _verify(cast, who)
        assert resp.status_code == 403 and resp.json()["error"] == "forbidden", who
        assert "audit_verify" in resp.json()["detail"]
    for who in ("ian", "sam", "ada"):
        assert _verify(cast, who).status_code == 200, who
    assert worker.get("/audit/verify").status_code == 403
    assert AuditEvent.objects.filter(actor="vera", action="api.denied").exists()
