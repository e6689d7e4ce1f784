"""Transfer ownership: assignment, execution lease and decision authority are separate facets, moved
together or apart, each with its own record; the current decision authority is honoured by every
owner-bound contract unless an incident commander records an override. Scenario 6 of the run-control
test is here."""

from __future__ import annotations

import threading

import pytest
from django.db import connection
from django.test import Client

from audit.models import AuditEvent
from audit.services import verify_chain
from interventions.models import Intervention
from runs.models import ApiToken, HistoryEvent, Run
from runs.selectors import verify_history
from tests.conftest import Api, claim, declare, start_run
from tests.interventions.helpers import commit, intervene, running_run

pytestmark = pytest.mark.django_db


def _transfer(api, run_id, facets, reason="taking over", override_reason="", **options):
    body = {"options": {"facets": facets, **options}}
    if override_reason:
        body["override_reason"] = override_reason
    return intervene(api, run_id, "transfer", reason, **body)


def test_it_handles_scenario_6_transfer_under_pressure(worker, as_user):
    otto, olga, ian, sam = (as_user(n) for n in ("otto", "olga", "ian", "sam"))
    run, c = running_run(worker)
    rid, lease_id = run["id"], c["lease"]["id"]
    commit(
        worker,
        rid,
        1,
        "order-42-reserve",
        step="reserve",
        tool="inventory",
        action="reserve",
        args={"sku": "sku-1"},
    )
    charge = declare(worker, rid, 1).json()  # dispatched, no outcome yet: unresolved at handoff
    approval = worker.post(
        f"/runs/{rid}/approvals",
        {
            "fencing_token": 1,
            "tool": "inventory",
            "action": "reserve",
            "args": {"sku": "sku-9", "qty": 500},
            "reason": "bulk order",
        },
    ).json()

    # 1. The on-call operator takes the run from the agent's lane: no owner yet, so no override needed.
    took = _transfer(
        otto,
        rid,
        ["assignment", "decision_authority"],
        to="otto",
        reason="paged: charge looks stuck",
    )
    assert took.status_code == 202, took.content
    r1 = took.json()["receipt"]
    assert r1["facets_moved"] == ["assignment", "decision_authority"] and r1["override"] is False
    assert [(m["facet"], m["from"], m["to"]) for m in r1["records"]] == [
        ("assignment", "agent lane (no human owner)", "otto"),
        ("decision_authority", "agent lane (no human owner)", "otto"),
    ]

    # 2. Meanwhile the security responder revokes the payments grant (not owner-bound).
    revoked = intervene(
        sam,
        rid,
        "revoke_authority",
        "card processor compromise suspected",
        options={"scope": "payments:charge"},
    )
    assert revoked.status_code == 202, revoked.content
    rr = revoked.json()["receipt"]
    assert [e["idempotency_key"] for e in rr["in_flight_effects"]] == ["order-42-charge"]
    assert "cannot be recalled" in rr["cannot_recall"]

    # 3. otto holds decision authority; the incident commander hands it to a specialist by override.
    handed = _transfer(
        ian,
        rid,
        ["decision_authority"],
        to="olga",
        reason="payments specialist takes the call",
        override_reason="otto is off shift in 5 minutes",
    )
    assert handed.status_code == 202, handed.content
    body = handed.json()
    r2 = body["receipt"]
    assert (
        body["override"] is True and r2["overriding_actor"] == "ian" and r2["overridden"] == "otto"
    )
    assert (
        r2["override_reason"] == "otto is off shift in 5 minutes"
        and r2["reason"] == "payments specialist takes the call"
    )
    assert r2["facets_moved"] == ["decision_authority"]
    assert r2["records"] == [
        {
            "facet": "decision_authority",
            "from": "otto",
            "to": "olga",
            "by": "ian",
            "override": True,
            "reason": "payments specialist takes the call",
            "override_reason": "otto is off shift in 5 minutes",
        }
    ]
    # Separate facets: assignment stays with otto, the lease with the worker.
    assert r2["after"]["assignment"] == "otto" and r2["after"]["decision_authority"] == "olga"
    assert (
        r2["after"]["execution_lease"]["worker"] == "worker-7"
        and r2["after"]["execution_lease"]["live"] is True
    )
    # Unresolved effects, pending decisions and the authority handed over, as at the handoff.
    assert [e["id"] for e in r2["unresolved_effects"]] == [charge["id"]]
    assert [a["id"] for a in r2["pending_approvals"]] == [approval["id"]]
    assert {g["scope"] for g in r2["authority_handed_over"]} == {
        "inventory:*"
    }  # payments:charge was revoked
    who = r2["who_may_now"]
    assert who["resume"]["may_act"] == ["olga"] and who["cancel"]["may_act"] == ["olga"]
    assert who["close"]["decision_authority"] == "olga"
    assert who["compensate"]["may_act"] == []  # an operator may not compensate: only by override
    assert any("incident_commander" in r for r in who["compensate"]["by_override"])

    # 4. The former owner's conflicting actions are refused and audited.
    for kind in ("cancel", "resume"):
        refused = intervene(otto, rid, kind, "I still think I own this")
        assert refused.status_code == 403 and refused.json()["error"] == "not_decision_authority", (
            refused.content
        )
        assert refused.json()["decision_authority"] == "olga"
        assert AuditEvent.objects.filter(
            action=f"intervention.{kind}", actor="otto", outcome="denied", run_id=rid
        ).exists()
    assert Run.objects.get(pk=rid).state == "awaiting_approval"

    # 5. Execution lease is its own facet: refused while the worker holds a live lease.
    busy = _transfer(
        olga, rid, ["execution_lease"], to_worker="worker-9", reason="move to the payments pool"
    )
    assert busy.status_code == 409 and "pause" in busy.json()["detail"]
    assert intervene(olga, rid, "pause", "hand execution to the payments pool").status_code == 202
    worker.post(f"/effects/{charge['id']}/outcome", {"fencing_token": 1, "status": "unknown"})
    assert (
        worker.post(f"/leases/{lease_id}/release", {"fencing_token": 1}).json()["state"] == "paused"
    )
    moved = _transfer(
        olga, rid, ["execution_lease"], to_worker="worker-9", reason="move to the payments pool"
    )
    assert moved.status_code == 202, moved.content
    r3 = moved.json()["receipt"]
    assert r3["records"][0]["facet"] == "execution_lease" and r3["records"][0]["to"] == {
        "pinned_to": "worker-9"
    }
    assert r3["records"][0]["from"]["worker"] == "worker-7" and r3["overriding_actor"] is None
    assert Run.objects.get(pk=rid).execution_pin == "worker-9"

    # Separate records per facet, in history and audit.
    facets = [
        h.data["facet"]
        for h in HistoryEvent.objects.filter(run_id=rid, kind="ownership_transferred").order_by(
            "seq"
        )
    ]
    assert facets == ["assignment", "decision_authority", "decision_authority", "execution_lease"]
    audits = AuditEvent.objects.filter(action="ownership.transferred", run_id=rid).order_by("seq")
    assert [(a.actor, a.context["facet"], a.context["override"]) for a in audits] == [
        ("otto", "assignment", False),
        ("otto", "decision_authority", False),
        ("ian", "decision_authority", True),
        ("olga", "execution_lease", False),
    ]
    assert AuditEvent.objects.filter(
        action="intervention.transfer",
        run_id=rid,
        actor="ian",
        context__override=True,
        context__overridden="otto",
    ).exists()
    final = Run.objects.select_related("assignee", "decision_authority").get(pk=rid)
    assert (final.assignee.username, final.decision_authority.username) == ("otto", "olga")
    assert verify_history(final)["ok"] and verify_chain().ok


