"""Look-alike tool and action names (core.names): refused at the edge with a 422 naming the field,
so grants, policies, freezes and the ledger only ever compare canonical names. Under a wildcard
grant each of these used to be authorised past ``payments:charge amount>200`` and a live freeze."""

from __future__ import annotations

import pytest

from core.actors import system_actor
from core.errors import Invalid
from core.names import canonical_name, name_problem
from runs.models import Effect
from runs.services.agents import register_agent, set_approval_policies
from tests.conftest import claim, declare, start_run
from tests.interventions.helpers import intervene

pytestmark = pytest.mark.django_db

LOOKALIKES = [
    "CHARGE",
    "Charge",
    "charge ",
    "charge\t",
    " charge",
    "char\u200bge",  # zero-width space
    "charge\u200d",  # zero-width joiner
    "ch\u0430rge",  # Cyrillic а
    "ｃｈａｒｇｅ",  # fullwidth: NFKC makes it "charge"
    "charge\u00a0",  # no-break space
    "charge\n",
]


@pytest.fixture
def guarded(worker, agent, as_user):
    """A run holding payments:* under an amount>200 policy, with payments:charge frozen."""
    agent.allowed_scopes = [*agent.allowed_scopes, "payments:*"]
    agent.save()
    set_approval_policies(
        actor=system_actor("test"), agent="purchasing", approvals=["payments:charge amount>200"]
    )
    run = start_run(worker, authority=[{"scope": "payments:*", "ttl_s": 600}])
    claim(worker, run["id"])
    frozen = intervene(
        as_user("sam"), run["id"], "freeze_capability", options={"scope": "payments:charge"}
    )
    assert frozen.status_code == 202, frozen.content
    return run


@pytest.mark.parametrize("action", LOOKALIKES)
def test_a_lookalike_action_is_refused_naming_the_field(worker, guarded, action):
    resp = declare(worker, guarded["id"], 1, key="k", action=action, args={"amount": 300})
    assert resp.status_code == 422, resp.content
    assert resp.json()["field"] == "action", resp.json()
    assert not Effect.objects.filter(decision=Effect.AUTHORIZED).exists()


@pytest.mark.parametrize("tool", ["Payments", "payments ", "pay\u200bments", "p\u0430yments"])
def test_a_lookalike_tool_is_refused_everywhere_a_worker_names_one(worker, guarded, tool):
    resp = declare(worker, guarded["id"], 1, key="k", tool=tool, args={"amount": 300})
    assert resp.status_code == 422 and resp.json()["field"] == "tool", resp.content
    comp = declare(
        worker, guarded["id"], 1, key="k2", compensation={"tool": tool, "action": "refund"}
    )
    assert comp.status_code == 422 and comp.json()["field"] == "compensation.tool", comp.content
    appr = worker.post(
        f"/runs/{guarded['id']}/approvals", {"fencing_token": 1, "tool": tool, "action": "charge"}
    )
    assert appr.status_code == 422 and appr.json()["field"] == "tool", appr.content
    grant = worker.post(
        "/runs", {"agent": "purchasing", "goal": "g", "authority": [{"scope": f"{tool}:charge"}]}
    )
    assert grant.status_code == 422 and grant.json()["field"] == "authority.0.scope", grant.content


def test_the_canonical_name_is_still_held_by_the_freeze(worker, guarded):
    resp = declare(worker, guarded["id"], 1, key="k", args={"amount": 300})
    assert resp.json()["reason"] == "capability_frozen", resp.content


def test_a_lookalike_freeze_or_revoke_scope_is_refused(worker, guarded, as_user):
    for kind in ("freeze_capability", "revoke_authority"):
        resp = intervene(as_user("sam"), guarded["id"], kind, options={"scope": "payments:Charge"})
        assert resp.status_code == 422 and resp.json()["field"] == "options.scope", resp.content


def test_agents_and_policies_take_only_canonical_names(db):
    actor = system_actor("test")
    for bad in ["Purchasing", "purchasing agent", "buy\u200ber", "../x"]:
        with pytest.raises(Invalid) as err:
            register_agent(actor=actor, name=bad, scopes=[])
        assert err.value.extra["field"] == "name"
    with pytest.raises(Invalid):
        register_agent(actor=actor, name="buyer", scopes=["payments:CHARGE"])
    register_agent(actor=actor, name="buyer", scopes=["payments:charge"])
    with pytest.raises(Invalid):
        set_approval_policies(actor=actor, agent="buyer", approvals=["payments:Charge amount>200"])


def test_the_refusal_says_what_was_probably_meant():
    assert "did you mean 'charge'" in name_problem("Charge")
    assert "did you mean 'charge'" in name_problem("ｃｈａｒｇｅ")
    assert "U+200B" in name_problem("char\u200bge")
    assert "U+0430" in name_problem("ch\u0430rge") and "did you mean" not in name_problem(
        "ch\u0430rge"
    )
    assert canonical_name("Char\u200bge\t") == "charge" and name_problem("void_key.v2-x") is None
