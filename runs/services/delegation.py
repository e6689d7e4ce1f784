"""Delegation never widens what the parent may do now (docs/security/hardening.md, "Delegation").

A child run's authority comes only from its parent: each scope it asks for must be covered by one of
the parent's grants that is active now (not suspended, revoked or expired), outside any live
capability freeze on the parent, and only while the parent itself may act (runs.states
DELEGATING_STATES: not paused, cancelling, orphaned or finished). Otherwise a frozen or paused run's
worker could create a child delegated ``payments:charge`` and charge through it.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings

from core.errors import AuthorityNotAllowed, Invalid
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


def check_tree_bounds(parent: Run) -> None:
    """A run has at most ``MAX_CHILDREN_PER_RUN`` children and a tree at most ``MAX_TREE_DEPTH``
    levels: an unbounded tree makes a tree-scoped pause or cancel one unbounded request (1,500
    children took 27.8 s and an 870 KB receipt). Under the parent's row lock, so two creations
    cannot both take the last place."""
    limit = settings.MAX_CHILDREN_PER_RUN
    if Run.objects.filter(parent=parent).count() >= limit:
        raise Invalid(
            f"the parent run already has {limit} children (MAX_CHILDREN_PER_RUN)",
            field="parent_run_id",
        )
    depth, cursor = 1, parent.parent_id
    while cursor is not None:
        depth += 1
        if depth >= settings.MAX_TREE_DEPTH:
            raise Invalid(
                f"a run tree may be at most {settings.MAX_TREE_DEPTH} levels deep (MAX_TREE_DEPTH)",
                field="parent_run_id",
            )
        cursor = Run.objects.filter(pk=cursor).values_list("parent_id", flat=True).first()
