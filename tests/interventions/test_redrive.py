"""Redrive from a chosen checkpoint (interventions/redrive.py): the preview accounts for every effect
committed after the checkpoint; each is kept or compensated first; the new attempt starts from the
checkpoint only once those are settled."""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from audit.models import AuditEvent
from core.auth import actor_for_user
from core.errors import DomainError
from interventions.base import issue
from interventions.compensate import run_compensation_plan
from interventions.models import CompensationPlan, Intervention
from interventions.plugins import Request
from interventions.registry import CompensationResult
from runs.models import Effect, Run
from tests.conftest import claim, declare, start_run
from tests.interventions.helpers import commit, intervene
from tests.interventions.test_compensate import AUTHORITY, world  # noqa: F401

pytestmark = pytest.mark.django_db

STEPS = [  # step, tool, action, compensation
    ("reserve", "inventory", "reserve", {"tool": "inventory", "action": "release"}),
    ("label", "shipping", "create_label", {"tool": "shipping", "action": "void_label"}),
    ("charge", "payments", "charge", {"tool": "payments", "action": "refund"}),
]


def failed_run(worker, *, irreversible_label=False) -> tuple[dict, dict[str, str]]:
    """reserve, checkpoint 1, label, charge -- all committed -- then the attempt failed."""
    run = start_run(worker, authority=AUTHORITY)
    token = claim(worker, run["id"])["lease"]["fencing_token"]
    ids = {}
    for step, tool, action, comp in STEPS:
        extra = {"compensation": comp}
        if irreversible_label and step == "label":
            extra = {"compensation": None, "irreversible": True}
        ids[step] = commit(
            worker, run["id"], token, f"o-{step}", step=step, tool=tool, action=action, **extra
        )["id"]
        if step == "reserve":
            resp = worker.post(
                f"/runs/{run['id']}/checkpoints",
                {"fencing_token": token, "step": "reserve", "state": {"reserved": True}},
            )
            assert resp.status_code == 201, resp.content
    fin = worker.post(
        f"/runs/{run['id']}/finish",
        {"fencing_token": token, "outcome": "failed", "failure_class": "transient", "error": "x"},
    )
    assert fin.status_code == 200, fin.content
    return run, ids


def _preview(api, run_id, **options):
    resp = api.post(
        f"/runs/{run_id}/interventions/preview",
        {"kind": "redrive", "reason": "r", "options": options},
    )
    assert resp.status_code == 200, resp.content
    return resp.json()


def test_the_preview_accounts_for_every_effect_after_the_checkpoint(worker, as_user):
    run, ids = failed_run(worker)
    shown = _preview(as_user("otto"), run["id"], checkpoint_seq=1, compensate_first=[ids["charge"]])
    assert shown["redrive_from"]["seq"] == 1 and not shown["blocked_by"]
    rows = {r["step"]: r for r in shown["committed_after"]}
    assert list(rows) == ["label", "charge"]  # reserve is before the checkpoint: not listed
    assert rows["label"]["choice"] == "keep" and rows["label"]["reversible"] is True
    assert "replays the recorded result under o-label" in rows["label"]["re_execution"]
    assert rows["charge"]["choice"] == "compensate_first"
    assert rows["charge"]["compensation"]["action"] == "refund"
    assert rows["charge"]["compensation_key"] == "compensate:o-charge"
    assert [s["step"] for s in shown["re_executes"]] == ["label", "charge"]
    assert Run.objects.get(pk=run["id"]).state == "failed"  # the preview changed nothing


def test_keeping_every_effect_queues_the_run_from_the_checkpoint_now(worker, as_user):
    run, ids = failed_run(worker)
    resp = intervene(as_user("otto"), run["id"], "redrive", options={"checkpoint_seq": 1})
    assert resp.status_code == 202, resp.content
    receipt = resp.json()["receipt"]
    assert receipt["state"] == "queued" and receipt["kept"] == ["o-label", "o-charge"]
    again = claim(worker, run["id"], "w2")
    assert again["attempt"]["number"] == 2 and again["checkpoint"]["seq"] == 1
    token = again["lease"]["fencing_token"]
    replay = declare(worker, run["id"], token, key="o-charge", step="charge", args={"amount": 100})
    assert replay.json()["decision"] == "replayed", replay.content  # kept: not dispatched again
    assert AuditEvent.objects.filter(action="intervention.redrive", run_id=run["id"]).exists()


def test_compensate_first_settles_then_starts_and_the_old_key_is_refused(
    worker,
    as_user,
    world,  # noqa: F811 -- the fixture, imported above
    django_capture_on_commit_callbacks,
):
    run, ids = failed_run(worker)
    with django_capture_on_commit_callbacks(execute=False):
        resp = intervene(
            as_user("otto"),
            run["id"],
            "redrive",
            options={"checkpoint_seq": 1, "compensate_first": [ids["charge"]]},
        )
    assert resp.status_code == 202, resp.content
    assert resp.json()["receipt"]["state"] == "compensating"
    refused = worker.post(f"/runs/{run['id']}/claim", {"worker": "w2"})
    assert refused.status_code == 409  # not before the effects are settled
    plan = CompensationPlan.objects.get(run_id=run["id"])
    assert [s.effect_id for s in plan.steps.all()] == [Effect.objects.get(pk=ids["charge"]).pk]
    assert run_compensation_plan(str(plan.pk))["status"] == "completed"
    assert [c[1] for c in world.calls] == ["charge"]  # only the chosen one
    row = Run.objects.get(pk=run["id"])
    assert row.state == "queued" and row.resume_checkpoint.seq == 1
    done = Intervention.objects.get(pk=resp.json()["id"])
    assert (
        done.status == "completed"
        and done.receipt["job"]["redrive"] == "queued from the checkpoint"
    )
    again = claim(worker, run["id"], "w2")
    assert again["checkpoint"]["seq"] == 1
    token = again["lease"]["fencing_token"]
    label = declare(
        worker, run["id"], token, key="o-label", step="label", tool="shipping",
        action="create_label", args={"amount": 100},
    )  # fmt: skip
    assert label.json()["decision"] == "replayed"  # kept
    old = declare(worker, run["id"], token, key="o-charge", step="charge")
    assert old.status_code == 422 and old.json()["compensated"] is True
    new = declare(worker, run["id"], token, key="o-charge-2", step="charge")
    assert new.status_code == 201 and new.json()["decision"] == "authorized"


