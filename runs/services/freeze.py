"""The declaration's freeze check: one indexed lookup, no ORM compiler (the protocol's hot path)."""

from __future__ import annotations

from typing import Any

from django.db import connection

from runs.models.freeze import CapabilityFreeze

FROZEN = "capability_frozen"
# The partial unique index one_live_freeze_per_scope (run_id, scope) WHERE lifted_at IS NULL answers it.
_WHERE = "FROM runs_capabilityfreeze WHERE run_id = {} AND lifted_at IS NULL AND scope IN ({}, {}) LIMIT 1"
_SQL = "SELECT scope, reason, frozen_by " + _WHERE.format("%s", "%s", "%s")
# One of the declaration's facts (effects.py), read with the others in one statement on PostgreSQL.
FREEZE_JSON_SQL = "SELECT json_build_array(scope, reason, frozen_by) " + _WHERE.format(
    "%(run)s", "%(scope)s", "%(wildcard)s"
)
_UNREAD: Any = object()


def live_freeze(run_id: Any, tool: str, action: str) -> tuple[str, str, str] | None:
    """(scope, reason, frozen_by) of a live freeze covering tool:action on the run, or None."""
    # The column's own preparation: a UUID is hex text on SQLite (the demo default), native on PostgreSQL.
    run = CapabilityFreeze._meta.get_field("run").get_db_prep_value(run_id, connection)
    with connection.cursor() as cur:
        cur.execute(_SQL, [run, f"{tool}:{action}", f"{tool}:*"])
        row = cur.fetchone()
    return tuple(row) if row else None


def capability_frozen(
    run_id: Any, tool: str, action: str, freeze: Any = _UNREAD
) -> tuple[str | None, str]:
    """(``capability_frozen``, why) if a live freeze covers tool:action on the run, else (None, "").
    ``freeze``: ``live_freeze``'s answer if the caller already read it (under the run lock)."""
    row = live_freeze(run_id, tool, action) if freeze is _UNREAD else freeze
    if row is None:
        return None, ""
    scope, reason, by = row
    return FROZEN, f"{scope} is frozen on this run by {by}: {reason}; restore lifts it"
