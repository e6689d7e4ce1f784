"""Operator control is unconditional: whatever the edge accepts can be read back and rendered, so no
worker can make a run impossible to pause, cancel or look at. And a bad token is a 401 everywhere."""

from __future__ import annotations

import json

import pytest
from django.test import Client
from django.utils import timezone

from interventions import retry
from runs.models import ApiToken, Run
from tests.conftest import declare, start_run
from tests.interventions.helpers import intervene, running_run

pytestmark = pytest.mark.django_db


def browser(username: str, **kwargs) -> Client:
    client = Client(**kwargs)
    assert client.login(username=username, password=f"pw-{username}")
    return client


def refused(resp, field: str, status: int = 422) -> dict:
    assert resp.status_code == status, resp.content
    body = resp.json()
    assert body["error"] and body["detail"], body
    assert body["field"] == field, body
    return body


# --- datetimes ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "deadline",
    [
        "9999-12-31T23:00:00-14:00",  # stored as year 10000 UTC: psycopg cannot read it back
        "0001-01-01T00:00:00+14:00",  # year 0 UTC, the same on the other side
        "2030-01-01T00:00:00",  # naive: whose 00:00?
        "1970-01-01T00:00:00Z",
        "2101-01-01T00:00:00Z",
    ],
)
def test_a_child_run_with_an_unreadable_deadline_is_refused_and_the_parent_stays_controllable(
    worker, cast, as_user, deadline
):
    parent, _ = running_run(worker)
    child = worker.post(
        "/runs",
        {
            "agent": "purchasing",
            "goal": "child",
            "parent_run_id": parent["id"],
            "deadline": deadline,
        },
    )
    refused(child, "deadline")
    assert Run.objects.count() == 1, "nothing half-written"

    ian = as_user("ian")
    assert ian.get("/runs").status_code == 200
    assert ian.get(f"/runs/{parent['id']}").status_code == 200
    assert browser("ian").get(f"/runs/{parent['id']}/").status_code == 200
    pause = intervene(ian, parent["id"], "pause", reason="the child looked odd")
    assert pause.status_code == 202, pause.content
    cancel = intervene(ian, parent["id"], "cancel", reason="and then we stopped it")
    assert cancel.status_code == 202, cancel.content


def test_a_deadline_inside_the_window_is_kept_with_its_offset_applied(worker):
    run = start_run(worker, deadline="2099-12-31T23:00:00-14:00")
    assert Run.objects.get(pk=run["id"]).deadline.year == 2100


# --- retry_policy and other nested options --------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "field"),
    [
        ({"max_attempts": "never"}, "retry_policy.max_attempts"),
        ({"max_attempts": 0}, "retry_policy.max_attempts"),
        ({"max_attempts": 10**6}, "retry_policy.max_attempts"),
        ({"backoff_s": -1}, "retry_policy.backoff_s"),
        ({"backoff_factor": 1e308}, "retry_policy.backoff_factor"),
        ({"retryable": "timeout"}, "retry_policy.retryable"),
        ({"forever": True}, "retry_policy.forever"),
        ("never", "retry_policy"),
    ],
)
def test_a_retry_policy_is_checked_by_a_strict_schema(worker, policy, field):
    refused(
        worker.post("/runs", {"agent": "purchasing", "goal": "g", "retry_policy": policy}), field
    )
    assert not Run.objects.exists()


def test_a_valid_retry_policy_is_stored_as_given(worker):
    run = start_run(worker, retry_policy={"max_attempts": 5, "retryable": ["timeout"]})
    assert Run.objects.get(pk=run["id"]).retry_policy == {
        "max_attempts": 5,
        "retryable": ["timeout"],
    }


