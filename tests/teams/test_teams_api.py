"""/api/v1/teams, the teams service and its command, the cross_team right in the audit, audit reads
and the export by team, and a run's team (its agent's; a child's: its parent's)."""

from __future__ import annotations

import io
import json
import threading

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.db import connection

from audit.models import AuditEvent
from core.errors import Conflict
from runs.models import Agent, ApiToken, Run, TeamMembership
from runs.services import teams
from tests.conftest import start_run

from .conftest import SYSTEM, Teams, person

pytestmark = pytest.mark.django_db


def test_people_see_their_teams_with_counts_and_cross_team_people_every_team(two_teams: Teams):
    mine = two_teams.api("pia").get("/teams").json()
    assert mine == {"teams": [{"slug": "payments", "runs": 2, "member": True}], "cross_team": False}
    every = two_teams.api("ian").get("/teams").json()
    assert every["cross_team"] is True
    assert [(t["slug"], t["runs"], t["member"]) for t in every["teams"]] == [
        ("default", 0, False),
        ("payments", 2, True),
        ("support", 2, False),
    ]
    assert two_teams.api("pia").get("/teams/support").status_code == 404
    assert two_teams.api("pia").get("/teams/payments").json()["members"] == ["ian", "pia", "sam"]
    assert two_teams.api("w_pay").get("/teams").status_code == 403


def test_only_admins_change_teams_and_bad_input_names_the_field(two_teams: Teams):
    two_teams.tokens["ada"] = person("ada", "admin", None)[1]
    ada, pia = two_teams.api("ada"), two_teams.api("pia")
    refused = pia.post("/teams", {"slug": "ops"})
    assert refused.status_code == 403 and "manage_teams" in refused.json()["detail"]
    assert AuditEvent.objects.filter(action="team.create", outcome="denied").count() == 1
    assert pia.post("/teams/support/members", {"username": "pia"}).status_code == 404
    assert pia.post("/teams/payments/members", {"username": "sol"}).status_code == 403
    bad = ada.post("/teams", {"slug": "Not A Slug!"})
    assert bad.status_code == 422 and bad.json()["field"] == "slug"
    missing = ada.post("/teams", {})
    assert missing.status_code == 422 and "slug" in json.dumps(missing.json())
    assert ada.post("/teams", {"slug": "ops"}).status_code == 201
    assert ada.post("/teams", {"slug": "ops"}).status_code == 409
    nobody = ada.post("/teams/ops/members", {"username": "nobody"})
    assert nobody.status_code == 404 and nobody.json()["field"] == "username"
    added = ada.post("/teams/ops/members", {"username": "sol"})
    assert added.status_code == 201 and added.json()["members"] == ["sol"]
    assert ada.post("/teams/ops/members", {"username": "sol"}).status_code == 409
    gone = ada.client.delete("/api/v1/teams/ops/members/sol", **ada.headers)
    assert gone.status_code == 200 and gone.json()["members"] == []
    actions = set(AuditEvent.objects.filter(object_type="team").values_list("action", flat=True))
    assert {"team.created", "team.member_added", "team.member_removed"} <= actions


@pytest.mark.django_db(transaction=True)
def test_two_concurrent_adds_of_one_person_leave_one_membership(two_teams: Teams):
    """The unique (team, user) row is the compare-and-swap: two transactions on two connections add
    the same person at once; one is added, the other refused 409 (and audited), one row."""
    barrier, results = threading.Barrier(2), []

    def add():
        try:
            barrier.wait(timeout=10)
            teams.add_member(actor=SYSTEM, team="support", username="pia")
            results.append("added")
        except Conflict:
            results.append("conflict")
        finally:
            connection.close()

    threads = [threading.Thread(target=add) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert sorted(results) == ["added", "conflict"]
    assert TeamMembership.objects.filter(team__slug="support", user__username="pia").count() == 1
    assert AuditEvent.objects.filter(action="team.add_member", outcome="denied").count() == 1


def test_cross_team_actions_are_marked_in_the_audit(two_teams: Teams):
    ian = two_teams.api("ian")
    theirs, mine = two_teams.support["child_id"], two_teams.payments["child_id"]
    assert (
        ian.post(f"/runs/{theirs}/interventions", {"kind": "cancel", "reason": "inc-7"}).status_code
        == 202
    )
    assert (
        ian.post(f"/runs/{mine}/interventions", {"kind": "cancel", "reason": "inc-7"}).status_code
        == 202
    )
    rows = AuditEvent.objects.filter(actor="ian", run_id__isnull=False)
    marked = {str(e.run_id) for e in rows if e.context.get("cross_team") is True}
    assert marked == {theirs}
    assert all(e.context.get("cross_team") is True for e in rows if str(e.run_id) == theirs)
    # A child started by ian under support's run is support's, whatever its agent's team.
    child = start_run(ian, agent="pay-agent", parent_run_id=two_teams.support["run_id"],
                      authority=[])  # fmt: skip
    assert Run.objects.get(pk=child["id"]).team.slug == "support"
    created = AuditEvent.objects.get(action="run.create", run_id=child["id"])
    assert created.context["cross_team"] is True


def test_audit_reads_and_the_export_are_by_team(two_teams: Teams):
    theirs = two_teams.support["run_id"]
    events = two_teams.api("pia").get("/audit", limit=1000).json()["events"]
    assert events and theirs not in json.dumps(events)
    assert two_teams.payments["run_id"] in json.dumps(events)
    sam = two_teams.browser("sam")
    exported = b"".join(sam.get("/audit/export.jsonl").streaming_content).decode()
    assert two_teams.payments["run_id"] in exported and theirs not in exported
    whole = two_teams.browser("ian")
    assert theirs in b"".join(whole.get("/audit/export.jsonl").streaming_content).decode()


def test_the_command_and_the_team_options(two_teams: Teams):
    out = io.StringIO()
    call_command("teams", "create", "ops", stdout=out)
    call_command("register_agent", "ops-agent", "--scope", "payments:charge", "--team", "ops")
    call_command(
        "create_worker_token", "w-ops", "--team", "ops", "--agent", "ops-agent", stdout=out
    )
    assert Agent.objects.get(name="ops-agent").team.slug == "ops"
    assert ApiToken.objects.get(name="w-ops").team.slug == "ops"
    with pytest.raises(CommandError, match="unknown agent.*of team payments: sup-agent"):
        call_command("create_worker_token", "w-x", "--team", "payments", "--agent", "sup-agent")
    call_command("teams", "add", "ops", "sol", stdout=out)
    call_command("teams", "move-agent", "ops-agent", "support", stdout=out)
    assert Agent.objects.get(name="ops-agent").team.slug == "support"
    call_command("teams", "list", stdout=out)
    assert "ops: members sol; agents -" in out.getvalue()
    with pytest.raises(Exception, match="no team 'nope'"):
        call_command("register_agent", "x-agent", "--scope", "payments:charge", "--team", "nope")
    assert not User.objects.filter(username="x").exists()
    moved = AuditEvent.objects.get(action="agent.team_moved")
    assert moved.context == {"agent": "ops-agent", "before": "ops", "after": "support"}
