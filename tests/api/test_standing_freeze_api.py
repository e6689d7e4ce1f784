"""/api/v1/fleet/freezes: a capability freeze is a standing rule over a scope of the fleet. Runs that
start, are claimed, resumed, retried or delegated to after it are covered; the refusal names the
freeze, who set it and why; restore lifts it for every run at once; both audited; per-run freezes
stay as they are."""

from __future__ import annotations

import pytest

from audit.models import AuditEvent
from interventions.resume import revalidate_run
from runs.models import Agent, StandingFreeze
from tests.conftest import claim, declare, start_run
from tests.interventions.helpers import intervene, running_run

pytestmark = pytest.mark.django_db

CHARGE = {"capability": "payments:charge", "over": "agent", "agent": "purchasing"}


def _freeze(api, body=CHARGE, reason="card processor flapping"):
    shown = api.post("/fleet/freezes/preview", body)
    assert shown.status_code == 200, shown.content
    resp = api.post("/fleet/freezes", {**body, "reason": reason, "digest": shown.json()["digest"]})
    assert resp.status_code == 201, resp.content
    return shown.json(), resp.json()


def _charge(worker, run_id, token, key):
    return declare(worker, run_id, token, key=key)


def test_a_freeze_stands_for_runs_started_claimed_retried_resumed_and_delegated_after_it(
    worker, as_user
):
    ian = as_user("ian")
    before_claimed = start_run(worker)  # created before the freeze, claimed after it
    running, lease = running_run(worker)  # running when it is set
    paused, paused_claim = running_run(worker)
    assert intervene(ian, paused["id"], "pause").status_code == 202
    failed, failed_claim = running_run(worker, retry_policy={"backoff_s": 0})
    worker.post(
        f"/runs/{failed['id']}/finish",
        {"fencing_token": failed_claim["lease"]["fencing_token"], "outcome": "failed"},
    )

    shown, receipt = _freeze(ian)
    assert shown["covers_now"] == 4 and shown["blocked_by"] == []
    assert "created, claimed, resumed, retried or delegated" in shown["covers_later"]
    freeze = receipt["freeze"]
    assert (freeze["capability"], freeze["scope"], freeze["frozen_by"]) == (
        "payments:charge",
        "agent purchasing",
        "user:ian",
    )
    assert receipt["covers_now"] == 4

    def refused(run_id, token, key):
        resp = _charge(worker, run_id, token, key)
        assert resp.status_code == 409, resp.content
        body = resp.json()
        assert body["reason"] == "capability_frozen"
        assert freeze["id"] in body["detail"] and "user:ian" in body["detail"]
        assert "card processor flapping" in body["detail"]
        assert body["freeze"]["id"] == freeze["id"]
        return body

    refused(running["id"], lease["lease"]["fencing_token"], "k-running")
    later = claim(worker, before_claimed["id"])
    refused(before_claimed["id"], later["lease"]["fencing_token"], "k-claimed")
    created, created_claim = running_run(worker)  # created after it
    refused(created["id"], created_claim["lease"]["fencing_token"], "k-created")
    retry = intervene(ian, failed["id"], "retry")
    assert retry.status_code == 202, retry.content
    again = claim(worker, failed["id"])
    refused(failed["id"], again["lease"]["fencing_token"], "k-retried")
    resume = intervene(ian, paused["id"], "resume")
    assert resume.status_code == 202, resume.content
    revalidate_run(resume.json()["id"])
    resumed = claim(worker, paused["id"])
    refused(paused["id"], resumed["lease"]["fencing_token"], "k-resumed")
    child = start_run(
        worker,
        parent_run_id=created["id"],
        authority=[{"scope": "payments:charge", "ttl_s": 60}],
    )
    child_claim = claim(worker, child["id"])
    refused(child["id"], child_claim["lease"]["fencing_token"], "k-delegated")
    # other capabilities are untouched
    other = declare(
        worker,
        created["id"],
        created_claim["lease"]["fencing_token"],
        key="k-reserve",
        tool="inventory",
        action="reserve",
    )
    assert other.status_code == 201, other.content
    assert AuditEvent.objects.filter(action="capability.standing_freeze").count() == 1

    # Restore lifts it for every run at once; audited once.
    restore_shown = ian.post(f"/fleet/freezes/{freeze['id']}/restore/preview")
    assert restore_shown.status_code == 200, restore_shown.content
    restored = ian.post(
        f"/fleet/freezes/{freeze['id']}/restore",
        {"reason": "processor stable", "digest": restore_shown.json()["digest"]},
    )
    assert restored.status_code == 200, restored.content
    assert restored.json()["freeze"]["live"] is False
    assert restored.json()["freeze"]["lifted_by"] == "user:ian"
    for run_id, token, key in (
        (created["id"], created_claim["lease"]["fencing_token"], "k-created-2"),
        (child["id"], child_claim["lease"]["fencing_token"], "k-delegated-2"),
        (failed["id"], again["lease"]["fencing_token"], "k-retried-2"),
    ):
        assert _charge(worker, run_id, token, key).status_code == 201
    assert AuditEvent.objects.filter(action="capability.standing_restore").count() == 1
    again_restore = ian.post(f"/fleet/freezes/{freeze['id']}/restore", {"reason": "twice"})
    assert again_restore.status_code == 409
    assert AuditEvent.objects.filter(
        action="capability.standing_restore", outcome="denied"
    ).exists()


