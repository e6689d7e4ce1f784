"""The machine-readable contracts: what each intervention stops, what continues, cascade, effect on
authority, who may issue it, preconditions and follow-up jobs. Served at GET /api/v1/contracts,
rendered on the contracts page, and checked claim by claim by tests/interventions/test_contracts.py.

Each contract declares its own spec and permission row (interventions/<kind>.py, registered in
interventions/plugins.py); state edges are read from runs.states.
"""

from __future__ import annotations

from typing import Any

from core.roles import PERMISSIONS
from interventions.plugins import FLEET_REGISTRY, REGISTRY, get_contract
from runs.states import TRANSITIONS, as_table


def contract_for(kind: str) -> dict[str, Any]:
    contract = get_contract(kind)
    event = contract.event
    spec = contract.spec.as_dict()
    spec["kind"] = kind
    spec["event"] = event.value if event else None
    spec["may_issue"] = sorted(PERMISSIONS.get(kind, frozenset()))
    spec["honours_decision_authority"] = contract.owner_bound
    spec["override_roles"] = sorted(PERMISSIONS["override"])
    spec["from_states"] = (
        sorted(s.value for s, edges in TRANSITIONS.items() if event in edges)
        if event
        else "any but closed"
    )
    spec["transitions"] = [row for row in as_table() if event and row["event"] == event.value]
    spec["reason_required"] = True
    return spec


def fleet_contract_for(kind: str) -> dict[str, Any]:
    contract = FLEET_REGISTRY[kind]
    return (
        contract.spec.as_dict()
        | contract.as_dict()
        | {
            "kind": kind,
            "event": None,
            "may_issue": sorted(PERMISSIONS.get(kind, frozenset())),
            "honours_decision_authority": False,
            "override_roles": [],
            "from_states": "no run: a standing rule over a scope of the fleet",
            "transitions": [],
            "reason_required": True,
        }
    )


def contracts_document() -> dict[str, Any]:
    return {
        "contracts": {kind: contract_for(kind) for kind in REGISTRY},
        "fleet_contracts": {kind: fleet_contract_for(kind) for kind in FLEET_REGISTRY},
        "state_machine": as_table(),
        "permissions": {k: sorted(v) for k, v in permission_rows().items()},
    }


def permission_rows() -> dict[str, frozenset[str]]:
    """The permission matrix in reading order: viewing, then each contract in its order, then the
    rights no contract owns."""
    first = ["view", *REGISTRY, *FLEET_REGISTRY]
    return {k: PERMISSIONS[k] for k in first} | {
        k: v for k, v in PERMISSIONS.items() if k not in first
    }
