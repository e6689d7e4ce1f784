"""Delegation never widens what the parent may do now (docs/security/hardening.md, "Delegation").

A child run's authority comes only from its parent: each scope it asks for must be covered by one of
the parent's grants that is active now (not suspended, revoked or expired), outside any live
capability freeze on the parent, and only while the parent itself may act (runs.states
DELEGATING_STATES: not paused, cancelling, orphaned or finished). Otherwise a frozen or paused run's
worker could create a child delegated ``payments:charge`` and charge through it.
"""

from __future__ import annotations

from typing import Any

from core.errors import AuthorityNotAllowed
from runs.models import AuthorityGrant, CapabilityFreeze, Run
from runs.states import DELEGATING_STATES


def _overlaps(a: str, b: str) -> bool:
    """Two scopes (``tool:action`` or ``tool:*``) share at least one tool:action."""
    tool_a, _, action_a = a.partition(":")
    tool_b, _, action_b = b.partition(":")
    return tool_a == tool_b and (action_a == action_b or "*" in (action_a, action_b))


def delegable_grant(parent: Run, scope: str, now: Any) -> AuthorityGrant:
    """The parent's grant that ``scope`` is delegated from, or ``AuthorityNotAllowed`` saying why the
    parent may not hand it on now. Called under the parent's row lock (create_run locks it)."""
    if parent.state not in DELEGATING_STATES:
        raise AuthorityNotAllowed(
            f"the parent run is {parent.state}: it may not act now, so it may not delegate {scope!r}",
            scope=scope,
            parent_state=parent.state,
        )
    for freeze in CapabilityFreeze.objects.filter(run=parent, lifted_at__isnull=True):
        if _overlaps(freeze.scope, scope):
            raise AuthorityNotAllowed(
                f"{freeze.scope} is frozen on the parent run by {freeze.frozen_by}: "
                f"{scope!r} cannot be delegated while the freeze holds",
                scope=scope,
            )
    tool = scope.partition(":")[0]
    source = None
    for grant in AuthorityGrant.objects.filter(run=parent):
        if grant.effective_status(now) == AuthorityGrant.ACTIVE and grant.scope in (
            scope,
            f"{tool}:*",
        ):
            source = grant
            break
    if source is None:
        raise AuthorityNotAllowed(
            f"parent run holds no active grant covering {scope!r}", scope=scope
        )
    if source.scope != scope and scope.endswith(":*"):
        raise AuthorityNotAllowed(
            f"{scope!r} is wider than the parent's {source.scope!r}", scope=scope
        )
    return source