def test_a_bad_policy_stored_before_the_edge_checked_falls_back_to_the_defaults(worker, as_user):
    run, lease = running_run(worker)
    token = lease["lease"]["fencing_token"]
    worker.post(f"/runs/{run['id']}/finish", {"fencing_token": token, "outcome": "failed"})
    Run.objects.filter(pk=run["id"]).update(
        retry_policy={"max_attempts": "never", "backoff_s": None, "backoff_factor": -5}
    )
    assert retry.policy(Run.objects.get(pk=run["id"])) == retry.DEFAULT_POLICY
    preview = as_user("otto").post(
        f"/runs/{run['id']}/interventions/preview", {"kind": "retry", "reason": "try again"}
    )
    assert preview.status_code == 200, preview.content
    issued = intervene(as_user("otto"), run["id"], "retry", reason="try again")
    assert issued.status_code == 202, issued.content


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"checkpoint_seq": "3"}, "options.checkpoint_seq"),
        ({"checkpoint_seq": 2**64}, "options.checkpoint_seq"),
        ({"suspend_authority": "yes"}, "options.suspend_authority"),
        ({"facets": "assignment"}, "options.facets"),
        ({"prefer": "chaos"}, "options.prefer"),
        ({"compensation": {"max_attempts": "never"}}, "options.compensation.max_attempts"),
        ({"approval_id": "not-a-uuid"}, "options.approval_id"),
        ({"sudo": True}, "options.sudo"),
    ],
)
def test_intervention_options_are_checked_by_a_strict_schema(worker, cast, as_user, options, field):
    run, _ = running_run(worker)
    otto = as_user("otto")
    for path in (f"/runs/{run['id']}/interventions", f"/runs/{run['id']}/interventions/preview"):
        refused(otto.post(path, {"kind": "pause", "reason": "r", "options": options}), field)
    assert Run.objects.get(pk=run["id"]).state == "running"


# --- numbers, nesting, size, characters -----------------------------------------------------------


def _nest(depth: int) -> dict:
    value: dict = {"leaf": 1}
    for _ in range(depth):
        value = {"n": value}
    return value


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"fencing_token": 2**64}, "fencing_token"),
        ({"args": {"amount": 2**64}}, "args.amount"),
        ({"args": {"amount": 1e308}}, "args.amount"),
        ({"args": _nest(40)}, "args" + ".n" * 32),
        ({"args": {"blob": "x" * (300 * 1024)}}, "args"),
        ({"args": {"bad\u0000key": 1}}, "args"),
        ({"args": {"note": "\ufdd0"}}, "args.note"),
        ({"args": {"note": "\uffff"}}, "args.note"),
        ({"step": "charge\u0000"}, "step"),
        (
            {"compensation": {"tool": "payments", "action": "refund", "args": _nest(40)}},
            "compensation.args" + ".n" * 32,
        ),
    ],
)
def test_effect_declarations_are_bounded(worker, body, field):
    run, lease = running_run(worker)
    token = body.pop("fencing_token", lease["lease"]["fencing_token"])
    refused(declare(worker, run["id"], token, **body), field)
    assert not Run.objects.get(pk=run["id"]).effects.exists()


def test_a_lone_surrogate_is_refused_naming_the_field(worker):
    raw = '{"agent": "purchasing", "goal": "g \\ud800 g"}'
    resp = worker.client.post(
        "/api/v1/runs", raw, content_type="application/json", **worker.headers
    )
    refused(resp, "goal")


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("checkpoints", {"step": "s", "state": _nest(40)}, "state" + ".n" * 32),
        ("events", {"events": [{"kind": "note", "data": _nest(40)}]}, "events.0.data" + ".n" * 32),
        ("approvals", {"tool": "payments", "action": "charge", "deadline_s": 10**9}, "deadline_s"),
    ],
)
def test_other_worker_writes_are_bounded(worker, path, body, field):
    run, lease = running_run(worker)
    body = {"fencing_token": lease["lease"]["fencing_token"]} | body
    refused(worker.post(f"/runs/{run['id']}/{path}", body), field)


