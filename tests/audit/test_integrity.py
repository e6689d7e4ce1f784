"""``audit_verify`` checks more than the audit chain: every run's history chain, and the effect ledger
against the history (each ledger change has its history event). Tampering as a superuser would, with
the protecting triggers off (``ALTER TABLE … DISABLE TRIGGER ALL``, rolled back with the test)."""

from __future__ import annotations

import json
from contextlib import contextmanager

import pytest
from django.core.management import ManagementUtility
from django.db import connection

from audit.chain.hashing import link_hash
from audit.integrity import verify_all
from audit.registry import checks
from core.actors import system_actor
from interventions.reconcile import reconcile_effect
from runs.integrity import history_fields
from runs.models import Effect, HistoryEvent, Run
from tests.conftest import claim, declare, start_run

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("postgres_only")]


@contextmanager
def triggers_off(*tables: str):
    with connection.cursor() as cur:
        # Django's foreign keys are deferred: run their pending checks, ALTER TABLE refuses otherwise.
        cur.execute("SET CONSTRAINTS ALL IMMEDIATE")
        for table in tables:
            cur.execute(f"ALTER TABLE {table} DISABLE TRIGGER ALL")
    yield
    with connection.cursor() as cur:
        for table in tables:
            cur.execute(f"ALTER TABLE {table} ENABLE TRIGGER ALL")


def _story(worker) -> dict:
    """A run whose ledger went through every status change: committed by the worker, reconciled by the
    control plane, one still in flight, one denied."""
    run = start_run(worker)
    claim(worker, run["id"])
    committed = declare(worker, run["id"], 1, key="charge-1").json()["id"]
    reconciled = declare(worker, run["id"], 1, key="charge-2").json()["id"]
    in_flight = declare(worker, run["id"], 1, key="charge-3").json()["id"]
    denied = declare(worker, run["id"], 1, key="label", tool="shipping", action="create_label")
    assert denied.status_code == 409
    resp = worker.post(f"/effects/{committed}/outcome", {"fencing_token": 1, "status": "committed"})
    assert resp.status_code == 200, resp.content
    worker.post(f"/effects/{reconciled}/outcome", {"fencing_token": 1, "status": "unknown"})
    reconcile_effect(
        actor=system_actor("reconciler"),
        effect_id=reconciled,
        outcome="failed",
        evidence={"world": "no such key"},
        source="reconciler",
    )
    return {
        "run": run["id"],
        "committed": committed,
        "reconciled": reconciled,
        "in_flight": in_flight,
        "denied": denied.json()["id"],
    }


def test_runs_registers_its_checks_with_audit_verify():
    assert {"history", "ledger"} <= set(checks())


def test_an_untouched_record_verifies(worker):
    story = _story(worker)
    report = verify_all()
    assert report["ok"], report
    assert report["history"]["runs"] == 1 and report["history"]["events"] >= 8
    assert report["ledger"]["effects"] == 4
    assert Effect.objects.get(pk=story["reconciled"]).status == "failed"


# --- history chains ---------------------------------------------------------------------------------


def _history(run_id, seq) -> HistoryEvent:
    return HistoryEvent.objects.get(run_id=run_id, seq=seq)


def _edit_history(run_id):
    HistoryEvent.objects.filter(run_id=run_id, seq=3).update(data={"worker": "someone else"})


def _delete_history(run_id):
    HistoryEvent.objects.filter(run_id=run_id, seq=3).delete()


def _reorder_history(run_id):
    HistoryEvent.objects.filter(run_id=run_id, seq=3).update(seq=1000)
    HistoryEvent.objects.filter(run_id=run_id, seq=4).update(seq=3)
    HistoryEvent.objects.filter(run_id=run_id, seq=1000).update(seq=4)


def _cut_history_tail(run_id):
    last = Run.objects.get(pk=run_id).history_seq
    HistoryEvent.objects.filter(run_id=run_id, seq=last).delete()


def _rehash_one_history_row(run_id):
    event = _history(run_id, 3)
    event.actor = "mallory"
    HistoryEvent.objects.filter(pk=event.pk).update(
        actor=event.actor, hash=link_hash(event.prev_hash, history_fields(event))
    )


HISTORY_TAMPERING = {
    "edit": (_edit_history, "edited", 3),
    "delete": (_delete_history, "deleted", 3),
    "reorder": (_reorder_history, "reordered", 3),
    "cut_tail": (_cut_history_tail, "deleted", None),  # None: the run's last seq
    "rehash_one_row": (_rehash_one_history_row, "edited", 3),
}


