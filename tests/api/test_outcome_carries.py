"""Fewer round trips: an outcome may carry the step's checkpoint (same transaction) and the next
declaration (decided right after, as its own call would be). Old calls keep working (the rest of the
suite), and every fact is still in the run's history chain and the audit chain."""

from __future__ import annotations

import pytest

from audit.models import AuditEvent
from core.actors import Actor
from runs.models import Checkpoint, Effect, ExecutionLease, HistoryEvent, Run
from runs.services import effects
from tests.conftest import claim, declare, start_run

pytestmark = pytest.mark.django_db


def _kinds(run_id: str) -> list[str]:
    return list(
        HistoryEvent.objects.filter(run_id=run_id).order_by("seq").values_list("kind", flat=True)
    )


def _next(key: str, **overrides) -> dict:
    body = {
        "fencing_token": 1,
        "step": "ship",
        "tool": "inventory",
        "action": "reserve",
        "idempotency_key": key,
        "args": {"sku": "sku-1"},
    }
    return body | overrides


def test_an_outcome_carrying_the_checkpoint_writes_both_in_the_history_chain(worker):
    run = start_run(worker)
    claim(worker, run["id"])
    effect = declare(worker, run["id"], 1).json()
    resp = worker.post(
        f"/effects/{effect['id']}/outcome",
        {
            "fencing_token": 1,
            "status": "committed",
            "external_ref": "ch_1",
            "checkpoint": {"step": "charge", "state": {"charged": True}},
        },
    )
    assert resp.status_code == 200, resp.content
    body = resp.json()
    assert body["status"] == "committed" and body["checkpoint"]["seq"] == 1
    cp = Checkpoint.objects.get(run_id=run["id"])
    assert (cp.seq, cp.step, cp.state, cp.hash) == (
        1,
        "charge",
        {"charged": True},
        body["checkpoint"]["hash"],
    )
    assert _kinds(run["id"])[-2:] == ["effect_outcome", "checkpoint"]
    row = Run.objects.get(pk=run["id"])
    assert row.checkpoint_seq == 1 and cp.history_seq == row.history_seq
    history = worker.get(f"/runs/{run['id']}/history").json()
    assert history["integrity"]["ok"] is True
    assert AuditEvent.objects.filter(action="effect.outcome", object_id=effect["id"]).count() == 1
    # the checkpoint is the one the next attempt starts from
    assert worker.get(f"/runs/{run['id']}").json()["checkpoint"]["seq"] == 1


def test_a_checkpoint_on_an_outcome_needs_the_fencing_token(worker):
    run = start_run(worker)
    claim(worker, run["id"])
    effect = declare(worker, run["id"], 1).json()
    resp = worker.post(
        f"/effects/{effect['id']}/outcome",
        {"status": "committed", "checkpoint": {"step": "charge"}},
    )
    assert resp.status_code == 422 and resp.json()["field"] == "fencing_token"
    assert Effect.objects.get(pk=effect["id"]).status == "in_flight"


def test_a_fenced_out_outcome_is_recorded_but_its_checkpoint_is_refused_and_audited(worker):
    run = start_run(worker)
    claim(worker, run["id"], "worker-a")
    effect = declare(worker, run["id"], 1).json()
    ExecutionLease.objects.filter(run_id=run["id"]).update(expires_at="2000-01-01T00:00:00Z")
    resp = worker.post(
        f"/effects/{effect['id']}/outcome",
        {"fencing_token": 1, "status": "committed", "checkpoint": {"step": "charge"}},
    )
    assert resp.status_code == 200, resp.content
    assert resp.json()["status"] == "committed"
    assert resp.json()["checkpoint"]["error"] == "lease_lost"
    assert Effect.objects.get(pk=effect["id"]).status == "committed"
    assert not Checkpoint.objects.filter(run_id=run["id"]).exists()
    assert _kinds(run["id"])[-1] == "effect_outcome"
    assert AuditEvent.objects.filter(
        action="run.checkpoint", run_id=run["id"], outcome=AuditEvent.DENIED
    ).exists()


