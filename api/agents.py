"""An agent's approval policies over HTTP: read them, replace them (admins only:
``manage_approval_policies``). A bad policy is a 422 naming ``approvals[i]``; every change and every
refusal is audited (``agent.approval_policies``, with before and after)."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from ninja import Router

from api.auth import caller
from api.responses import ERRORS_READ, ERRORS_WRITE, JSON, Out
from api.schemas import Schema
from core.errors import Forbidden, NotFound
from core.roles import may
from runs import selectors
from runs.services import agents

router = Router(tags=["agents"])


class PoliciesIn(Schema):
    # Each: the --approval spelling ("payments:charge amount>200 2*approver then security_responder")
    # or {"approval": "tool:action [condition]", "steps": [...]} (docs/operator/approvals.md).
    approvals: list[str | JSON]


class PolicyOut(Out):
    spec: str
    tool: str
    action: str
    condition: str
    approver_role: str
    steps: list[JSON]


class PoliciesOut(Out):
    agent: str
    approvals: list[PolicyOut]


def _shown(agent: Any) -> dict[str, Any]:
    return {
        "agent": agent.name,
        "approvals": [
            {
                "spec": p.spec,
                "tool": p.tool,
                "action": p.action,
                "condition": p.condition,
                "approver_role": p.approver_role,
                "steps": p.steps,
            }
            for p in agent.approval_policies.all()
        ],
    }


@router.get("/agents/{name}/approval-policies", response={200: PoliciesOut, **ERRORS_READ})
def get_policies(request: HttpRequest, name: str) -> Any:
    actor = caller(request)
    if actor.is_worker or not may(actor.roles, "manage_approval_policies"):
        raise Forbidden("only an admin may read and change an agent's approval policies")
    agent = selectors.agent_with_policies(name)
    if agent is None:
        raise NotFound("no such agent", object="agent")
    return _shown(agent)


@router.put("/agents/{name}/approval-policies", response={200: PoliciesOut, **ERRORS_WRITE})
def put_policies(request: HttpRequest, name: str, body: PoliciesIn) -> Any:
    agents.set_approval_policies(
        actor=caller(request),
        agent=name,
        approvals=list(body.approvals),
        field="approvals",
        check_right=True,
    )
    return _shown(selectors.agent_with_policies(name))
