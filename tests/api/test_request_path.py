"""The protocol's request path remembers what never changes: an effect's run (learnt from its
declaration) and a lease's run, so an outcome or heartbeat asks the database only for its decision."""

from __future__ import annotations

import uuid

import pytest

import api.runs
from tests.conftest import claim, declare, start_run

pytestmark = pytest.mark.django_db


def _no_lookup(key):
    raise AssertionError(f"looked up {key} again")


def test_an_outcome_after_its_declaration_needs_no_run_lookup(worker, monkeypatch):
    run = start_run(worker)
    token = claim(worker, run["id"])["lease"]["fencing_token"]
    effect = declare(worker, run["id"], token).json()
    monkeypatch.setattr(api.runs._effect_run, "lookup", _no_lookup)
    body = {"fencing_token": token, "status": "committed"}
    resp = worker.post(f"/effects/{effect['id']}/outcome", body)
    assert resp.status_code == 200 and resp.json()["status"] == "committed"


def test_an_effect_declared_elsewhere_is_looked_up_and_a_missing_one_is_404(worker):
    run = start_run(worker)
    token = claim(worker, run["id"])["lease"]["fencing_token"]
    effect = declare(worker, run["id"], token).json()
    api.runs._effect_run.known.clear()  # as if another server process had declared it
    body = {"fencing_token": token, "status": "committed"}
    assert worker.post(f"/effects/{effect['id']}/outcome", body).status_code == 200
    assert api.runs._effect_run.known[effect["id"]] == uuid.UUID(run["id"])
    missing = worker.post(f"/effects/{uuid.uuid4()}/outcome", body)
    assert missing.status_code == 404 and missing.json()["error"] == "not_found"


def test_the_scope_check_still_holds_for_a_remembered_effect(worker, cast, client):
    """A worker token scoped to another agent learns nothing of a remembered effect: 404."""
    from runs.models import Agent, ApiToken
    from tests.conftest import Api

    run = start_run(worker)
    token = claim(worker, run["id"])["lease"]["fencing_token"]
    effect = declare(worker, run["id"], token).json()
    Agent.objects.create(name="other", allowed_scopes=["x:*"])
    _, secret = ApiToken.issue(kind=ApiToken.WORKER, name="other-worker", agents=["other"])
    body = {"fencing_token": token, "status": "committed"}
    resp = Api(client, secret).post(f"/effects/{effect['id']}/outcome", body)
    assert resp.status_code == 404


def test_a_lease_run_is_remembered(worker, monkeypatch):
    run = start_run(worker)
    lease = claim(worker, run["id"])["lease"]
    body = {"fencing_token": lease["fencing_token"], "reason": "done"}
    monkeypatch.setattr(api.runs._lease_run, "lookup", _no_lookup)
    api.runs._lease_run.remember(lease["id"], uuid.UUID(run["id"]))
    assert worker.post(f"/leases/{lease['id']}/release", body).status_code == 200


def test_the_body_depth_guard_walks_only_bodies_with_many_brackets():
    """The byte-by-byte depth walk runs only when the brackets could nest past the limit; the answer
    is the same either way."""
    from django.test import RequestFactory

    from api.parser import MAX_BODY_DEPTH, BodyRefused, StrictJsonParser

    def parse(text: str):
        return StrictJsonParser().parse_body(RequestFactory().post("/", text, "application/json"))

    many_flat = '{"a": [' + ", ".join(["[]"] * (MAX_BODY_DEPTH + 5)) + "]}"
    assert len(parse(many_flat)["a"]) == MAX_BODY_DEPTH + 5
    in_strings = '{"a": "' + "[" * (MAX_BODY_DEPTH + 5) + '"}'
    assert parse(in_strings)["a"].startswith("[[")
    limit = '{"a": ' + "[" * (MAX_BODY_DEPTH - 1) + "]" * (MAX_BODY_DEPTH - 1) + "}"
    assert parse(limit)
    too_deep = '{"a": ' + "[" * MAX_BODY_DEPTH + "]" * MAX_BODY_DEPTH + "}"
    with pytest.raises(BodyRefused, match="nests deeper"):
        parse(too_deep)
