"""Every API operation, read from the ninja router (so a new one cannot be forgotten), called by
payments' person and payments' worker token on support's objects: the answer equals the answer for
an id nobody ever used -- 404 / 403 / 405 / 422 exactly alike -- and nothing support owns shows in
any answer (docs/operator/teams.md)."""

from __future__ import annotations

import json

import pytest

from api.app import api as ninja_api

from .conftest import Teams, made_up

pytestmark = pytest.mark.django_db

# Operations on nothing a team owns, each with why it is not walked.
NOT_TEAM_OWNED = {
    "/api/v1/contracts": "the contracts document: the same for everyone",
    "/api/v1/audit/verify": "walks every chain; audit_verify right only (no team's object named)",
    "/api/v1/channels": "notification channels: admin-only configuration, not a team's",
    "/api/v1/channels/{channel_id}": "notification channels: admin-only",
    "/api/v1/channels/{channel_id}/test": "notification channels: admin-only",
    "/api/v1/teams": "tests/teams/test_teams_api.py",
    "/api/v1/teams/{slug}": "tests/teams/test_teams_api.py",
    "/api/v1/teams/{slug}/members": "tests/teams/test_teams_api.py",
    "/api/v1/teams/{slug}/members/{username}": "tests/teams/test_teams_api.py",
}

TOKEN = 1  # any fencing token: the answer must not depend on knowing the real one
BODIES = {
    "/api/v1/runs": {
        "agent": "{agent}",
        "goal": "g",
        "input": {},
        "versions": {"code": "1"},
    },
    "/api/v1/runs/{run_id}/effects": {
        "fencing_token": TOKEN,
        "step": "s",
        "tool": "payments",
        "action": "charge",
        "idempotency_key": "walk-1",
        "args": {"amount": 1},
    },
    "/api/v1/runs/{run_id}/claim": {"worker": "walker"},
    "/api/v1/leases/{lease_id}/heartbeat": {"fencing_token": TOKEN},
    "/api/v1/leases/{lease_id}/release": {"fencing_token": TOKEN, "reason": "walk"},
    "/api/v1/effects/{effect_id}/outcome": {"fencing_token": TOKEN, "status": "committed"},
    "/api/v1/runs/{run_id}/checkpoints": {"fencing_token": TOKEN, "step": "s", "state": {}},
    "/api/v1/runs/{run_id}/events": {"fencing_token": TOKEN, "events": [{"kind": "note"}]},
    "/api/v1/runs/{run_id}/approvals": {
        "fencing_token": TOKEN,
        "tool": "payments",
        "action": "refund",
        "args": {},
    },
    "/api/v1/runs/{run_id}/finish": {"fencing_token": TOKEN, "outcome": "succeeded"},
    "/api/v1/runs/{run_id}/interventions/preview": {"kind": "cancel", "reason": "walk"},
    "/api/v1/runs/{run_id}/interventions": {"kind": "cancel", "reason": "walk"},
    "/api/v1/effects/{effect_id}/reconcile": {
        "outcome": "committed",
        "evidence": "walk",
        "reason": "walk",
    },
    "/api/v1/work/claim": {"worker": "walker", "agents": ["{agent}"]},
    "/api/v1/fleet/preview": {"kind": "cancel", "filter": "id={run_id}"},
    "/api/v1/fleet": {"kind": "cancel", "filter": "id={run_id}", "reason": "walk"},
    "/api/v1/fleet/{operation_id}/halt": {"reason": "walk"},
    "/api/v1/fleet/{operation_id}/cancel": {"reason": "walk"},
    # Standing freezes and intake holds: over the other team's agent, and on its freeze or hold.
    "/api/v1/fleet/freezes/preview": {"capability": "payments:charge", "over": "agent",
                                      "agent": "{agent}"},
    "/api/v1/fleet/freezes": {"capability": "payments:charge", "over": "agent",
                              "agent": "{agent}", "reason": "walk"},
    "/api/v1/fleet/freezes/{freeze_id}/restore": {"reason": "walk"},
    "/api/v1/intake/holds/preview": {"scope": "agent", "target": "{agent}"},
    "/api/v1/intake/holds": {"scope": "agent", "target": "{agent}", "reason": "walk"},
    "/api/v1/intake/holds/{hold_id}/release": {"reason": "walk"},
}  # fmt: skip


