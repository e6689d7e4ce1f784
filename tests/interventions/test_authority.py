"""Revoke / suspend / restore authority: denied from the commit on, cascading to delegated grants,
restore only from suspended, and an honest receipt about what a remote system already accepted."""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from audit.models import AuditEvent
from runs.models import AuthorityGrant, HistoryEvent
from tests.conftest import claim, declare, start_run
from tests.interventions.helpers import intervene, running_run

pytestmark = pytest.mark.django_db


def _grant(run_id: str, scope: str) -> AuthorityGrant:
    return AuthorityGrant.objects.get(run_id=run_id, scope=scope)


def _family(worker):
    """A parent run and a child delegated payments:charge from it, both claimed."""
    parent, _ = running_run(worker)
    child = start_run(
        worker,
        parent_run_id=parent["id"],
        goal="verify address",
        authority=[{"scope": "payments:charge", "ttl_s": 600}],
    )
    grandchild = start_run(
        worker,
        parent_run_id=child["id"],
        goal="second opinion",
        authority=[{"scope": "payments:charge", "ttl_s": 600}],
    )
    claim(worker, child["id"], "worker-8")
    return parent, child, grandchild


def test_revoke_denies_new_declarations_and_says_what_cannot_be_recalled(worker, as_user):
    run, _ = running_run(worker)
    rid = run["id"]
    in_flight = declare(worker, rid, 1, key="order-42-charge").json()
    resp = intervene(
        as_user("sam"),
        rid,
        "revoke_authority",
        "card data leak",
        options={"scope": "payments:charge"},
    )
    assert resp.status_code == 202, resp.content
    receipt = resp.json()["receipt"]
    assert [g["scope"] for g in receipt["changed"]] == ["payments:charge"] and receipt["changed"][
        0
    ]["was"] == "active"
    assert "cannot be recalled" in receipt["cannot_recall"]
    assert [e["id"] for e in receipt["in_flight_effects"]] == [in_flight["id"]]
    assert {g["scope"]: g["status"] for g in receipt["authority_before"]}[
        "payments:charge"
    ] == "active"
    assert {g["scope"]: g["status"] for g in receipt["authority_after"]}[
        "payments:charge"
    ] == "revoked"
    denied = declare(worker, rid, 1, key="order-43-charge")
    assert denied.status_code == 409 and denied.json()["reason"] == "authority_revoked"
    # Other scopes are untouched.
    ok = declare(
        worker, rid, 1, key="reserve-1", step="reserve", tool="inventory", action="reserve"
    )
    assert ok.status_code == 201
    # The in-flight charge may still complete, and its outcome is recorded.
    out = worker.post(
        f"/effects/{in_flight['id']}/outcome", {"fencing_token": 1, "status": "committed"}
    )
    assert out.status_code == 200 and out.json()["status"] == "committed"
    audit = AuditEvent.objects.get(action="authority.revoke", run_id=rid)
    assert audit.actor == "sam" and audit.reason == "card data leak"
    assert audit.context["before"] == "active" and audit.context["after"] == "revoked"
    assert {g["scope"]: g["status"] for g in audit.context["authority_after"]}[
        "payments:charge"
    ] == "revoked"
    assert HistoryEvent.objects.filter(run_id=rid, kind="authority_revoked").exists()


def test_revoking_a_parents_grant_revokes_what_children_were_delegated(worker, as_user):
    parent, child, grandchild = _family(worker)
    resp = intervene(
        as_user("sam"),
        parent["id"],
        "revoke_authority",
        "compromised",
        options={"grant_id": str(_grant(parent["id"], "payments:charge").pk)},
    )
    assert resp.status_code == 202, resp.content
    changed = resp.json()["receipt"]["changed"]
    assert [(c["run"], c["cascaded"]) for c in changed] == [
        (parent["id"], False),
        (child["id"], True),
        (grandchild["id"], True),
    ]
    for r in (parent, child, grandchild):
        assert _grant(r["id"], "payments:charge").status == "revoked"
    denied = declare(worker, child["id"], 1, key="child-charge")
    assert denied.status_code == 409 and denied.json()["reason"] == "authority_revoked"
    assert set(
        AuditEvent.objects.filter(action="authority.revoke").values_list("run_id", flat=True)
    ) == {_grant(r["id"], "payments:charge").run_id for r in (parent, child, grandchild)}
    assert HistoryEvent.objects.filter(run_id=child["id"], kind="authority_revoked").exists()


