"""The whole permission matrix, through the API: every intervention kind x every role x worker.

A role the matrix does not list is refused 403 ``forbidden`` and the denial is audited; a listed role
is never refused for its role (it may still meet 409/422 because of the run's state or options). The
current decision authority is honoured by every owner-bound kind unless an override is recorded."""

from __future__ import annotations

import pytest

from audit.models import AuditEvent
from core.roles import PERMISSIONS, ROLES
from interventions.models import Intervention
from interventions.plugins import FLEET_REGISTRY, REGISTRY
from tests.conftest import ROLE_USERS
from tests.interventions.helpers import intervene, running_run

pytestmark = pytest.mark.django_db

NOT_INTERVENTIONS = {
    "view",
    "override",
    "override_revalidation",
    "start_run",
    "audit_export",
    "audit_verify",
    "manage_channels",  # notification channels (notifications/): an admin right, not a contract
    "manage_approval_policies",  # an agent's approval policies (api/agents.py): admin, not a contract
    "audit_read_all",
    "fleet",
    "take_command",
    "cross_team",  # teams (docs/operator/teams.md): act on any team's runs
    "manage_teams",  # teams: an admin right, not a contract
}
# Contracts over a scope of the fleet, not a run: their matrix is tests/interventions/test_intake.py's.
KINDS = sorted(set(PERMISSIONS) - NOT_INTERVENTIONS - set(FLEET_REGISTRY))
OWNER_BOUND = {kind for kind, c in REGISTRY.items() if c.owner_bound}
USER_OF_ROLE = {
    role: name for name, role in reversed(list(ROLE_USERS.items()))
}  # otto for operator


def test_the_matrix_covers_every_intervention_kind():
    assert set(KINDS) == {
        "pause",
        "resume",
        "cancel",
        "terminate",
        "retry",
        "compensate",
        "transfer",
        "recover",
        "reconcile",
        "close",
        "approve",
        "reject",
        "revoke_authority",
        "suspend_authority",
        "restore_authority",
        "freeze_capability",
        "restore_capability",
        "redrive",
    }
    assert set(FLEET_REGISTRY) == {
        "hold_intake",
        "release_intake",
        "standing_freeze",
        "standing_restore",
    }
    assert set(USER_OF_ROLE) == set(ROLES)


def _registered(kind: str) -> None:
    if kind not in REGISTRY:
        pytest.skip(f"contract {kind!r} is not registered yet")


def _options(kind: str, approval_id: str, username: str) -> dict:
    if kind in ("approve", "reject"):
        return {"approval_id": approval_id}
    if kind == "transfer":
        return {"facets": ["assignment"], "to": username}
    if kind.endswith(("_authority", "_capability")):
        return {"scope": "inventory:*"}
    return {}


@pytest.fixture
def awaiting(worker):
    """A run waiting at a planned approval boundary: most kinds apply, or are refused by state."""
    run, _ = running_run(worker)
    resp = worker.post(
        f"/runs/{run['id']}/approvals",
        {"fencing_token": 1, "tool": "payments", "action": "charge", "args": {"amount": 5000}},
    )
    assert resp.status_code == 201, resp.content
    return run["id"], resp.json()["id"]


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_for_every_role(kind, role, awaiting, as_user):
    _registered(kind)
    run_id, approval_id = awaiting
    username = USER_OF_ROLE[role]
    resp = intervene(
        as_user(username),
        run_id,
        kind,
        f"{username} tries {kind}",
        options=_options(kind, approval_id, username),
    )
    if role in PERMISSIONS[kind]:
        assert resp.status_code != 403 or resp.json()["error"] != "forbidden", resp.content
        # A security responder may decide approvals (a multi-party step may name the role), but not
        # this approver-level one: the approval's own required role refuses, naming the role.
        refused_by_step = (
            resp.status_code == 403 and resp.json()["error"] == "approval_role_required"
        )
        assert resp.status_code in (202, 409, 422) or refused_by_step, resp.content
    else:
        assert resp.status_code == 403 and resp.json()["error"] == "forbidden", resp.content
        assert AuditEvent.objects.filter(
            action=f"intervention.{kind}", actor=username, outcome="denied", run_id=run_id
        ).exists()
        assert not Intervention.objects.filter(run_id=run_id, kind=kind).exists()


@pytest.mark.parametrize("kind", KINDS)
def test_a_worker_token_can_never_intervene(kind, awaiting, worker):
    _registered(kind)
    run_id, approval_id = awaiting
    resp = intervene(
        worker, run_id, kind, "the agent wants out", options=_options(kind, approval_id, "otto")
    )
    assert resp.status_code == 403 and resp.json()["error"] == "forbidden", resp.content
    preview = worker.post(f"/runs/{run_id}/interventions/preview", {"kind": kind, "reason": "x"})
    assert preview.status_code == 403
    assert not Intervention.objects.filter(run_id=run_id).exists()


@pytest.mark.parametrize("kind", sorted(OWNER_BOUND & set(KINDS)))
def test_owner_bound_kinds_honour_the_decision_authority(kind, awaiting, as_user):
    _registered(kind)
    run_id, approval_id = awaiting
    took = intervene(
        as_user("olga"),
        run_id,
        "transfer",
        "taking it",
        options={"facets": ["decision_authority"], "to": "olga"},
    )
    assert took.status_code == 202, took.content
    # otto (operator) and ian (incident commander, no override) are not the decision authority.
    for name in ("otto", "ian"):
        if not set(PERMISSIONS[kind]) & {ROLE_USERS[name]}:
            continue
        resp = intervene(
            as_user(name), run_id, kind, "not mine", options=_options(kind, approval_id, name)
        )
        assert resp.status_code == 403 and resp.json()["error"] == "not_decision_authority", (
            resp.content
        )
        assert resp.json()["decision_authority"] == "olga"
        assert AuditEvent.objects.filter(
            action=f"intervention.{kind}",
            actor=name,
            outcome="denied",
            reason__startswith="not_decision_authority",
        ).exists()
    # With a recorded override by a permitted role the owner check is passed (state may still refuse).
    if "incident_commander" in PERMISSIONS[kind]:
        resp = intervene(
            as_user("ian"),
            run_id,
            kind,
            "incident 77",
            options=_options(kind, approval_id, "ian"),
            override_reason="incident commander takes command",
        )
        assert resp.status_code != 403, resp.content


@pytest.mark.parametrize("kind", sorted(set(KINDS) - OWNER_BOUND))
def test_kinds_not_bound_to_the_owner_do_not_need_an_override(kind, awaiting, as_user):
    _registered(kind)
    run_id, approval_id = awaiting
    intervene(
        as_user("olga"),
        run_id,
        "transfer",
        "taking it",
        options={"facets": ["decision_authority"], "to": "olga"},
    )
    role = sorted(PERMISSIONS[kind] - {"admin"})[0]
    name = USER_OF_ROLE[role]
    resp = intervene(
        as_user(name), run_id, kind, "emergency", options=_options(kind, approval_id, name)
    )
    assert resp.status_code != 403, resp.content