def operations() -> list[tuple[str, str]]:
    paths = ninja_api.get_openapi_schema()["paths"]
    return [(path, method) for path, ops in paths.items() for method in sorted(ops)]


def fill(template, ids: dict[str, str]):
    text = json.dumps(template)
    for key, value in ids.items():
        text = text.replace("{" + key + "}", value)
    return json.loads(text)


def answer(resp) -> tuple[int, str | None]:
    """The status and, for an error, its code and field: what a caller can tell apart."""
    if resp.status_code < 400 or not resp.get("Content-Type", "").startswith("application/json"):
        return resp.status_code, None
    body = resp.json()
    return resp.status_code, f"{body.get('error')}:{body.get('field', '')}"


def call(client, method: str, path: str, ids: dict[str, str]):
    url = fill(path, ids)
    body = fill(BODIES.get(path, {}), ids)
    headers = client.headers
    if method == "get":
        return client.client.get(url, **headers)
    return getattr(client.client, method)(
        url, data=json.dumps(body), content_type="application/json", **headers
    )


def test_every_operation_is_walked_or_named_as_not_team_owned():
    walked = {p for p, _ in operations() if p not in NOT_TEAM_OWNED}
    params = {part for p in walked for part in p.split("/") if part.startswith("{")}
    # {name}: an agent's name (the approval-policies routes): support's agent vs one never made.
    assert params <= {"{run_id}", "{lease_id}", "{effect_id}", "{intervention_id}",
                      "{operation_id}", "{name}", "{freeze_id}", "{hold_id}"}, params  # fmt: skip
    assert set(NOT_TEAM_OWNED) <= {p for p, _ in operations()}  # no stale entries


# sam: a security responder of payments, who may set and restore standing freezes (not cross_team).
@pytest.mark.parametrize("who", ["pia", "sam", "w_pay"])
def test_another_teams_objects_answer_exactly_as_made_up_ones(two_teams: Teams, who):
    client = two_teams.api(who)
    support = two_teams.support | {"agent": "sup-agent", "name": "sup-agent"}
    fake = made_up() | {"agent": "no-such-agent", "name": "no-such-agent"}
    secret_ids = {v for k, v in two_teams.support.items() if k.endswith("_id")}
    differ = []
    for path, method in operations():
        if path in NOT_TEAM_OWNED:
            continue
        real = call(client, method, path, support)
        none = call(client, method, path, fake)
        if answer(real) != answer(none):
            differ.append((method, path, answer(real), answer(none), real.content[:200]))
        # Nothing support owns in the answer, beyond the id the caller itself sent.
        sent = {v for v in support.values() if v in fill(path, support)}
        sent |= {
            v for v in support.values() if v in json.dumps(fill(BODIES.get(path, {}), support))
        }
        leaked = {i for i in secret_ids - sent if i in real.content.decode()}
        assert not leaked, (method, path, leaked)
        named = "agent" in BODIES.get(path, {}) or "{name}" in path
        assert b"sup-agent" not in real.content or named, (method, path)
    assert differ == [], "\n".join(map(str, differ))


@pytest.mark.parametrize("who", ["pia", "sam", "w_pay"])
def test_lists_never_mention_the_other_team(two_teams: Teams, who):
    client = two_teams.api(who)
    mine, theirs = two_teams.payments, two_teams.support
    for path in ("/runs", "/fleet", "/audit", "/fleet/freezes", "/intake"):
        answer = client.get(path)
        text = answer.content.decode()
        assert all(v not in text for v in theirs.values() if len(v) > 8), (path, answer.status_code)
        assert "sup-agent" not in text, path
    listed = client.get("/runs")
    assert listed.status_code == 200
    assert {r["id"] for r in listed.json()["runs"]} == {mine["run_id"], mine["child_id"]}