def test_suspend_then_restore_brings_back_what_the_cascade_suspended(worker, as_user):
    parent, child, grandchild = _family(worker)
    sam = as_user("sam")
    # The grandchild's grant was suspended on its own account before the parent's.
    assert (
        intervene(
            sam,
            grandchild["id"],
            "suspend_authority",
            "separate concern",
            options={"scope": "payments:charge"},
        ).status_code
        == 202
    )
    resp = intervene(
        sam, parent["id"], "suspend_authority", "investigating", options={"scope": "payments:*"}
    )
    assert resp.status_code == 202, resp.content
    assert [c["run"] for c in resp.json()["receipt"]["changed"]] == [parent["id"], child["id"]]
    denied = declare(worker, child["id"], 1, key="child-charge")
    assert denied.status_code == 409 and denied.json()["reason"] == "authority_suspended"

    restored = intervene(
        sam, parent["id"], "restore_authority", "all clear", options={"scope": "payments:charge"}
    )
    assert restored.status_code == 202, restored.content
    assert [c["run"] for c in restored.json()["receipt"]["changed"]] == [parent["id"], child["id"]]
    assert (
        _grant(grandchild["id"], "payments:charge").status == "suspended"
    )  # its own suspension stands
    ok = declare(worker, child["id"], 1, key="child-charge-2")
    assert ok.status_code == 201, ok.content
    assert AuditEvent.objects.filter(action="authority.restore", actor="sam").count() == 2


def test_revoked_is_final(worker, as_user):
    run, _ = running_run(worker)
    sam = as_user("sam")
    assert (
        intervene(
            sam, run["id"], "revoke_authority", "x", options={"scope": "payments:charge"}
        ).status_code
        == 202
    )
    again = intervene(
        sam, run["id"], "restore_authority", "undo", options={"scope": "payments:charge"}
    )
    assert again.status_code == 409 and "revoked is final" in again.json()["detail"]
    twice = intervene(sam, run["id"], "revoke_authority", "x", options={"scope": "payments:charge"})
    assert twice.status_code == 409
    assert _grant(run["id"], "payments:charge").status == "revoked"
    assert AuditEvent.objects.filter(
        action="intervention.restore_authority", outcome="denied"
    ).exists()


def test_restoring_a_child_grant_under_a_suspended_parent_is_refused(worker, as_user):
    parent, child, _ = _family(worker)
    sam = as_user("sam")
    intervene(sam, parent["id"], "suspend_authority", "x", options={"scope": "payments:charge"})
    resp = intervene(
        sam,
        child["id"],
        "restore_authority",
        "only the child",
        options={"scope": "payments:charge"},
    )
    assert resp.status_code == 409 and "restore that one first" in resp.json()["detail"]


def test_authority_changes_apply_in_any_state_but_closed(worker, as_user):
    run, _ = running_run(worker)
    otto, sam = as_user("otto"), as_user("sam")
    assert intervene(otto, run["id"], "pause", "hold").status_code == 202
    assert (
        intervene(
            sam, run["id"], "suspend_authority", "x", options={"scope": "inventory:*"}
        ).status_code
        == 202
    )
    done, _ = running_run(worker)
    worker.post(f"/runs/{done['id']}/finish", {"fencing_token": 1, "outcome": "succeeded"})
    assert intervene(otto, done["id"], "close", "done").status_code == 202
    closed = intervene(
        sam, done["id"], "revoke_authority", "x", options={"scope": "payments:charge"}
    )
    assert closed.status_code == 409 and closed.json()["state"] == "closed"


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"scope": "payments:charge", "grant_id": "x"},
        {"scope": "nonsense"},
        {"scope": "shipping:*"},
        {"grant_id": "not-a-uuid"},
    ],
)
def test_authority_options_are_validated(worker, as_user, options):
    run, _ = running_run(worker)
    resp = intervene(as_user("sam"), run["id"], "revoke_authority", "x", options=options)
    assert resp.status_code == 422, resp.content


@pytest.mark.django_db(transaction=True)
def test_two_responders_suspending_one_grant_at_once_exactly_one_applies(
    postgres_only, worker, as_user
):
    run, _ = running_run(worker)
    apis = {"sam": as_user("sam"), "ada": as_user("ada")}
    barrier, results = threading.Barrier(2), {}

    def suspend(name):
        try:
            barrier.wait()
            results[name] = intervene(
                apis[name],
                run["id"],
                "suspend_authority",
                f"{name} saw the alert",
                options={"scope": "payments:charge"},
            )
        finally:
            connection.close()

    threads = [threading.Thread(target=suspend, args=(n,)) for n in apis]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(r.status_code for r in results.values()) == [202, 409], {
        n: r.content for n, r in results.items()
    }
    loser = next(n for n, r in results.items() if r.status_code == 409)
    assert "no grant to suspend" in results[loser].json()["detail"]
    assert AuditEvent.objects.filter(action="authority.suspend").count() == 1
    assert (
        AuditEvent.objects.filter(
            action="intervention.suspend_authority", outcome="denied", actor=loser
        ).count()
        == 1
    )
    assert _grant(run["id"], "payments:charge").status == "suspended"
