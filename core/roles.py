"""Roles (Django groups) and the permission matrix: which role may issue which action.

This is data: services check it, the console reads it to decide which buttons to offer, the contracts
endpoint publishes it, and a test walks every action x role.
"""

from __future__ import annotations

VIEWER = "viewer"
OPERATOR = "operator"
APPROVER = "approver"
INCIDENT_COMMANDER = "incident_commander"
SECURITY_RESPONDER = "security_responder"
ADMIN = "admin"
ROLES = [VIEWER, OPERATOR, APPROVER, INCIDENT_COMMANDER, SECURITY_RESPONDER, ADMIN]

# action -> roles allowed to issue it. Each intervention contract declares its own row (its
# ``may_issue``, interventions/plugins.py), handed in by declare_permission when the app is ready;
# the rows here are the rights no contract owns. "override" is the right to act although someone
# else holds decision authority over the run (recorded with a reason, never silent).
PERMISSIONS: dict[str, frozenset[str]] = {
    "view": frozenset(ROLES),
    # Fleet operations (interventions/fleet/operations.py): "fleet" to run one at all, plus the
    # right to issue its per-run contract (pause, resume, cancel); take_command is its own right.
    # A standing freeze over a scope of the fleet is its own contract (standing_freeze and
    # standing_restore, declared by interventions/fleet/freezes.py), also with "fleet".
    "fleet": frozenset({OPERATOR, INCIDENT_COMMANDER, SECURITY_RESPONDER, ADMIN}),
    "take_command": frozenset({INCIDENT_COMMANDER, ADMIN}),
    # Teams (docs/operator/teams.md): act on any team's runs, not only one's own teams'. Every run
    # audit event written under it on another team's run carries context.cross_team = true.
    "cross_team": frozenset({INCIDENT_COMMANDER, ADMIN}),
    "manage_teams": frozenset({ADMIN}),
    "override": frozenset({INCIDENT_COMMANDER, ADMIN}),
    "override_revalidation": frozenset({INCIDENT_COMMANDER, ADMIN}),
    "start_run": frozenset({OPERATOR, INCIDENT_COMMANDER, ADMIN}),
    "audit_export": frozenset({INCIDENT_COMMANDER, SECURITY_RESPONDER, ADMIN}),
    # The whole audit log: sign-ins, tokens, agents, anchors -- events of no run. Everyone else reads
    # the audit events of the runs they may see (core.roles.audit_scope; docs/security/hardening.md).
    "audit_read_all": frozenset({INCIDENT_COMMANDER, SECURITY_RESPONDER, ADMIN}),
    # A full verification walks every audit and history row: for those who answer for the trail.
    "audit_verify": frozenset({INCIDENT_COMMANDER, SECURITY_RESPONDER, ADMIN}),
}


def declare_permission(action: str, roles: frozenset[str]) -> None:
    """A contract's permission row. Declaring one twice with other roles is a mistake, refused."""
    unknown = set(roles) - set(ROLES)
    if unknown:
        raise ValueError(f"permission {action!r}: unknown role(s) {sorted(unknown)}")
    if PERMISSIONS.get(action, frozenset(roles)) != frozenset(roles):
        raise ValueError(f"permission {action!r} is declared twice with different roles")
    PERMISSIONS[action] = frozenset(roles)


def roles_of(user) -> frozenset[str]:
    if user is None or not getattr(user, "is_authenticated", False):
        return frozenset()
    names = set(user.groups.values_list("name", flat=True))
    if user.is_superuser:
        names.add(ADMIN)
    return frozenset(n for n in names if n in ROLES)


def may(roles: frozenset[str] | set[str], action: str) -> bool:
    return bool(PERMISSIONS.get(action, frozenset()) & set(roles))


def primary_role(roles: frozenset[str]) -> str:
    """The most senior role, for audit rows."""
    for role in reversed(ROLES):
        if role in roles:
            return role
    return ""


# Roles that can be asked to approve, weakest first: a policy's approver role, and whether an
# approval's required role is at least as strong as the policy's (runs.services.approvals).
APPROVING_ROLES = (APPROVER, INCIDENT_COMMANDER, ADMIN)


def approver_rank(role: str) -> int:
    """Position in APPROVING_ROLES; an unknown role ranks above all (only an admin satisfies it)."""
    return APPROVING_ROLES.index(role) if role in APPROVING_ROLES else len(APPROVING_ROLES)


def reads_whole_audit_log(roles: frozenset[str] | set[str]) -> bool:
    """False: the caller reads only run-scoped audit events (those with a run id)."""
    return may(roles, "audit_read_all")