def test_a_failed_compensation_leaves_the_run_unstarted(
    worker,
    as_user,
    world,  # noqa: F811 -- the fixture, imported above
    django_capture_on_commit_callbacks,
):
    run, ids = failed_run(worker)
    world.fail("payments", "charge", CompensationResult(ok=False, retryable=False))
    with django_capture_on_commit_callbacks(execute=False):
        resp = intervene(
            as_user("otto"),
            run["id"],
            "redrive",
            options={"checkpoint_seq": 1, "compensate_first": [ids["charge"]], "max_attempts": 1},
        )
    plan = CompensationPlan.objects.get(run_id=run["id"])
    assert run_compensation_plan(str(plan.pk))["status"] == "failed"
    assert Run.objects.get(pk=run["id"]).state == "compensation_failed"
    assert Intervention.objects.get(pk=resp.json()["id"]).status == "failed"
    assert worker.post(f"/runs/{run['id']}/claim", {"worker": "w2"}).status_code == 409


def test_what_cannot_be_redriven_is_refused_by_name(worker, as_user):
    run, ids = failed_run(worker, irreversible_label=True)
    otto = as_user("otto")
    shown = _preview(otto, run["id"], checkpoint_seq=1, compensate_first=[ids["label"]])
    assert "cannot be compensated: irreversible" in shown["blocked_by"][0]
    resp = intervene(otto, run["id"], "redrive", options={"compensate_first": [ids["label"]]})
    assert resp.status_code == 409 and "irreversible" in resp.json()["detail"]
    before = intervene(
        otto,
        run["id"],
        "redrive",
        options={"compensate_first": [ids["reserve"]], "checkpoint_seq": 1},
    )
    assert before.status_code == 409 and "not an effect committed after" in before.json()["detail"]
    missing = intervene(otto, run["id"], "redrive", options={"checkpoint_seq": 9})
    assert missing.status_code == 422 and missing.json()["field"] == "options.checkpoint_seq"
    bad = intervene(otto, run["id"], "redrive", options={"compensate_first": ["nope"]})
    assert bad.status_code == 422
    assert intervene(as_user("vera"), run["id"], "redrive").status_code == 403
    assert Run.objects.get(pk=run["id"]).state == "failed"


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("first", [False, True], ids=["keep", "compensate_first"])
def test_two_redrives_at_once_exactly_one_applies(first, worker, cast, postgres_only):
    run, ids = failed_run(worker)
    otto, olga = (actor_for_user(cast[n][0]) for n in ("otto", "olga"))
    barrier, results = threading.Barrier(2), []
    options = {"checkpoint_seq": 1} | ({"compensate_first": [ids["label"]]} if first else {})

    def go(actor):
        try:
            barrier.wait()
            req = Request(kind="redrive", reason="again", options=options)
            issue(actor=actor, run_id=run["id"], req=req)
            results.append("ok")
        except DomainError as err:
            results.append(err.code)
        finally:
            connection.close()

    threads = [threading.Thread(target=go, args=(a,)) for a in (otto, olga)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(results) == ["conflict", "ok"], results
    assert Intervention.objects.filter(run_id=run["id"], kind="redrive").count() == 1
    if first:  # one plan of the one chosen effect; nothing claimable before it settles
        (plan,) = CompensationPlan.objects.filter(run_id=run["id"])
        assert [str(s.effect_id) for s in plan.steps.all()] == [ids["label"]]
    assert Run.objects.get(pk=run["id"]).state in (
        ("compensating", "queued") if first else ("queued",)
    )


def test_the_console_dialog_chooses_per_effect_and_confirms(
    worker,
    cast,
    world,  # noqa: F811 -- the fixture, imported above
    django_capture_on_commit_callbacks,
):
    from tests.console.test_dialogs import browser, confirm, open_dialog, token_of

    run, ids = failed_run(worker)
    otto = browser("otto")
    dialog = open_dialog(otto, run["id"], "redrive").content.decode()
    assert 'data-testid="compensate-first"' in dialog and f'value="{ids["charge"]}"' in dialog
    preview = otto.post(
        f"/runs/{run['id']}/interventions/preview/",
        {"kind": "redrive", "checkpoint_seq": "1", "compensate_first": [ids["charge"]]},
        HTTP_HX_REQUEST="true",
    )
    html = preview.content.decode()
    assert preview.status_code == 200 and "compensate_first" in html and "o-label" in html
    assert "undone first under compensate:o-charge" in html
    with django_capture_on_commit_callbacks(execute=False):
        resp = confirm(
            otto,
            run["id"],
            "redrive",
            token_of(preview.content),
            checkpoint_seq="1",
            compensate_first=[ids["charge"]],
            reason="card processor back",
        )
    assert resp.status_code == 200, resp.content.decode()[:2000]
    assert "Receipt · Redrive" in resp.content.decode()
    assert Run.objects.get(pk=run["id"]).state == "compensating"
    plan = CompensationPlan.objects.get(run_id=run["id"])
    assert plan.steps.count() == 1