def test_current_decision_authority_hands_over_without_override(worker, as_user):
    otto, olga = as_user("otto"), as_user("olga")
    run = start_run(worker)
    assert _transfer(otto, run["id"], ["decision_authority"], to="otto").status_code == 202
    resp = _transfer(otto, run["id"], ["decision_authority"], to="olga", reason="end of shift")
    assert resp.status_code == 202, resp.content
    assert resp.json()["override"] is False and resp.json()["receipt"]["overriding_actor"] is None
    assert intervene(olga, run["id"], "cancel", "no longer needed").status_code == 202


def test_a_non_owner_needs_an_override_by_a_permitted_role(worker, as_user):
    otto, olga, ian = as_user("otto"), as_user("olga"), as_user("ian")
    run = start_run(worker)
    _transfer(otto, run["id"], ["assignment", "decision_authority"], to="otto")
    grab = _transfer(olga, run["id"], ["decision_authority"], to="olga")
    assert grab.status_code == 403 and grab.json()["error"] == "not_decision_authority"
    grab = _transfer(
        olga, run["id"], ["decision_authority"], to="olga", override_reason="I know better"
    )
    assert (
        grab.status_code == 403 and grab.json()["error"] == "not_decision_authority"
    )  # operators may not override
    assert (
        AuditEvent.objects.filter(
            action="intervention.transfer", actor="olga", outcome="denied"
        ).count()
        == 2
    )
    silent = _transfer(ian, run["id"], ["decision_authority"], to="ian")
    assert silent.status_code == 403  # even the incident commander must say why
    assert (
        _transfer(
            ian, run["id"], ["decision_authority"], to="ian", override_reason="incident 77"
        ).status_code
        == 202
    )