def test_heartbeat_and_grant_numbers_are_bounded(worker):
    run, lease = running_run(worker)
    beat = f"/leases/{lease['lease']['id']}/heartbeat"
    refused(worker.post(beat, {"fencing_token": 1, "wait_s": 1e308}), "wait_s")
    refused(worker.post(beat, {"fencing_token": 1, "wait_s": -1}), "wait_s")
    grant = {
        "agent": "purchasing",
        "goal": "g",
        "authority": [{"scope": "payments:charge", "ttl_s": 10**12}],
    }
    refused(worker.post("/runs", grant), "authority.0.ttl_s")


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"limit": "abc"}, "limit"),
        ({"limit": "0"}, "limit"),
        ({"limit": str(2**70)}, "limit"),
        ({"agent": "purchasing\ufffe"}, "agent"),
    ],
)
def test_numeric_and_text_query_parameters_are_validated(worker, params, field):
    refused(worker.get("/runs", **params), field)


@pytest.mark.parametrize("after_seq", ["-1", "1e3", str(2**64), "٣"])
def test_audit_after_seq_is_validated(cast, as_user, after_seq):
    refused(as_user("vera").get("/audit", after_seq=after_seq), "after_seq")


@pytest.mark.parametrize(
    ("path", "params"),
    [
        ("/audit/", {"before": str(2**70)}),
        ("/audit/", {"before": "²"}),
        ("/audit/", {"before": "abc"}),
        ("/audit/export.jsonl", {"since_seq": str(2**70)}),
        ("/audit/export.jsonl", {"since_seq": "³"}),
        ("/", {"agent": "x\u0000y"}),
        ("/audit/", {"actor": "\ufdd0"}),
        ("/approvals/", {"q\u0000": "1"}),
    ],
)
def test_console_query_strings_are_validated(cast, path, params):
    resp = browser("ada").get(path, params)
    assert resp.status_code == 400, (resp.status_code, resp.content[:300])
    assert resp["Content-Type"].startswith("text/html")


# --- a bad token is a 401, whatever the method ----------------------------------------------------


ROUTES = [
    ("get", "/runs"),
    ("get", "/audit"),
    ("get", "/contracts"),
    ("post", "/runs"),
    ("post", "/runs/00000000-0000-0000-0000-000000000000/claim"),
    ("post", "/runs/00000000-0000-0000-0000-000000000000/interventions"),
    ("post", "/leases/00000000-0000-0000-0000-000000000000/heartbeat"),
]


def _call(client: Client, method: str, path: str, token: str):
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"}
    if method == "get":
        return client.get(f"/api/v1{path}", **headers)
    return client.post(f"/api/v1{path}", "{}", content_type="application/json", **headers)


def _unauthenticated(resp) -> None:
    assert resp.status_code == 401, resp.content
    assert resp.json()["error"] == "unauthenticated"


@pytest.mark.parametrize(("method", "path"), ROUTES)
def test_a_bad_or_revoked_token_is_401_json_on_every_method(worker_token, method, path):
    _unauthenticated(_call(Client(enforce_csrf_checks=True), method, path, "not-a-token"))
    ApiToken.objects.update(revoked_at=timezone.now())
    _unauthenticated(_call(Client(enforce_csrf_checks=True), method, path, worker_token))


@pytest.mark.parametrize(("method", "path"), ROUTES)
def test_a_bad_token_is_401_even_beside_a_logged_in_session(cast, method, path):
    _unauthenticated(_call(browser("ada", enforce_csrf_checks=True), method, path, "bad"))


def test_a_session_post_without_its_csrf_token_is_still_refused(cast):
    ada = browser("ada", enforce_csrf_checks=True)
    resp = ada.post(
        "/api/v1/runs",
        json.dumps({"agent": "purchasing", "goal": "g"}),
        content_type="application/json",
    )
    assert resp.status_code == 403 and resp.json()["error"] == "csrf_failed"
    assert not Run.objects.exists()


def test_an_unroutable_api_path_is_a_json_404_and_a_bad_id_names_itself(worker):
    resp = worker.get("/no-such-thing")
    assert resp.status_code == 404 and resp.json()["error"] == "not_found", resp.content
    refused(worker.get("/runs/not-a-uuid"), "run_id")