def test_everything_and_filter_scopes_and_a_run_freeze_stays_as_it_is(worker, as_user):
    sam = as_user("sam")
    Agent.objects.create(name="support", allowed_scopes=["payments:charge"])
    run, c = running_run(worker)
    token = c["lease"]["fencing_token"]
    # a per-run freeze of the same capability
    per_run = intervene(
        sam, run["id"], "freeze_capability", "this run only", options={"scope": "payments:*"}
    )
    assert per_run.status_code == 202, per_run.content
    _, filt = _freeze(
        sam,
        {"capability": "payments:*", "over": "filter", "filter": "agent=purchasing&q=sku-1"},
        reason="sku-1 fraud wave",
    )
    assert filt["freeze"]["scope"] == "runs matching q=sku-1&agent=purchasing" or filt["freeze"][
        "scope"
    ].startswith("runs matching")
    other = running_run(worker, goal="something else entirely", input={})[0]
    other_token = 1
    ok = declare(worker, other["id"], other_token, key="k-other")
    assert ok.status_code == 201, ok.content  # not matched by the filter
    _, everything = _freeze(
        sam, {"capability": "payments:charge", "over": "everything"}, reason="stop all charges"
    )
    denied = declare(worker, other["id"], other_token, key="k-other-2")
    assert denied.status_code == 409 and denied.json()["freeze"]["id"] == everything["freeze"]["id"]
    assert "every run" in denied.json()["detail"]
    for f in (filt, everything):
        shown = sam.post(f"/fleet/freezes/{f['freeze']['id']}/restore/preview").json()
        resp = sam.post(
            f"/fleet/freezes/{f['freeze']['id']}/restore",
            {"reason": "over", "digest": shown["digest"]},
        )
        assert resp.status_code == 200, resp.content
    # the run's own freeze stands
    still = declare(worker, run["id"], token, key="k-own")
    assert still.status_code == 409 and still.json()["freeze"]["kind"] == "run"
    listed = sam.get("/fleet/freezes").json()["freezes"]
    assert {f["live"] for f in listed} == {False} and len(listed) == 2


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"capability": "payments", "over": "everything"}, "capability"),
        ({"capability": "payments:charge", "over": "galaxy"}, "over"),
        ({"capability": "payments:charge", "over": "agent", "agent": "nobody"}, "agent"),
        (
            {"capability": "payments:charge", "over": "filter", "filter": "state=running"},
            "filter.state",
        ),
        ({"capability": "payments:charge", "over": "filter", "filter": ""}, "filter"),
        ({"capability": "payments:charge", "over": "everything", "filter": "agent=x"}, "filter"),
    ],
)
def test_bad_input_is_a_422_naming_the_field(worker, as_user, body, field):
    resp = as_user("ian").post("/fleet/freezes/preview", body)
    assert resp.status_code == 422, resp.content
    assert field in resp.json()["field"], resp.json()


def test_roles_a_duplicate_and_a_stale_preview_are_refused_and_audited(worker, as_user):
    running_run(worker)
    for name in ("otto", "vera", "april"):
        resp = as_user(name).post("/fleet/freezes", {**CHARGE, "reason": "nope"})
        assert resp.status_code == 403, (name, resp.content)
    assert (
        AuditEvent.objects.filter(action="capability.standing_freeze", outcome="denied").count()
        == 3
    )
    ian = as_user("ian")
    shown = ian.post("/fleet/freezes/preview", CHARGE).json()
    running_run(worker)  # the fleet moved on: one more run covered
    stale = ian.post("/fleet/freezes", {**CHARGE, "reason": "r", "digest": shown["digest"]})
    assert stale.status_code == 409 and stale.json()["error"] == "preview_stale", stale.content
    assert stale.json()["covers_now"] == 2
    _freeze(ian)
    dup = ian.post("/fleet/freezes", {**CHARGE, "reason": "again"})
    assert dup.status_code == 409 and "already frozen" in dup.json()["detail"]
    assert StandingFreeze.objects.filter(lifted_at__isnull=True).count() == 1
    worker_refused = as_user("ian")
    assert worker_refused.get("/fleet/freezes?live=true").json()["freezes"][0]["live"] is True


@pytest.mark.django_db(transaction=True)
def test_two_identical_freezes_at_once_one_stands_and_two_restores_one_lifts(
    worker, cast, postgres_only
):
    from django.test import Client

    from tests.conftest import Api
    from tests.interventions.test_races import _run_in_threads

    running_run(worker)

    def post(token: str, path: str, body: dict) -> tuple[int, dict]:
        resp = Api(Client(), token).post(path, body)
        return resp.status_code, resp.json()

    body = {**CHARGE, "reason": "card processor flapping"}
    people = (cast["ian"][1], cast["sam"][1], cast["ada"][1])
    results = [
        r[1] for r in _run_in_threads([lambda t=t: post(t, "/fleet/freezes", body) for t in people])
    ]
    assert sorted(code for code, _ in results) == [201, 409, 409], results
    assert StandingFreeze.objects.filter(lifted_at__isnull=True).count() == 1
    fid = next(b for code, b in results if code == 201)["freeze"]["id"]
    restore = f"/fleet/freezes/{fid}/restore"
    results = [
        r[1]
        for r in _run_in_threads([lambda t=t: post(t, restore, {"reason": "ok"}) for t in people])
    ]
    assert sorted(code for code, _ in results) == [200, 409, 409], results
    assert (
        AuditEvent.objects.filter(action="capability.standing_restore", outcome="allowed").count()
        == 1
    )
    assert (
        AuditEvent.objects.filter(action="capability.standing_freeze", outcome="denied").count()
        == 2
    )
