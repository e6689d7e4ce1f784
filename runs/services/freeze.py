"""The declaration's freeze check: one indexed lookup, no ORM compiler (the protocol's hot path)."""

from __future__ import annotations

from typing import Any

from django.db import connection

from runs.models.freeze import CapabilityFreeze

FROZEN = "capability_frozen"
# The partial unique index one_live_freeze_per_scope (run_id, scope) WHERE lifted_at IS NULL answers it.
_SQL = (
    "SELECT scope, reason, frozen_by FROM runs_capabilityfreeze "
    "WHERE run_id = %s AND lifted_at IS NULL AND scope IN (%s, %s) LIMIT 1"
)


def capability_frozen(run_id: Any, tool: str, action: str) -> tuple[str | None, str]:
    """(``capability_frozen``, why) if a live freeze covers tool:action on the run, else (None, "")."""
    # The column's own preparation: a UUID is hex text on SQLite (the demo default), native on PostgreSQL.
    run = CapabilityFreeze._meta.get_field("run").get_db_prep_value(run_id, connection)
    with connection.cursor() as cur:
        cur.execute(_SQL, [run, f"{tool}:{action}", f"{tool}:*"])
        row = cur.fetchone()
    if row is None:
        return None, ""
    scope, reason, by = row
    return FROZEN, f"{scope} is frozen on this run by {by}: {reason}; restore lifts it"
