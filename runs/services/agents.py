"""Agent registration: the scopes an agent's runs may hold and the approval policies that bind them.

Every change is one audited transaction (``agent.register``, ``agent.approval_policies``), whether it
comes from ``manage.py register_agent``, the seed or a test. The admin only shows these rows.
"""

from __future__ import annotations

from typing import Any

from audit.services import record_audit
from core.actors import Actor
from core.errors import Forbidden, Invalid, NotFound
from core.names import name_problem, scope_problem
from core.roles import may
from runs.conditions import (
    ConditionError,
    PolicySpec,
    parse_policy_spec,
    parse_steps_json,
    strongest_role,
)
from runs.models import DEFAULT_TEAM, Agent, ApprovalPolicy, Team

from .decisions import decision
from .teams import team_for_new_row


def parse_scopes(scopes: list[str]) -> list[str]:
    for s in scopes:
        tool, sep, action = s.partition(":")
        if not (tool and sep and action):
            raise Invalid(f"scope {s!r} must look like tool:action or tool:*", field="scope")
        if why := scope_problem(s):  # core.names: one canonical form, no look-alikes
            raise Invalid(f"scope {s!r}: {why}", field="scope")
    return list(scopes)


def parse_policies(specs: list[Any], *, field: str = "approval") -> list[PolicySpec]:
    """Each spec is the ``--approval`` spelling, or the JSON shape ``{"approval": "tool:action
    [condition]", "steps": [{"role" or "team", "count", "stage", "within_s", "condition"}]}``.

    A bad one is refused naming ``field``; ``field="approvals"`` names its index: ``approvals[2]``
    (and, in the JSON shape, the step's part at fault: ``approvals[2].steps[0].team``). A step naming
    a team that does not exist is refused: read inside the caller's transaction."""

    def named(i: int) -> str:
        return f"{field}[{i}]" if field == "approvals" else field

    policies = []
    for i, spec in enumerate(specs):
        try:
            policies.append(_parse_one(spec))
        except ConditionError as err:
            at = f"{named(i)}.{err.field}" if err.field else named(i)
            raise Invalid(f"{named(i)}: {err}", field=at) from None
    for i, p in enumerate(policies):
        if why := scope_problem(f"{p.tool}:{p.action}"):
            raise Invalid(f"approval {p.tool}:{p.action}: {why}", field=named(i))
    _check_teams(specs, policies, named)
    return policies


def _check_teams(specs: list[Any], policies: list[PolicySpec], named: Any) -> None:
    """Every team a step names exists (the default team always does: its row is optional)."""
    wanted = {s.team for p in policies for s in p.steps if s.team and s.team != DEFAULT_TEAM}
    known = set(Team.objects.filter(slug__in=wanted).values_list("slug", flat=True))
    for i, p in enumerate(policies):
        for j, step in enumerate(p.steps):
            if step.team and step.team != DEFAULT_TEAM and step.team not in known:
                # The JSON shape names the step; the spelling is one string, named whole.
                at = named(i) + (f".steps[{j}].team" if isinstance(specs[i], dict) else "")
                raise Invalid(
                    f"{named(i)}: step {step.target!r} names no team: there is no team "
                    f"{step.team!r} (manage.py teams create {step.team})",
                    field=at,
                    team=step.team,
                )


def _parse_one(spec: Any) -> PolicySpec:
    if isinstance(spec, str):
        return parse_policy_spec(spec)
    if not isinstance(spec, dict) or not isinstance(spec.get("approval"), str):
        raise ConditionError(
            'a policy is a string or {"approval": "tool:action [condition]", "steps": [...]}'
        )
    base = parse_policy_spec(spec["approval"])
    if base.multi_party:
        raise ConditionError("name the steps either in the spelling or in steps, not both")
    if "steps" not in spec:
        return base
    steps = parse_steps_json(spec["steps"])
    return PolicySpec(base.tool, base.action, base.condition, strongest_role(steps), steps)


