"""The audit trail by team (docs/operator/teams.md): a team-limited reader of the whole log (sam, a
payments security responder) reads payments' runs' and objects' events -- fleet operations, standing
freezes, intake holds, agents, worker tokens -- and never support's, in the list, the console page and
the export alike; an event on a made-up id is left out as one on support's (no oracle); an incident
commander (cross_team) reads everything; verification passes for both, naming no break to sam."""

from __future__ import annotations

import json
import uuid

import pytest

from audit.models import AuditEvent

from .conftest import Teams

pytestmark = pytest.mark.django_db


@pytest.fixture
def payments_objects(two_teams: Teams) -> dict[str, str]:
    """Payments' own held fleet operation, standing freeze and intake hold, beside support's."""
    pay = two_teams.payments
    held = two_teams.api("pia").post(
        "/fleet", {"kind": "cancel", "filter": f"id={pay['child_id']}", "reason": "w", "hold": True}
    )
    assert held.status_code == 202, held.content
    freeze = two_teams.api("sam").post(
        "/fleet/freezes", {"capability": "inventory:audit", "over": "everything", "reason": "w"}
    )
    assert freeze.status_code == 201, freeze.content
    hold = two_teams.api("ian").post(
        "/intake/holds", {"scope": "tool", "target": "erp", "team": "payments", "reason": "w"}
    )
    assert hold.status_code == 202, hold.content
    return {
        "operation_id": held.json()["id"],
        "freeze_id": freeze.json()["freeze"]["id"],
        "hold_id": hold.json()["id"],
    }


def support_ids(two_teams: Teams) -> set[str]:
    return {v for k, v in two_teams.support.items() if k.endswith("_id")}


def listed(two_teams: Teams, who: str, query: str = "") -> list[dict]:
    answer = two_teams.api(who).get(f"/audit?limit=1000{query}")
    assert answer.status_code == 200, answer.content
    assert answer.json()["scope"] == "all"  # audit_read_all: the whole log, of their teams
    return answer.json()["events"]


def exported(two_teams: Teams, who: str) -> list[dict]:
    answer = two_teams.browser(who).get("/audit/export.jsonl")
    assert answer.status_code == 200
    return [json.loads(line) for line in b"".join(answer.streaming_content).splitlines()]


def test_a_payments_security_responder_reads_payments_audit_only(two_teams, payments_objects):
    two_teams.browser("sol")  # a sign-in: a person's, of nobody's team
    for events in (listed(two_teams, "sam"), exported(two_teams, "sam")):
        text = json.dumps(events)
        assert not {i for i in support_ids(two_teams) if i in text}
        assert "sup-agent" not in text and "w_sup" not in text
        objects = {(e["object_type"], e["object_id"]) for e in events if not e["run_id"]}
        for kind, key in (
            ("fleet_operation", "operation_id"),
            ("standing_freeze", "freeze_id"),
            ("intake_hold", "hold_id"),
        ):
            assert (kind, payments_objects[key]) in objects  # their own team's: there
            assert (kind, two_teams.support[key]) not in objects
        assert {e["action"] for e in events} >= {"agent.register", "token.issued", "team.created"}
        assert any(e["run_id"] == two_teams.payments["run_id"] for e in events)
        assert any(e["object_type"] == "user" for e in events)  # sign-ins: nobody's team
    page = two_teams.browser("sam").get("/audit/").content.decode()
    assert payments_objects["operation_id"][:8] in page
    assert not {i[:8] for i in support_ids(two_teams) if i[:8] in page}


def test_an_incident_commander_reads_every_teams_audit(two_teams, payments_objects):
    for events in (listed(two_teams, "ian"), exported(two_teams, "ian")):
        text = json.dumps(events)
        keys = ("run_id", "operation_id", "freeze_id", "hold_id")
        assert all(two_teams.support[k] in text for k in keys)
        assert all(v in text for v in payments_objects.values())


def test_another_teams_object_is_absent_by_id_and_its_run_filter_empty(two_teams: Teams):
    sam, support = two_teams.api("sam"), two_teams.support
    for path in (
        f"/fleet/{support['operation_id']}",
        f"/fleet/freezes/{support['freeze_id']}",
    ):
        assert sam.get(path).status_code == 404, path
    release = sam.post(f"/intake/holds/{support['hold_id']}/release/preview", {})
    made_up = sam.post(f"/intake/holds/{uuid.uuid4()}/release/preview", {})
    assert (release.status_code, release.json()) == (made_up.status_code, made_up.json())
    assert listed(two_teams, "sam", f"&run_id={support['run_id']}") == []
    assert listed(two_teams, "ian", f"&run_id={support['run_id']}") != []


def test_refusals_on_support_and_on_made_up_ids_are_left_out_alike(two_teams: Teams):
    """sam's halt of support's operation and of a made-up one are both refused as absent, audited,
    and both left out of sam's trail: it cannot tell one from the other. Support's responder sees
    the refusal on support's operation; the incident commander sees both."""
    sam, real, fake = two_teams.api("sam"), two_teams.support["operation_id"], str(uuid.uuid4())
    for op in (real, fake):
        assert sam.post(f"/fleet/{op}/halt", {"reason": "x"}).status_code == 404
    denied = AuditEvent.objects.filter(action="fleet.halt", outcome=AuditEvent.DENIED)
    assert {e.object_id for e in denied} == {real, fake}

    def seen(who: str) -> set[str]:
        return {e["object_id"] for e in listed(two_teams, who, "&action=fleet.halt")}

    assert seen("sam") == set()
    assert seen("sue") == {real}
    assert seen("ian") == {real, fake}


def test_a_runs_only_reader_never_sees_a_refusal_on_a_made_up_run(two_teams: Teams):
    pia, real, fake = two_teams.api("pia"), two_teams.support["run_id"], str(uuid.uuid4())
    for run in (real, fake):
        answer = pia.post(f"/runs/{run}/interventions", {"kind": "pause", "reason": "x"})
        assert answer.status_code == 404, answer.content
    text = two_teams.api("pia").get("/audit?limit=1000").content.decode()
    assert real not in text and fake not in text
    mine = json.dumps(listed(two_teams, "ian"))
    assert real in mine and fake in mine


def test_verification_passes_for_every_verifier_and_names_no_break_to_a_team(
    two_teams, monkeypatch
):
    for who in ("sam", "ian"):
        answer = two_teams.api(who).get("/audit/verify")
        assert answer.status_code == 200 and answer.json()["ok"], answer.content
        page = two_teams.browser(who).get("/audit/verify/")
        assert page.status_code == 200 and b'data-chain="ok"' in page.content
    assert set(two_teams.api("sam").get("/audit/verify").json()["report"]["chain"]) == {"ok"}

    # A break in support's run chain: named to the incident commander only.
    chain = f"run:{two_teams.support['run_id']}"
    broken = {"ok": False, "chain": {"ok": False, "chain": chain, "first_broken_seq": 2,
                                      "problem": "hash", "detail": "x", "checked": 1, "chains": 1}}  # fmt: skip
    monkeypatch.setattr("audit.integrity.verify_all", lambda anchors: broken)
    sam = two_teams.api("sam").get("/audit/verify").json()
    ian = two_teams.api("ian").get("/audit/verify").json()
    assert not sam["ok"] and two_teams.support["run_id"] not in json.dumps(sam)
    assert sam["answer"] == "Broken: chain: broken (named to cross-team roles)"
    assert two_teams.support["run_id"] in ian["answer"]
    page = two_teams.browser("sam").get("/audit/verify/").content.decode()
    assert 'data-chain="broken"' in page and two_teams.support["run_id"] not in page
