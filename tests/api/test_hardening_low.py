"""Issue 19's low items, one test each: a boolean is no fencing token, duplicate JSON keys are
refused, a DataError names its field, a static path that leaves the static directories is a 404,
run trees are bounded, a negative amount does not slip under ``amount>200``, and a timed-out
approval is never reported as a rejection."""

from __future__ import annotations

import json

import pytest
from django.core.exceptions import SuspiciousFileOperation
from django.http import Http404
from django.test import RequestFactory

from runs.conditions import parse_policy_spec
from runs.models import Run
from tests.conftest import claim, declare, start_run

pytestmark = pytest.mark.django_db


def test_a_boolean_is_not_a_fencing_token(worker):
    run = start_run(worker)
    claim(worker, run["id"])
    for token in (True, "1", 1.0):
        resp = declare(worker, run["id"], token)  # type: ignore[arg-type]
        assert resp.status_code == 422 and resp.json()["field"] == "fencing_token", resp.content
    assert not Run.objects.get(pk=run["id"]).effects.exists()


def test_duplicate_json_keys_are_refused_naming_the_key(worker):
    run = start_run(worker)
    claim(worker, run["id"])
    raw = (
        '{"fencing_token": 1, "step": "s", "tool": "payments", "action": "charge",'
        ' "idempotency_key": "k", "args": {"amount": 1, "amount": 900}}'
    )
    resp = worker.client.post(
        f"/api/v1/runs/{run['id']}/effects", raw, content_type="application/json", **worker.headers
    )
    assert resp.status_code == 400, resp.content
    assert resp.json()["field"] == "amount" and "twice" in resp.json()["detail"]
    assert not Run.objects.get(pk=run["id"]).effects.exists()
    same = json.dumps({"fencing_token": 1, "events": [{"kind": "log", "data": {"a": 1}}]})
    ok = worker.client.post(
        f"/api/v1/runs/{run['id']}/events", same, content_type="application/json", **worker.headers
    )
    assert ok.status_code == 201, ok.content


def test_a_data_error_names_the_field(worker, monkeypatch):
    from django.db import DataError

    from api import app

    class Diag:
        column_name = None

    class Cause(Exception):
        diag = Diag()

    request = RequestFactory().post(
        "/api/v1/runs", json.dumps({"goal": "x" * 300}), content_type="application/json"
    )
    exc = DataError("value too long for type character varying(200)")
    exc.__cause__ = Cause()
    resp = app.unstorable(request, exc)
    assert resp.status_code == 422 and json.loads(resp.content)["field"] == "goal"
    Diag.column_name = "external_ref"
    assert json.loads(app.unstorable(request, exc).content)["field"] == "external_ref"


def test_a_static_path_leaving_the_static_dirs_is_a_404_not_a_500(settings):
    from django.contrib.staticfiles import finders

    from controlplane.static import SafeStaticFilesHandler

    async def app(scope, receive, send):  # pragma: no cover - never reached
        raise AssertionError

    handler = SafeStaticFilesHandler(app)
    request = RequestFactory().get("/static/..%2f..%2fcontrolplane%2fsettings.py")
    request.path = request.path_info = "/static/../../controlplane/settings.py"
    with pytest.raises(SuspiciousFileOperation):
        finders.find("../../controlplane/settings.py")  # what made the unpatched handler 500
    with pytest.raises(Http404):
        handler.serve(request)


def test_run_trees_are_bounded_in_children_and_depth(worker, settings):
    settings.MAX_CHILDREN_PER_RUN, settings.MAX_TREE_DEPTH = 2, 3
    parent = start_run(worker)
    for _ in range(2):
        start_run(worker, parent_run_id=parent["id"], authority=[])
    third = worker.post(
        "/runs", {"agent": "purchasing", "goal": "g", "parent_run_id": parent["id"]}
    )
    assert third.status_code == 422 and third.json()["field"] == "parent_run_id", third.content
    child = Run.objects.filter(parent_id=parent["id"]).first()
    grandchild = start_run(worker, parent_run_id=str(child.pk), authority=[])
    deeper = worker.post(
        "/runs", {"agent": "purchasing", "goal": "g", "parent_run_id": grandchild["id"]}
    )
    assert deeper.status_code == 422 and "levels deep" in deeper.json()["detail"], deeper.content