def register_agent(
    *,
    actor: Actor,
    name: str,
    scopes: list[str],
    description: str = "",
    approvals: list[str] | None = None,
    team: str | None = None,
) -> tuple[Agent, bool]:
    """Create or update an agent. ``approvals`` (policy specs, ``tool:action [condition] [role]``):
    None keeps the agent's policies, a list (even empty) replaces them. ``team`` (a slug): None keeps
    the agent's team (a new agent: the default team)."""
    with decision(actor, "agent.register", "agent", name):  # a refusal is audited too
        if why := name_problem(name):  # a slug: it is matched in tokens, URLs and filters
            raise Invalid(f"agent name {name!r} {why}", field="name")
        scopes = parse_scopes(scopes)
        policies = parse_policies(approvals) if approvals is not None else None
        before = Agent.objects.select_for_update().filter(name=name).first()
        was = (
            {"scopes": before.allowed_scopes, "description": before.description} if before else None
        )
        fields: dict[str, Any] = {"allowed_scopes": scopes, "description": description}
        if team is not None:
            fields["team"] = team_for_new_row(team)
        agent, created = Agent.objects.update_or_create(name=name, defaults=fields)
        record_audit(
            actor=actor,
            action="agent.register",
            object_type="agent",
            object_id=agent.pk,
            context={
                "name": name,
                "before": was,
                "after": {"scopes": scopes, "description": description},
                **({"team": team} if team is not None else {}),
            },
        )
        if policies is not None:
            _replace_policies(agent, policies, actor)
    return agent, created


def set_approval_policies(
    *,
    actor: Actor,
    agent: str,
    approvals: list[Any],
    field: str = "approval",
    check_right: bool = False,
) -> list[ApprovalPolicy]:
    """Replace ``agent``'s approval policies (one decision, audited with before and after). The API
        (``PUT /api/v1/agents/{name}/approval-policies``) passes ``field="approvals"``: a refusal then
        names the policy's index, and ``check_right=True``: only ``manage_approval_policies`` (admins) may,
    a refusal audited like any other (the command line and the seed act as the operator of the host)."""
    with decision(actor, "agent.approval_policies", "agent", agent):
        if check_right and (actor.is_worker or not may(actor.roles, "manage_approval_policies")):
            raise Forbidden("only an admin may change an agent's approval policies")
        policies = parse_policies(approvals, field=field)
        row = Agent.objects.select_for_update().filter(name=agent).first()
        if row is None:
            if check_right:
                raise NotFound("no such agent", object="agent")
            raise Invalid(f"agent {agent!r} is not registered", field="agent")
        return _replace_policies(row, policies, actor)


def _replace_policies(
    agent: Agent, policies: list[PolicySpec], actor: Actor
) -> list[ApprovalPolicy]:
    current = list(agent.approval_policies.all())
    before = [p.spec for p in current]
    wanted = [
        ApprovalPolicy(
            agent=agent,
            tool=p.tool,
            action=p.action,
            condition=p.condition,
            approver_role=p.approver_role,
            steps=[st.as_json() for st in p.steps] if p.multi_party else [],
            created_by=actor.label,
        )
        for p in policies
    ]
    after = [p.spec for p in wanted]
    if before == after:
        return current  # unchanged (e.g. the seed run again): keep the rows approvals point at
    agent.approval_policies.all().delete()
    rows = [ApprovalPolicy.objects.create(**_fields(p)) for p in wanted]
    record_audit(
        actor=actor,
        action="agent.approval_policies",
        object_type="agent",
        object_id=agent.pk,
        context={"agent": agent.name, "before": before, "after": after},
    )
    return rows


def _fields(p: ApprovalPolicy) -> dict:
    names = ("agent", "tool", "action", "condition", "approver_role", "steps", "created_by")
    return {n: getattr(p, n) for n in names}


def record_deployed_versions(*, actor: Actor, agent: str, tools: dict[str, str]) -> dict:
    """A deployment changed tool versions of ``agent``'s workers (the demo's bump command): what
    "now" means to a resume's or a recovery's version check until a worker reports otherwise at its
    next claim. One audited transaction (``agent.versions``) with the versions before and after."""
    with decision(actor, "agent.versions", "agent", agent):
        row = Agent.objects.select_for_update().filter(name=agent).first()
        if row is None:
            raise Invalid(f"no agent named {agent!r}", field="agent")
        before = dict(row.current_versions or {})
        after = {**before, "tools": {**(before.get("tools") or {}), **tools}}
        row.current_versions = after
        row.save(update_fields=["current_versions"])
        record_audit(
            actor=actor,
            action="agent.versions",
            object_type="agent",
            object_id=row.pk,
            context={"name": agent, "before": before, "after": after},
        )
    return after
