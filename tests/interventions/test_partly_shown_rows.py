"""Issue 20, item 5: the resume preview itemises what runs again (each step and effect with its
idempotency protection); a compensation plan with an irreversible effect in the middle of the
ledger orders and reports it in its place. (A timer firing during a pause: tests/e2e/test_timer_pause.py.)"""

from __future__ import annotations

import pytest

from interventions.compensate import compensate_card, compensate_receipt, run_compensation_plan
from interventions.models import Intervention
from interventions.registry import CompensationResult
from runs.models import Effect, Run
from tests.conftest import claim, declare, start_run
from tests.interventions.helpers import commit, intervene
from tests.interventions.test_compensate import AUTHORITY, issued_plan, world  # noqa: F401

pytestmark = pytest.mark.django_db


def test_the_resume_preview_itemises_each_step_and_effect_that_runs_again(worker, as_user):
    otto = as_user("otto")
    run = start_run(worker, authority=AUTHORITY)
    token = claim(worker, run["id"])["lease"]["fencing_token"]
    commit(
        worker, run["id"], token, "o-reserve", tool="inventory", action="reserve", step="reserve"
    )
    worker.post(
        f"/runs/{run['id']}/checkpoints", {"fencing_token": token, "step": "reserve", "state": {}}
    )
    commit(worker, run["id"], token, "o-charge", step="charge")
    label = declare(
        worker,
        run["id"],
        token,
        key="o-label",
        step="label",
        tool="shipping",
        action="create_label",
    ).json()
    worker.post(f"/effects/{label['id']}/outcome", {"fencing_token": token, "status": "failed"})
    assert intervene(otto, run["id"], "pause").json()["receipt"]["state"] == "paused"

    shown = otto.post(
        f"/runs/{run['id']}/interventions/preview", {"kind": "resume", "reason": "r"}
    ).json()
    assert shown["resume_from"]["seq"] == 1
    steps = shown["re_executes"]
    assert [s["step"] for s in steps] == ["charge", "label"]  # reserve is behind the checkpoint
    charge, failed = steps[0]["effects"][0], steps[1]["effects"][0]
    assert (charge["idempotency_key"], charge["status"], charge["protected"]) == (
        "o-charge",
        "committed",
        True,
    )
    assert "replays the recorded result under o-charge" in charge["protection"]
    assert failed["status"] == "failed" and "dispatched again under o-label" in failed["protection"]


def test_the_resume_dialog_shows_each_effects_protection(worker, cast, client, as_user):
    run = start_run(worker)
    token = claim(worker, run["id"])["lease"]["fencing_token"]
    worker.post(
        f"/runs/{run['id']}/checkpoints", {"fencing_token": token, "step": "start", "state": {}}
    )
    commit(worker, run["id"], token, "o-charge", step="charge")
    assert intervene(as_user("otto"), run["id"], "pause").json()["receipt"]["state"] == "paused"
    client.force_login(cast["otto"][0])
    page = client.get(f"/runs/{run['id']}/interventions/new/", {"kind": "resume"}).content.decode()
    assert "replays the recorded result under o-charge" in page


def _ledger_with_irreversible_in_the_middle(worker) -> dict:
    """reserve, notify (irreversible), label, charge: committed in that order, then failed."""
    run = start_run(worker, authority=AUTHORITY)
    token = claim(worker, run["id"])["lease"]["fencing_token"]
    for step, tool, action, comp in [
        ("reserve", "inventory", "reserve", {"tool": "inventory", "action": "release"}),
        ("notify", "notifications", "enqueue", None),
        ("label", "shipping", "create_label", {"tool": "shipping", "action": "void_label"}),
        ("charge", "payments", "charge", {"tool": "payments", "action": "refund"}),
    ]:
        extra = {"compensation": comp} if comp else {"compensation": None, "irreversible": True}
        commit(worker, run["id"], token, f"o-{step}", step=step, tool=tool, action=action, **extra)
    fin = worker.post(f"/runs/{run['id']}/finish", {"fencing_token": token, "outcome": "failed"})
    assert fin.status_code == 200, fin.content
    return run


def test_an_irreversible_effect_mid_ledger_keeps_its_place_and_the_plan_goes_past_it(
    worker,
    as_user,
    world,  # noqa: F811 -- the fixture, imported above
    django_capture_on_commit_callbacks,
):
    run = _ledger_with_irreversible_in_the_middle(worker)
    ian = as_user("ian")
    shown = ian.post(
        f"/runs/{run['id']}/interventions/preview", {"kind": "compensate", "reason": "r"}
    ).json()
    plan = shown["plan"]
    assert [(s["position"], s["step"]) for s in plan["steps"]] == [
        (1, "charge"),
        (2, "label"),
        (3, "reserve"),
    ]
    assert [(c["step"], c["irreversible"]) for c in plan["called_out"]] == [("notify", True)]
    card_rows = compensate_card(shown)[0]["table"]["rows"]
    assert [(r["cells"][0]["v"], r["cells"][1]["v"]) for r in card_rows] == [
        (1, "payments:charge"),
        (2, "shipping:create_label"),
        ("—", "notifications:enqueue"),  # between label and reserve, where the ledger has it
        (3, "inventory:reserve"),
    ]
    assert card_rows[2]["mark"] == "irreversible"

    receipt, plan_row = issued_plan(ian, run["id"], django_capture_on_commit_callbacks)
    line = compensate_receipt(receipt["receipt"])[0]["text"]
    assert line.endswith(
        "payments:refund, shipping:void_label, "
        "[notifications:enqueue irreversible: stays committed], inventory:release"
    ), line
    assert run_compensation_plan(str(plan_row.pk))["status"] == "completed"
    assert [c[1] for c in world.calls] == ["charge", "create_label", "reserve"]  # past it
    notify = Effect.objects.get(run_id=run["id"], step="notify")
    assert notify.status == "committed" and notify.compensation_status == ""
    done = Intervention.objects.get(pk=receipt["id"]).receipt["job"]
    assert "3 of 3 step(s) done" in done["summary"] and "1 called out" in done["summary"]
    assert done["plan"]["called_out"][0]["idempotency_key"] == "o-notify"
    assert Run.objects.get(pk=run["id"]).state == "compensated"


def test_a_failure_after_the_irreversible_effect_is_reported_with_it(
    worker,
    as_user,
    world,  # noqa: F811 -- the fixture, imported above
    django_capture_on_commit_callbacks,
):
    run = _ledger_with_irreversible_in_the_middle(worker)
    world.fail(
        "inventory",
        "reserve",
        *[CompensationResult(ok=False, detail={"error": "gone"}, retryable=False)],
    )
    receipt, plan_row = issued_plan(
        as_user("ian"), run["id"], django_capture_on_commit_callbacks, max_attempts=1
    )
    assert run_compensation_plan(str(plan_row.pk))["status"] == "partially_failed"
    done = Intervention.objects.get(pk=receipt["id"]).receipt["job"]
    assert [s["step"] for s in done["plan"]["steps"] if s["status"] == "done"] == [
        "charge",
        "label",
    ]
    assert [s["step"] for s in done["plan"]["steps"] if s["status"] == "failed"] == ["reserve"]
    assert [c["step"] for c in done["plan"]["called_out"]] == ["notify"]
    assert Run.objects.get(pk=run["id"]).state == "compensation_failed"
