"""Standing freezes and intake holds belong to a team (docs/operator/teams.md): a team's covers its
team's runs only, through the real protocol (declare, claim); every team's (``*``) only under
cross_team, and audited as such; another team's is 404 for a person outside it; a fleet selection
picks the actor's teams' runs only."""

from __future__ import annotations

import pytest

from audit.models import AuditEvent
from core.actors import Actor
from core.errors import NotFound
from interventions.intake import get_hold, release_intake
from runs.models import Team
from tests.conftest import claim, declare, start_run

from .conftest import Teams, made_up

pytestmark = pytest.mark.django_db


def _claimed(two_teams: Teams, worker: str, agent: str) -> tuple[str, int]:
    run = start_run(two_teams.api(worker), agent=agent)
    lease = claim(two_teams.api(worker), run["id"])
    return run["id"], lease["lease"]["fencing_token"]


def _freeze(two_teams: Teams, who: str, **body):
    return two_teams.api(who).post(
        "/fleet/freezes",
        {"capability": "payments:charge", "over": "everything", "reason": "inc"} | body,
    )


def test_a_teams_freeze_blocks_its_runs_declarations_and_not_another_teams(two_teams: Teams):
    pay_run, pay_token = _claimed(two_teams, "w_pay", "pay-agent")
    sup_run, sup_token = _claimed(two_teams, "w_sup", "sup-agent")
    made = _freeze(two_teams, "sam")  # sam's only team: payments
    assert made.status_code == 201, made.content
    assert made.json()["freeze"]["team"] == "payments"
    denied = declare(two_teams.api("w_pay"), pay_run, pay_token, key="t-1")
    assert denied.status_code == 409 and denied.json()["reason"] == "capability_frozen"
    assert "of team payments" in denied.json()["detail"]
    allowed = declare(two_teams.api("w_sup"), sup_run, sup_token, key="t-1")
    assert allowed.status_code == 201, allowed.content
    event = AuditEvent.objects.get(action="capability.standing_freeze", actor="sam")
    assert event.outcome == "allowed" and "cross_team" not in event.context


def test_every_teams_freeze_is_cross_team_only_blocks_both_and_is_audited_so(two_teams: Teams):
    pay_run, pay_token = _claimed(two_teams, "w_pay", "pay-agent")
    sup_run, sup_token = _claimed(two_teams, "w_sup", "sup-agent")
    refused = _freeze(two_teams, "sam", team="*")
    assert refused.status_code == 403 and refused.json()["field"] == "team"
    denied = AuditEvent.objects.get(action="capability.standing_freeze", actor="sam")
    assert denied.outcome == "denied"
    made = _freeze(two_teams, "ian", team="*")
    assert made.status_code == 201 and made.json()["freeze"]["team"] == "*"
    freeze_id = made.json()["freeze"]["id"]
    for worker, run, token in (("w_pay", pay_run, pay_token), ("w_sup", sup_run, sup_token)):
        answer = declare(two_teams.api(worker), run, token, key="g-1")
        assert answer.status_code == 409 and answer.json()["reason"] == "capability_frozen"
    set_ = AuditEvent.objects.get(action="capability.standing_freeze", actor="ian")
    assert set_.context["cross_team"] is True
    # sam sees it (it covers payments' runs) but may not lift it for every team: 403, audited.
    assert two_teams.api("sam").get(f"/fleet/freezes/{freeze_id}").status_code == 200
    lift = two_teams.api("sam").post(f"/fleet/freezes/{freeze_id}/restore", {"reason": "x"})
    assert lift.status_code == 403 and lift.json()["field"] == "team"
    restore = AuditEvent.objects.filter(action="capability.standing_restore")
    assert restore.get(actor="sam").outcome == "denied"
    lift = two_teams.api("ian").post(f"/fleet/freezes/{freeze_id}/restore", {"reason": "over"})
    assert lift.status_code == 200, lift.content
    assert restore.get(actor="ian", outcome="allowed").context["cross_team"] is True
    again = declare(two_teams.api("w_sup"), sup_run, sup_token, key="g-2")
    assert again.status_code == 201, again.content


def test_a_cross_team_person_freezing_for_another_team_is_marked(two_teams: Teams):
    sup_run, sup_token = _claimed(two_teams, "w_sup", "sup-agent")
    made = _freeze(two_teams, "ian", team="support", over="agent", agent="sup-agent")
    assert made.status_code == 201, made.content
    assert declare(two_teams.api("w_sup"), sup_run, sup_token, key="a-1").status_code == 409
    event = AuditEvent.objects.get(action="capability.standing_freeze", actor="ian")
    assert event.context["cross_team"] is True
    # An agent of another team than the freeze's, and a team the person may not see, are refused.
    wrong = _freeze(two_teams, "ian", team="payments", over="agent", agent="sup-agent")
    assert wrong.status_code == 422 and wrong.json()["field"] == "agent"
    hidden = _freeze(two_teams, "sam", team="support")
    absent = _freeze(two_teams, "sam", team="no-such-team")
    assert hidden.status_code == absent.status_code == 422
    assert hidden.json()["field"] == absent.json()["field"] == "team"
    assert hidden.json()["detail"].replace("support", "X") == absent.json()["detail"].replace(
        "no-such-team", "X"
    )