def test_a_negative_amount_does_not_slip_under_a_bound():
    policy = parse_policy_spec("payments:charge amount>200")
    assert policy.condition is not None
    from runs.conditions import parse_condition

    cond = parse_condition(policy.condition)
    assert cond.matches({"amount": -500}) and cond.matches({"amount": "-500"})
    assert cond.matches({"amount": 300}) and not cond.matches({"amount": 100})


def test_a_timed_out_approval_is_not_reported_as_a_rejection():
    from controlplane_sdk.models import Approval

    timed_out = Approval(id="a", status="timed_out")
    assert "rejected" not in timed_out.outcome() and "timed out" in timed_out.outcome()
    assert Approval(id="b", status="rejected", decided_by="april").outcome() == "rejected by april"


def test_a_viewer_reads_the_runs_audit_events_and_not_the_whole_log(worker, as_user, cast):
    from audit.models import AuditEvent
    from audit.services import record_audit
    from core.actors import system_actor

    run = start_run(worker)
    record_audit(
        actor=system_actor("test"),
        action="token.issue",
        object_type="token",
        object_id="t-1",
        context={"name": "ops-token"},
    )
    assert AuditEvent.objects.filter(run_id__isnull=True).exists()
    for name, whole in [("vera", False), ("otto", False), ("sam", True), ("ian", True)]:
        events = as_user(name).get("/audit", limit=1000).json()["events"]
        runless = [e for e in events if not e.get("run_id")]
        assert bool(runless) is whole, (name, runless[:2])
        assert any(e.get("run_id") == run["id"] for e in events), name

    from django.test import Client

    vera = Client()
    assert vera.login(username="vera", password="pw-vera")
    page = vera.get("/audit/")
    assert page.status_code == 200 and b"token.issue" not in page.content
    sam = Client()
    assert sam.login(username="sam", password="pw-sam")
    assert b"token.issue" in sam.get("/audit/").content


def test_a_policy_bounds_a_sum_per_run_and_window(worker):
    from core.actors import system_actor
    from runs.conditions import ConditionError, parse_condition
    from runs.services.agents import set_approval_policies

    set_approval_policies(
        actor=system_actor("test"),
        agent="purchasing",
        approvals=["payments:charge sum(amount)>200 per 1h"],
    )
    run = start_run(worker)
    claim(worker, run["id"])
    decided = [
        declare(worker, run["id"], 1, key=f"k{i}", args={"amount": 100}).json() for i in range(3)
    ]
    assert [d["decision"] for d in decided] == ["authorized", "authorized", "denied"], decided
    assert decided[2]["reason"] == "approval_required"
    other = start_run(worker)  # per run: another run's window starts empty
    claim(worker, other["id"])
    assert declare(worker, other["id"], 1, key="o1", args={"amount": 150}).json()["decision"] == (
        "authorized"
    )
    assert parse_condition("sum(amount)>=5 per 30m").window_s == 1800
    with pytest.raises(ConditionError):
        parse_condition("sum(amount)>5 per 0s")


def test_over_long_urls_and_headers_are_a_400_naming_which():
    import asyncio

    from controlplane.wire import WireLimits

    sent: list[dict] = []

    async def app(scope, receive, send):
        sent.append({"reached": True})

    async def send(message):
        sent.append(message)

    def call(scope):
        sent.clear()
        asyncio.run(WireLimits(app)(scope, None, send))
        return sent

    ok = {"type": "http", "raw_path": b"/runs/", "query_string": b"", "headers": [(b"a", b"b")]}
    assert call(ok) == [{"reached": True}]
    long_url = ok | {"raw_path": b"/" + b"a" * 9000}
    assert call(long_url)[0]["status"] == 400 and b'"url"' in sent[1]["body"]
    big = ok | {"headers": [(b"x-big", b"a" * 17000)]}
    assert call(big)[0]["status"] == 400 and b'"headers"' in sent[1]["body"]


def test_a_negative_amount_declared_needs_the_approval(worker):
    """End to end: a charge of -500 against ``amount>200`` is not authorised without the approval
    (a negative is a refund dressed as a charge), while a charge of 100 is."""
    from core.actors import system_actor
    from runs.services.agents import set_approval_policies

    set_approval_policies(
        actor=system_actor("test"), agent="purchasing", approvals=["payments:charge amount>200"]
    )
    run = start_run(worker)
    claim(worker, run["id"])
    negative = declare(worker, run["id"], 1, key="neg", args={"amount": -500}).json()
    assert negative["decision"] == "denied" and negative["reason"] == "approval_required"
    small = declare(worker, run["id"], 1, key="small", args={"amount": 100}).json()
    assert small["decision"] == "authorized"
