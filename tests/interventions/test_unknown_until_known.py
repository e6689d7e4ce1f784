"""Unknown stays unknown until it is known. "The world never saw this key" becomes ``failed`` only
when the world can no longer commit it (lease fenced + by-key void confirmed, or the commit window
passed); a late outcome contradicting a reconciliation is kept as a ``discrepancy`` fact.

Against the real demo world (its own process), as in tests/world."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from audit.models import AuditEvent
from core.actors import system_actor
from interventions import registry
from interventions.reconcile import auto_reconcile
from runs.models import Effect
from runs.services.lifecycle import expire_leases
from tests.conftest import Api, claim, declare, start_run
from tests.world.conftest import start_world
from world.client import WorldClient, WorldError

pytestmark = pytest.mark.django_db


@pytest.fixture(scope="module")
def world_url(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("world-unknown")
    server = start_world(tmp / "world.sqlite3", tmp / "world.log")
    yield server.url
    server.stop()


@pytest.fixture
def world(world_url, settings):
    settings.WORLD_URL = world_url
    with WorldClient(world_url, timeout=3.0) as client:
        client.reset()
        yield client


def _unknown_charge(worker: Api, key: str) -> tuple[str, str]:
    """A charge declared and dispatched; the answer was lost (the worker reported unknown)."""
    run = start_run(worker)
    claim(worker, run["id"])
    effect = declare(worker, run["id"], 1, key=key).json()
    out = worker.post(f"/effects/{effect['id']}/outcome", {"fencing_token": 1, "status": "unknown"})
    assert out.status_code == 200, out.content
    return run["id"], effect["id"]


def _void_calls(world: WorldClient, key: str) -> int:
    return len(world.requests(system="payments", action="void_key", key=key))


def test_not_seen_with_a_live_lease_stays_unknown(worker, world):
    _, effect_id = _unknown_charge(worker, "k-live")
    result = auto_reconcile(effect_id)
    assert result["outcome"] == "unknown" and "lease is live" in result["why"]
    assert Effect.objects.get(pk=effect_id).status == "unknown"
    assert _void_calls(world, "k-live") == 0  # never void a key its worker may still use
    # The frozen worker wakes up, the world commits, and its outcome is simply recorded.
    charge = world.perform("payments", "charge", {"amount": 100}, "k-live")
    late = worker.post(
        f"/effects/{effect_id}/outcome",
        {"fencing_token": 1, "status": "committed", "external_ref": charge["charge_id"]},
    )
    assert late.status_code == 200 and late.json()["status"] == "committed"


def test_not_seen_and_fenced_is_voided_by_key_then_failed(worker, world):
    _, effect_id = _unknown_charge(worker, "k-fenced")
    expire_leases(actor=system_actor("test"), now=timezone.now() + timedelta(hours=1))
    result = auto_reconcile(effect_id)
    assert result["outcome"] == "failed", result
    effect = Effect.objects.get(pk=effect_id)
    evidence = effect.reconciliation["evidence"]
    assert effect.status == "failed" and evidence["lease_fenced"] is True
    assert evidence["void"]["voided"] is True and _void_calls(world, "k-fenced") == 1
    # The world keeps its word: the frozen worker's call under that key can never commit.
    with pytest.raises(WorldError) as refused:
        world.perform("payments", "charge", {"amount": 100}, "k-fenced")
    assert refused.value.status == 409 and refused.value.error == "key_voided"
    assert world.counts()["charges"]["total"] == 0
    assert auto_reconcile(effect_id)["already"] is True


def test_a_void_that_finds_a_commit_reports_committed(worker, world):
    _, effect_id = _unknown_charge(worker, "k-race")
    expire_leases(actor=system_actor("test"), now=timezone.now() + timedelta(hours=1))
    world.perform("payments", "charge", {"amount": 100}, "k-race")  # committed meanwhile
    answer = registry.get_key_voider("payments")("payments", "charge", "k-race")
    assert answer.outcome == "committed" and answer.external_ref.startswith("ch_")
    assert auto_reconcile(effect_id)["outcome"] == "committed"


@pytest.fixture
def windowed_tool():
    """A tool whose provider documents a 60 s commit window and offers no by-key void."""
    registry.load_adapters()
    registry.reconciler("ledgerbank")(
        lambda tool, action, key: registry.ReconcileResult("not_found", evidence={"key": key})
    )
    registry.commit_window("ledgerbank", 60)
    yield "ledgerbank"
    registry._reconcilers.pop("ledgerbank", None)
    registry._commit_windows.pop("ledgerbank", None)


def test_not_seen_becomes_failed_only_after_the_commit_window(agent, worker, windowed_tool):
    agent.allowed_scopes = [*agent.allowed_scopes, "ledgerbank:*"]
    agent.save()
    run = start_run(worker, authority=[{"scope": "ledgerbank:*", "ttl_s": 3600}])
    claim(worker, run["id"])
    effect = declare(worker, run["id"], 1, key="lb-1", tool="ledgerbank", action="transfer").json()
    early = auto_reconcile(effect["id"])
    assert early["outcome"] == "unknown" and "commit window has not passed" in early["why"]
    Effect.objects.filter(pk=effect["id"]).update(
        declared_at=timezone.now() - timedelta(seconds=61)
    )
    assert auto_reconcile(effect["id"])["outcome"] == "failed"
    assert Effect.objects.get(pk=effect["id"]).reconciliation["evidence"]["commit_window_s"] == 60


def test_a_late_committed_after_reconciled_failed_is_a_discrepancy(worker, world, as_user, cast):
    run_id, effect_id = _unknown_charge(worker, "k-late")
    wrong = as_user("otto").post(
        f"/effects/{effect_id}/reconcile",
        {"outcome": "failed", "evidence": "not in the dashboard", "reason": "looked"},
    )
    assert wrong.status_code == 200, wrong.content
    late = worker.post(
        f"/effects/{effect_id}/outcome",
        {"fencing_token": 1, "status": "committed", "external_ref": "ch_late"},
    )
    assert late.status_code == 200, late.content
    effect = Effect.objects.get(pk=effect_id)
    assert effect.status == "discrepancy" and effect.reconciliation["outcome"] == "failed"
    assert effect.discrepancy["reported"] == "committed" and effect.external_ref == "ch_late"
    audit = AuditEvent.objects.get(action="effect.discrepancy", object_id=effect_id)
    assert audit.context["reconciled"] == "failed" and audit.context["reported"] == "committed"
    again = worker.post(
        f"/effects/{effect_id}/outcome", {"fencing_token": 1, "status": "committed"}
    )
    assert (
        again.status_code == 200
        and AuditEvent.objects.filter(action="effect.discrepancy").count() == 1
    )

    client = Client()
    assert client.login(username="otto", password="pw-otto")
    page = client.get(f"/runs/{run_id}/").content.decode()
    assert "needs an operator" in page and "discrepancy" in page
    preview = (
        as_user("ian")
        .post(f"/runs/{run_id}/interventions/preview", {"kind": "compensate", "reason": "undo"})
        .json()
    )
    offered = [s for s in preview["plan"]["steps"] if s["effect"] == effect_id]
    assert offered and offered[0]["discrepancy"]["reported"] == "committed"
    assert offered[0]["compensation"]["action"] == "refund"
    # An operator can settle it with evidence, like any reconciliation.
    fixed = as_user("otto").post(
        f"/effects/{effect_id}/reconcile",
        {"outcome": "committed", "evidence": "charge ch_late exists", "reason": "world says so"},
    )
    assert fixed.status_code == 200 and fixed.json()["status"] == "committed"
    assert Effect.objects.get(pk=effect_id).discrepancy["reported"] == "committed"  # kept