def test_another_teams_freeze_is_404_on_the_api_and_the_console(two_teams: Teams):
    theirs, fake = two_teams.support["freeze_id"], made_up()["freeze_id"]
    sam, sue = two_teams.api("sam"), two_teams.api("sue")
    for freeze in (theirs, fake):
        assert sam.get(f"/fleet/freezes/{freeze}").status_code == 404
        assert sam.post(f"/fleet/freezes/{freeze}/restore/preview").status_code == 404
        lift = sam.post(f"/fleet/freezes/{freeze}/restore", {"reason": "x"})
        assert lift.status_code == 404
        page = two_teams.browser("sam").post(f"/fleet/freezes/{freeze}/restore/preview/")
        assert page.status_code == 404
    assert theirs not in sam.get("/fleet/freezes").content.decode()
    assert theirs in sue.get("/fleet/freezes").content.decode()
    denied = AuditEvent.objects.filter(
        action="capability.standing_restore", actor="sam", object_id=theirs
    )
    assert [e.outcome for e in denied] == ["denied"]
    lift = sue.post(f"/fleet/freezes/{theirs}/restore", {"reason": "done"})
    assert lift.status_code == 200, lift.content
    event = AuditEvent.objects.get(action="capability.standing_restore", actor="sue")
    assert event.outcome == "allowed" and "cross_team" not in event.context


def test_a_teams_hold_holds_its_runs_claims_and_not_another_teams(two_teams: Teams):
    ian = two_teams.api("ian")
    held = ian.post("/intake/holds", {"scope": "all", "team": "payments", "reason": "incident 9"})
    assert held.status_code == 202 and held.json()["team"] == "payments"
    pay = start_run(two_teams.api("w_pay"), agent="pay-agent")
    sup = start_run(two_teams.api("w_sup"), agent="sup-agent")
    refused = two_teams.api("w_pay").post(f"/runs/{pay['id']}/claim", {"worker": "w"})
    assert refused.status_code == 409 and "intake is held" in refused.json()["detail"]
    assert claim(two_teams.api("w_sup"), sup["id"])["lease"]
    work = two_teams.api("w_pay").post("/work/claim", {"worker": "w", "agents": ["pay-agent"]})
    assert pay["id"] not in work.content.decode()
    hold = AuditEvent.objects.get(action="intervention.hold_intake", object_id=held.json()["id"])
    assert "cross_team" not in hold.context  # ian's own team's
    everywhere = ian.post("/intake/holds", {"scope": "all", "team": "*", "reason": "all"})
    assert everywhere.status_code == 202, everywhere.content
    sup2 = start_run(two_teams.api("w_sup"), agent="sup-agent")
    assert (
        two_teams.api("w_sup").post(f"/runs/{sup2['id']}/claim", {"worker": "w"}).status_code == 409
    )
    marked = AuditEvent.objects.get(
        action="intervention.hold_intake", object_id=everywhere.json()["id"]
    )
    assert marked.context["cross_team"] is True
    released = ian.post(f"/intake/holds/{everywhere.json()['id']}/release", {"reason": "over"})
    assert released.status_code == 200, released.content
    event = AuditEvent.objects.get(action="intervention.release_intake", outcome="allowed")
    assert event.context["cross_team"] is True and event.context["team"] == "*"


def test_another_teams_hold_is_404_and_hidden_from_lists(two_teams: Teams):
    theirs, fake = two_teams.support["hold_id"], made_up()["hold_id"]
    for who in ("pia", "sam"):
        state = two_teams.api(who).get("/intake")
        assert state.status_code == 200 and theirs not in state.content.decode()
        assert theirs not in two_teams.browser(who).get("/intake/").content.decode()
    assert theirs in two_teams.api("sol").get("/intake").content.decode()
    # Only cross_team roles hold intake today; a team-scoped person with the right (a role a
    # deployment may grant) meets another team's hold as one that does not exist.
    payments = Team.objects.get(slug="payments").pk
    scoped = Actor(
        kind="user", name="rita", role="incident_commander",
        roles=frozenset({"incident_commander"}), teams=frozenset({payments}),
    )  # fmt: skip
    for hold in (theirs, fake):
        with pytest.raises(NotFound):
            get_hold(hold, scoped)
        with pytest.raises(NotFound):
            release_intake(actor=scoped, hold_id=hold, reason="x")
    refusals = AuditEvent.objects.filter(action="intervention.release_intake", actor="rita")
    assert sorted(e.outcome for e in refusals) == ["denied", "denied"]
    assert {e.context.get("error") or e.reason.split(":")[0] for e in refusals} == {"not_found"}


def test_a_fleet_selection_picks_the_actors_teams_runs_only(two_teams: Teams):
    """interventions/fleet/selection.py reads RunFilter.queryset(actor), which scopes by team."""
    body = {"kind": "cancel", "filter": "agent=sup-agent&agent=pay-agent"}
    mine = {two_teams.payments["run_id"], two_teams.payments["child_id"]}
    pia = two_teams.api("pia").post("/fleet/preview", body)
    assert pia.status_code == 200, pia.content
    picked = {r["id"] for r in pia.json()["runs"]} | {r["id"] for r in pia.json()["excluded_runs"]}
    assert picked <= mine and pia.json()["matched"] == 2
    ian = two_teams.api("ian").post("/fleet/preview", body)
    assert ian.json()["matched"] == 4


def test_metrics_count_runs_by_team_and_state(two_teams: Teams, client):
    from collections import Counter

    from prometheus_client.parser import text_string_to_metric_families

    from runs.models import Run

    body = client.get("/metrics").content.decode()
    samples = {
        (s.labels["team"], s.labels["state"]): s.value
        for family in text_string_to_metric_families(body)
        for s in family.samples
        if s.name == "controlplane_team_runs"
    }
    expected = Counter(
        (team or "default", state) for team, state in Run.objects.values_list("team__slug", "state")
    )
    assert {k: v for k, v in samples.items() if v} == expected
    assert sum(v for (team, _), v in samples.items() if team == "payments") == 2
    assert samples[("default", "queued")] == 0  # every team and state, zeros too
    assert 'controlplane_team_runs{state="running",team="support"}' in body or (
        'controlplane_team_runs{team="support",state="running"}' in body
    )