@pytest.mark.parametrize("kind", list(HISTORY_TAMPERING))
def test_a_tampered_history_chain_is_named_by_run_and_seq(worker, kind):
    story = _story(worker)
    tamper, problem, seq = HISTORY_TAMPERING[kind]
    seq = seq or Run.objects.get(pk=story["run"]).history_seq
    with triggers_off("runs_historyevent"):
        tamper(story["run"])
    report = verify_all()
    assert not report["ok"] and report["chain"]["ok"]
    first = report["history"]["broken"][0]
    assert (first["run"], first["problem"], first["first_broken_seq"]) == (
        story["run"],
        problem,
        seq,
    ), first


def test_a_run_whose_whole_history_is_gone_is_named(worker):
    story = _story(worker)
    with triggers_off("runs_historyevent"):
        HistoryEvent.objects.filter(run_id=story["run"]).delete()
    report = verify_all()["history"]
    assert (report["broken"][0]["run"], report["broken"][0]["problem"]) == (story["run"], "deleted")


# --- the ledger against the history -----------------------------------------------------------------


def _ledger_problem(report: dict) -> tuple[str, str]:
    first = report["ledger"]["problems"][0]
    return first["effect"], first["problem"]


def test_a_ledger_status_changed_without_its_history_event_is_named(worker):
    story = _story(worker)
    Effect.objects.filter(pk=story["in_flight"]).update(status="committed")  # no trigger needed
    report = verify_all()
    assert not report["ok"] and report["history"]["ok"]
    assert _ledger_problem(report) == (story["in_flight"], "status_without_history")
    assert "history" in report["ledger"]["summary"]


def test_a_reconciled_status_turned_back_by_hand_is_named(worker):
    story = _story(worker)
    Effect.objects.filter(pk=story["reconciled"]).update(status="committed")
    assert _ledger_problem(verify_all()) == (story["reconciled"], "status_without_history")


def test_an_effect_the_history_never_recorded_is_named(worker):
    story = _story(worker)
    run = Run.objects.get(pk=story["run"])
    smuggled = Effect.objects.create(
        run=run,
        step="charge",
        tool="payments",
        action="charge",
        idempotency_key="smuggled",
        fingerprint="x",
        decision="authorized",
        status="committed",
    )
    assert _ledger_problem(verify_all()) == (str(smuggled.pk), "no_history")


def test_an_effect_deleted_from_the_ledger_is_named(worker):
    story = _story(worker)
    Effect.objects.filter(pk=story["in_flight"]).delete()
    assert _ledger_problem(verify_all()) == (story["in_flight"], "missing_from_ledger")


def test_an_outcome_cut_from_a_rehashed_history_is_caught_by_the_ledger(worker):
    """The attacker removes the outcome event and rehashes the run's history so its chain verifies:
    the ledger still says committed, and no history event says so."""
    story = _story(worker)
    outcome = HistoryEvent.objects.get(
        run_id=story["run"], kind="effect_outcome", data__effect=story["committed"]
    )
    with triggers_off("runs_historyevent"):
        outcome.delete()
        prev = _history(story["run"], outcome.seq - 1).hash
        for event in HistoryEvent.objects.filter(run_id=story["run"], seq__gt=outcome.seq).order_by(
            "seq"
        ):
            event.seq, event.prev_hash = event.seq - 1, prev
            event.hash = link_hash(prev, history_fields(event))
            HistoryEvent.objects.filter(pk=event.pk).update(
                seq=event.seq, prev_hash=prev, hash=event.hash
            )
            prev = event.hash
        run = Run.objects.get(pk=story["run"])
        Run.objects.filter(pk=run.pk).update(history_seq=run.history_seq - 1, history_head=prev)
    report = verify_all()
    assert report["history"]["ok"]  # the chain alone is fooled
    assert _ledger_problem(report) == (story["committed"], "status_without_history")


def test_audit_verify_exits_non_zero_naming_the_broken_history(worker, capsys):
    story = _story(worker)
    with triggers_off("runs_historyevent"):
        _edit_history(story["run"])
    try:
        ManagementUtility(["manage.py", "audit_verify"]).execute()
        code = 0
    except SystemExit as exit_:
        code = exit_.code
    assert code != 0
    out, err = capsys.readouterr()
    assert json.loads(out.strip().splitlines()[-1])["history"]["ok"] is False
    assert f"run {story['run']} history broken at seq 3: edited" in err