def test_execution_lease_transfer_pins_the_next_claim(worker, as_user):
    otto = as_user("otto")
    run = start_run(worker)
    resp = _transfer(
        otto,
        run["id"],
        ["execution_lease"],
        to_worker="worker-9",
        reason="only the EU pool may run it",
    )
    assert resp.status_code == 202, resp.content
    assert (
        resp.json()["receipt"]["execution_note"]
        == "only worker 'worker-9' may claim the next attempt"
    )
    wrong = worker.post(f"/runs/{run['id']}/claim", {"worker": "worker-7"})
    assert wrong.status_code == 409 and wrong.json()["error"] == "not_claimable"
    # Naming the pinned worker is not being it: another token is refused (issue 19).
    impostor = worker.post(f"/runs/{run['id']}/claim", {"worker": "worker-9"})
    assert impostor.status_code == 409 and impostor.json()["error"] == "not_claimable"
    _, secret = ApiToken.issue(kind=ApiToken.WORKER, name="worker-9", agents=["purchasing"])
    pinned = Api(Client(), secret)
    assert claim(pinned, run["id"], "worker-9")["attempt"]["number"] == 1


def test_transfer_is_refused_on_a_closed_run(worker, as_user):
    otto = as_user("otto")
    run, c = running_run(worker)
    assert (
        worker.post(
            f"/runs/{run['id']}/finish", {"fencing_token": 1, "outcome": "succeeded"}
        ).status_code
        == 200
    )
    assert intervene(otto, run["id"], "close", "done").status_code == 202
    resp = _transfer(otto, run["id"], ["assignment"], to="otto")
    assert resp.status_code == 409 and resp.json()["state"] == "closed"
    assert not Intervention.objects.filter(run_id=run["id"], kind="transfer").exists()
    assert AuditEvent.objects.filter(
        action="intervention.transfer", outcome="denied", run_id=run["id"]
    ).exists()


@pytest.mark.parametrize(
    "options, field",
    [
        ({"facets": []}, "options.facets"),
        ({"facets": ["everything"]}, "options.facets"),
        ({"facets": ["assignment"]}, "options.to"),
        ({"facets": ["assignment"], "to": "nobody"}, "options.to"),
        (
            {"facets": ["decision_authority"], "to": "vera"},
            "options.to",
        ),  # a viewer cannot hold decision authority
        ({"facets": ["execution_lease"]}, "options.to_worker"),
    ],
)
def test_transfer_options_are_validated(worker, as_user, options, field):
    run = start_run(worker)
    resp = intervene(as_user("otto"), run["id"], "transfer", "bad input", options=options)
    assert resp.status_code == 422 and resp.json()["field"] == field, resp.content


def test_transfer_to_the_current_holder_is_a_conflict(worker, as_user):
    otto = as_user("otto")
    run = start_run(worker)
    _transfer(otto, run["id"], ["assignment"], to="otto")
    again = _transfer(otto, run["id"], ["assignment"], to="otto")
    assert again.status_code == 409 and "nothing to transfer" in again.json()["detail"]


def test_preview_names_facets_and_blockers_without_changing_anything(worker, as_user):
    run, _ = running_run(worker)
    resp = as_user("otto").post(
        f"/runs/{run['id']}/interventions/preview",
        {
            "kind": "transfer",
            "reason": "x",
            "options": {
                "facets": ["decision_authority", "execution_lease"],
                "to": "olga",
                "to_worker": "worker-9",
            },
        },
    )
    assert resp.status_code == 200, resp.content
    body = resp.json()
    assert body["current"]["decision_authority"] == "agent lane (no human owner)"
    assert body["proposed"] == {
        "assignment": None,
        "decision_authority": "olga",
        "execution_lease": "worker-9",
    }
    assert any("pause the run first" in b for b in body["blocked_by"])
    assert Run.objects.get(pk=run["id"]).decision_authority_id is None


@pytest.mark.django_db(transaction=True)
def test_two_operators_taking_an_unowned_run_at_once_exactly_one_wins(
    postgres_only, worker, as_user
):
    run = start_run(worker)
    apis = {"otto": as_user("otto"), "olga": as_user("olga")}
    barrier, results = threading.Barrier(2), {}

    def take(name):
        try:
            barrier.wait()
            results[name] = _transfer(
                apis[name], run["id"], ["decision_authority"], to=name, reason="mine"
            )
        finally:
            connection.close()

    threads = [threading.Thread(target=take, args=(n,)) for n in apis]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    codes = sorted(r.status_code for r in results.values())
    assert codes == [202, 403], {n: r.content for n, r in results.items()}
    loser = next(n for n, r in results.items() if r.status_code == 403)
    winner = next(n for n in apis if n != loser)
    assert results[loser].json() == {
        **results[loser].json(),
        "error": "not_decision_authority",
        "decision_authority": winner,
    }
    assert Run.objects.get(pk=run["id"]).decision_authority.username == winner
    assert (
        AuditEvent.objects.filter(
            action="intervention.transfer", actor=winner, outcome="allowed"
        ).count()
        == 1
    )
    assert (
        AuditEvent.objects.filter(
            action="intervention.transfer", actor=loser, outcome="denied"
        ).count()
        == 1
    )
