"""Fleet operations: one parent record, one receipt per run, waves under an error budget, halts that
are consistent with a wave in progress, capability freezes and incident command across a filter."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection

from audit.models import AuditEvent
from core.auth import actor_for_user
from core.errors import Conflict, Forbidden, Invalid
from interventions.fleet.operations import (
    FleetParams,
    cancel_fleet_operation,
    confirm_fleet_operation,
    halt_fleet_operation,
    preview_fleet_operation,
    start_fleet_operation,
    wave_key,
)
from interventions.fleet.waves import run_fleet_wave
from interventions.models import FleetOperation, Intervention, Job
from interventions.plugins import REGISTRY
from runs.models import CapabilityFreeze, Run
from tests.conftest import declare, place_run_in
from tests.interventions.helpers import intervene, running_run

pytestmark = pytest.mark.django_db


def _actor(cast, name):
    return actor_for_user(cast[name][0], component="test")


def _runs(worker, n):
    return [running_run(worker)[0]["id"] for _ in range(n)]


def _ids_filter(ids):
    return "&".join(f"id={i}" for i in ids)


def _start(cast, name, kind, ids, reason="incident 12: payments flaky", **params):
    return start_fleet_operation(
        actor=_actor(cast, name),
        kind=kind,
        run_filter=_ids_filter(ids),
        reason=reason,
        params=FleetParams(**params),
    )


def _drive(op) -> FleetOperation:
    """Deliver waves as the worker would, until the operation is no longer running."""
    for _ in range(50):
        op.refresh_from_db()
        if op.state != FleetOperation.RUNNING:
            return op
        run_fleet_wave(wave_key(op.pk, op.current_wave))
    raise AssertionError("the operation never finished")


def test_it_previews_how_many_runs_what_each_would_do_and_what_is_in_flight(worker, cast):
    ids = _runs(worker, 3)
    declare(worker, ids[0], 1, key="k-in-flight")  # authorised, no outcome yet
    place_run_in(ids[2], "succeeded")
    preview = preview_fleet_operation(
        actor=_actor(cast, "otto"),
        kind="pause",
        run_filter=_ids_filter(ids),
        params=FleetParams(wave_size=1, pause_s=5),
    )
    assert (preview["matched"], preview["will_act_on"], preview["excluded"]) == (3, 2, 1)
    assert preview["excluded_runs"][0] == {
        "id": ids[2],
        "state": "succeeded",
        "why": "pause is not allowed while the run is succeeded",
    }
    assert {r["id"]: r["in_flight_effects"] for r in preview["runs"]} == {ids[0]: 1, ids[1]: 0}
    assert preview["in_flight"]["by_tool_action"] == [
        {"tool": "payments", "action": "charge", "effects": 1, "runs": 1}
    ]
    assert (preview["waves"], preview["takes_at_least_s"], preview["max_failures"]) == (2, 5, 0)
    assert not FleetOperation.objects.exists() and not Intervention.objects.exists()


def test_waves_issue_the_contract_per_run_with_one_receipt_each_and_one_parent(worker, cast):
    ids = _runs(worker, 5)
    op = _start(cast, "otto", "pause", ids, wave_size=2)
    assert (op.state, op.total, op.waves) == ("running", 5, 3)
    assert Job.objects.filter(kind="fleet_wave", target_id=wave_key(op.pk, 1)).exists()
    op = _drive(op)
    assert (op.state, op.succeeded, op.failed, op.skipped) == ("completed", 5, 0, 0)
    targets = list(op.targets.select_related("intervention"))
    assert sorted(str(t.run_id) for t in targets) == sorted(ids)
    assert [t.wave for t in targets] == [1, 1, 2, 2, 3]
    for t in targets:  # one receipt per run, its own decision, its own audit
        assert t.status == "succeeded" and t.intervention.kind == "pause"
        assert t.intervention.run_id == t.run_id
        assert t.intervention.options["fleet_operation"] == str(op.pk)
        assert AuditEvent.objects.filter(
            action="intervention.pause", run_id=t.run_id, object_id=str(t.intervention_id)
        ).exists()
    assert Intervention.objects.count() == 5
    assert set(Run.objects.filter(pk__in=ids).values_list("state", flat=True)) == {"paused"}
    assert Job.objects.filter(kind="fleet_wave", status="done").count() == 3
    for action in ("fleet.started", "fleet.completed"):
        assert AuditEvent.objects.filter(action=action, object_id=str(op.pk)).count() == 1


def test_the_error_budget_halts_the_rollout_and_skips_the_rest(worker, cast):
    ids = _runs(worker, 6)
    op = _start(cast, "otto", "pause", ids, wave_size=2, max_failures=1)
    # The world moves on after the preview: two runs finish before their wave reaches them.
    place_run_in(ids[1], "succeeded")
    place_run_in(ids[2], "succeeded")
    op = _drive(op)
    assert (op.state, op.halted_automatically) == ("halted", True)
    assert (op.succeeded, op.failed, op.skipped) == (1, 2, 3)
    assert op.halted_reason.startswith("error budget exceeded: 2 of 6 runs failed (budget 1)")
    statuses = dict(op.targets.values_list("run_id", "status"))
    assert [statuses[Run.objects.get(pk=i).pk] for i in ids] == [
        "succeeded",
        "failed",
        "failed",
        "skipped",
        "skipped",
        "skipped",
    ]
    failed = op.targets.filter(status="failed").first()
    assert failed.error == "conflict" and "succeeded" in failed.detail
    # The runs past the halt were never touched.
    assert set(Run.objects.filter(pk__in=ids[3:]).values_list("state", flat=True)) == {"running"}
    assert not Intervention.objects.filter(run_id__in=ids[1:]).exists()
    halted = AuditEvent.objects.get(action="fleet.halted", object_id=str(op.pk))
    assert halted.context["automatic"] is True
    assert sorted(halted.context["skipped_runs"]) == sorted(ids[3:])
    # Each refusal was a decision of its own, audited as denied on its run.
    assert AuditEvent.objects.filter(
        action="intervention.pause", run_id=ids[1], outcome="denied"
    ).exists()
    run_fleet_wave(wave_key(op.pk, 3))  # a late delivery of a later wave does nothing
    assert Intervention.objects.count() == 1


def test_a_raising_dependency_fails_that_run_and_counts_against_the_budget(
    worker, cast, monkeypatch
):
    ids = _runs(worker, 3)
    original = REGISTRY["pause"].preview

    def flaky(run, req, actor):
        if str(run.pk) == ids[0]:
            raise ConnectionError("world timed out")
        return original(run, req, actor)

    op = _start(cast, "otto", "pause", ids, wave_size=3, max_failures=0)
    monkeypatch.setattr(REGISTRY["pause"], "preview", flaky)
    op = _drive(op)
    assert (op.state, op.failed, op.succeeded, op.skipped) == ("halted", 1, 0, 2)
    assert op.targets.get(position=0).error == "ConnectionError"
    assert AuditEvent.objects.filter(action="fleet.run_failed", run_id=ids[0]).exists()
    assert Run.objects.get(pk=ids[0]).state == "running"  # its decision rolled back whole


def test_an_operator_halt_stops_the_waves_not_yet_run(worker, cast):
    ids = _runs(worker, 4)
    op = _start(cast, "otto", "pause", ids, wave_size=2, pause_s=60)
    run_fleet_wave(wave_key(op.pk, 1))
    op.refresh_from_db()
    assert (op.current_wave, op.succeeded) == (2, 2) and op.next_wave_at is not None
    halted = halt_fleet_operation(
        actor=_actor(cast, "olga"), operation_id=op.pk, reason="customers report double charges"
    )
    assert (halted.state, halted.skipped, halted.halted_automatically) == ("halted", 2, False)
    run_fleet_wave(wave_key(op.pk, 2))  # the scheduled wave arrives after the halt: nothing
    assert Intervention.objects.count() == 2
    with pytest.raises(Conflict):
        halt_fleet_operation(actor=_actor(cast, "olga"), operation_id=op.pk, reason="again")


@pytest.mark.parametrize("kind", ["freeze_capability", "restore_capability"])
def test_a_fleet_freeze_is_the_standing_freeze_not_a_one_off_selection(kind, worker, cast):
    """One contract freezes the fleet (standing_freeze, interventions/fleet/freezes.py): the fleet
    operation kinds that froze a selection run by run are refused by name, pointing at it."""
    ids = _runs(worker, 2)
    with pytest.raises(Invalid, match="/fleet/freezes") as refused:
        preview_fleet_operation(
            actor=_actor(cast, "ian"),
            kind=kind,
            run_filter=_ids_filter(ids),
            params=FleetParams(options={"scope": "payments:charge"}),
        )
    assert refused.value.extra["field"] == "kind"
    with pytest.raises(Invalid, match="/fleet/freezes"):
        _start(cast, "ian", kind, ids, options={"scope": "payments:charge"})
    assert not FleetOperation.objects.exists() and not CapabilityFreeze.objects.exists()
    assert AuditEvent.objects.filter(action="fleet.start", outcome="denied").count() == 1
    for run_id in ids:
        assert declare(worker, run_id, 1, key=f"{run_id}-charge").status_code == 201


def test_a_fleet_freeze_recorded_before_the_retirement_finishes_as_it_started_and_can_be_halted(
    worker, cast
):
    """Records of the retired kinds stay workable: a running one's waves still freeze its runs, and
    another incident commander may still halt one; a held one is not confirmed (cancel it)."""
    ids = _runs(worker, 2)
    running = _start(cast, "ian", "pause", ids[:1], wave_size=1)
    FleetOperation.objects.filter(pk=running.pk).update(
        kind="freeze_capability", options={"scope": "payments:charge"}
    )
    assert _drive(running).succeeded == 1
    assert declare(worker, ids[0], 1, key="old-op").json()["reason"] == "capability_frozen"
    held = start_fleet_operation(
        actor=_actor(cast, "ian"), kind="pause", run_filter=_ids_filter(ids[1:]),
        reason="held", params=FleetParams(), hold=True,
    )  # fmt: skip
    FleetOperation.objects.filter(pk=held.pk).update(
        kind="freeze_capability", options={"scope": "payments:charge"}
    )
    with pytest.raises(Conflict, match="retired"):
        confirm_fleet_operation(actor=_actor(cast, "ian"), operation_id=held.pk)
    cancel_fleet_operation(
        actor=_actor(cast, "sam"), operation_id=held.pk, reason="use a standing one"
    )
    assert FleetOperation.objects.get(pk=held.pk).state == "cancelled"


def test_a_tool_wide_freeze_covers_every_action_of_the_tool(worker, as_user):
    run_id = running_run(worker)[0]["id"]
    resp = intervene(
        as_user("sam"), run_id, "freeze_capability", "breach", options={"scope": "payments:*"}
    )
    assert resp.status_code == 202, resp.content
    assert declare(worker, run_id, 1).json()["reason"] == "capability_frozen"
    again = intervene(
        as_user("sam"), run_id, "freeze_capability", "breach", options={"scope": "payments:*"}
    )
    assert again.status_code == 409 and "already frozen" in again.json()["detail"]


def test_take_command_transfers_decision_authority_on_each_run(worker, cast, as_user):
    ids = _runs(worker, 3)
    took = intervene(
        as_user("olga"),
        ids[1],
        "transfer",
        "mine",
        options={"facets": ["decision_authority"], "to": "olga"},
    )
    assert took.status_code == 202
    op = _drive(_start(cast, "ian", "take_command", ids, reason="SEV1 payments"))
    assert (op.kind, op.state, op.succeeded) == ("take_command", "completed", 3)
    ian = cast["ian"][0]
    assert set(Run.objects.filter(pk__in=ids).values_list("decision_authority", flat=True)) == {
        ian.pk
    }
    receipts = {str(t.run_id): t.intervention for t in op.targets.select_related("intervention")}
    assert {r.kind for r in receipts.values()} == {"transfer"}
    assert receipts[ids[1]].override and not receipts[ids[0]].override
    assert receipts[ids[1]].receipt["records"][0]["from"] == "olga"


def test_roles_decide_who_runs_which_fleet_operation(worker, cast):
    ids = _runs(worker, 1)
    for name, kind in (("otto", "take_command"), ("april", "cancel"), ("vera", "pause")):
        with pytest.raises(Forbidden):
            _start(cast, name, kind, ids, options={"scope": "payments:charge"})
    assert AuditEvent.objects.filter(action="fleet.start", outcome="denied").count() == 3
    assert not FleetOperation.objects.exists()


def test_a_start_whose_selection_changed_since_the_preview_is_refused(worker, cast):
    ids = _runs(worker, 2)
    params = FleetParams()
    preview = preview_fleet_operation(
        actor=_actor(cast, "otto"), kind="pause", run_filter=_ids_filter(ids), params=params
    )
    place_run_in(ids[0], "succeeded")
    with pytest.raises(Conflict, match="selection changed"):
        start_fleet_operation(
            actor=_actor(cast, "otto"),
            kind="pause",
            run_filter=_ids_filter(ids),
            reason="x",
            params=params,
            digest=preview["digest"],
        )
    with pytest.raises(Invalid) as bad:
        _start(cast, "otto", "pause", ids, wave_size=0)
    assert bad.value.extra["field"] == "wave_size"


@pytest.mark.django_db(transaction=True)
def test_a_halt_racing_a_wave_ends_consistently(worker, cast, postgres_only, monkeypatch):
    ids = _runs(worker, 8)
    op = _start(cast, "otto", "pause", ids, wave_size=8)
    original = REGISTRY["pause"].preview

    def slow(run, req, actor):
        time.sleep(0.05)  # each decision holds the operation lock a while: the halt lands mid-wave
        return original(run, req, actor)

    monkeypatch.setattr(REGISTRY["pause"], "preview", slow)
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def wave():
        try:
            barrier.wait()
            run_fleet_wave(wave_key(op.pk, 1))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            connection.close()

    def stop():
        try:
            barrier.wait()
            halt_fleet_operation(actor=_actor(cast, "olga"), operation_id=op.pk, reason="stop")
        except Conflict:
            pass  # the wave completed the operation first
        except BaseException as exc:  # pragma: no cover
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=wave), threading.Thread(target=stop)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    op.refresh_from_db()
    assert op.state == "halted" and op.skipped > 0
    targets = list(op.targets.all())
    succeeded = [t for t in targets if t.status == "succeeded"]
    assert op.succeeded == len(succeeded) and op.skipped == len(
        [t for t in targets if t.status == "skipped"]
    )
    assert op.succeeded + op.failed + op.skipped == 8
    # Exactly the succeeded targets have receipts; no run was decided after the halt.
    assert Intervention.objects.filter(kind="pause").count() == len(succeeded)
    assert all(t.intervention_id for t in succeeded)
    paused = set(Run.objects.filter(state="paused").values_list("pk", flat=True))
    assert paused == {t.run_id for t in succeeded}