def test_an_outcome_reported_again_with_a_checkpoint_still_writes_the_checkpoint(worker):
    run = start_run(worker)
    claim(worker, run["id"])
    effect = declare(worker, run["id"], 1).json()
    body = {"fencing_token": 1, "status": "committed", "checkpoint": {"step": "charge"}}
    first = worker.post(f"/effects/{effect['id']}/outcome", body).json()
    again = worker.post(f"/effects/{effect['id']}/outcome", body).json()
    assert (first["checkpoint"]["seq"], again["checkpoint"]["seq"]) == (1, 2)
    assert _kinds(run["id"]).count("effect_outcome") == 1


def test_an_outcome_carrying_the_next_declaration_decides_it_after_the_outcome(worker):
    run = start_run(worker)
    claim(worker, run["id"])
    effect = declare(worker, run["id"], 1).json()
    resp = worker.post(
        f"/effects/{effect['id']}/outcome",
        {
            "fencing_token": 1,
            "status": "committed",
            "checkpoint": {"step": "charge"},
            "next": _next("order-42-reserve"),
        },
    )
    assert resp.status_code == 200, resp.content
    nxt = resp.json()["next"]
    assert (nxt["http_status"], nxt["decision"], nxt["status"]) == (201, "authorized", "in_flight")
    assert Effect.objects.get(pk=nxt["id"]).idempotency_key == "order-42-reserve"
    assert _kinds(run["id"])[-3:] == ["effect_outcome", "checkpoint", "effect_intent"]
    assert AuditEvent.objects.filter(action="effect.declare", object_id=nxt["id"]).exists()
    assert worker.get(f"/runs/{run['id']}/history").json()["integrity"]["ok"] is True
    # the same declaration again is the same effect, still in flight: as after a separate call
    again = declare(worker, run["id"], 1, **_next("order-42-reserve"))
    assert again.status_code == 409 and again.json()["effect_id"] == nxt["id"]


def test_a_carried_declaration_that_is_denied_or_refused_leaves_the_outcome_recorded(worker):
    run = start_run(worker)
    claim(worker, run["id"])
    first = declare(worker, run["id"], 1).json()
    denied = worker.post(
        f"/effects/{first['id']}/outcome",
        {
            "fencing_token": 1,
            "status": "committed",
            "next": _next("k-x", tool="rockets", action="launch"),
        },
    ).json()
    assert denied["status"] == "committed"
    assert (denied["next"]["http_status"], denied["next"]["decision"]) == (409, "denied")
    assert denied["next"]["reason"] == "authority_missing"
    second = declare(worker, run["id"], 1, key="order-43-charge").json()
    reused = worker.post(
        f"/effects/{second['id']}/outcome",
        {"fencing_token": 1, "status": "failed", "next": _next("order-42-charge")},
    ).json()
    assert reused["status"] == "failed"
    assert (reused["next"]["http_status"], reused["next"]["error"]) == (
        422,
        "idempotency_key_reused",
    )
    assert Effect.objects.get(pk=second["id"]).status == "failed"


def test_the_service_records_an_outcome_with_its_checkpoint_in_one_transaction(
    worker, django_assert_max_num_queries
):
    run = start_run(worker)
    claim(worker, run["id"])
    effect = declare(worker, run["id"], 1).json()
    actor = Actor(kind="worker", name="worker-7", role="worker")
    # BEGIN, lock the run, the effect with the lease, one write, the audit (two today), COMMIT
    with django_assert_max_num_queries(8):
        recorded = effects.record_outcome_with(
            actor=actor,
            effect_id=effect["id"],
            fencing_token=1,
            status="committed",
            run_id=run["id"],
            checkpoint={"step": "charge", "state": {}},
        )
    assert recorded.checkpoint is not None and recorded.checkpoint.seq == 1
