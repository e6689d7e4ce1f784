"""The declaration's freeze checks: a per-run freeze (one indexed lookup) and the standing freezes
over a scope of the fleet, both read inside the declaration's one facts statement (effects.py), no
ORM compiler (the protocol's hot path)."""

from __future__ import annotations

import uuid
from typing import Any

from django.db import connection
from django.db.models import Q
from django.utils.dateparse import parse_datetime

from runs.freezes import capability_q, matches
from runs.models import Agent, Run, Team
from runs.models.freeze import CapabilityFreeze, StandingFreeze
from runs.team_scope import rule_covers_run_sql, rule_runs_q

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


# --- standing freezes over a scope of the fleet (runs.models.StandingFreeze, runs/freezes.py) ------

_STANDING_COLUMNS = (
    "f.id, f.over, f.capability, f.run_filter, f.reason, f.frozen_by, f.frozen_at, a.name, t.slug"
)
# The live standing freezes of this tool:action that may cover the run: every one over everything
# or over its agent (decided here), of every team or the run's team, and those over a filter
# (matched in Python, below: rare). One more subquery of the declaration's facts statement
# (effects.py), walking one_live_standing_freeze_of_team.
STANDING_JSON_SQL = (
    f"SELECT json_agg(json_build_array({_STANDING_COLUMNS})"
    "  ORDER BY f.over = 'filter', f.frozen_at)"
    f" FROM {StandingFreeze._meta.db_table} f"
    f" LEFT JOIN {Agent._meta.db_table} a ON a.id = f.agent_id"
    f" LEFT JOIN {Team._meta.db_table} t ON t.id = f.team_id"
    " WHERE f.lifted_at IS NULL AND f.capability IN (%(scope)s, %(wildcard)s)"
    " AND (f.agent_id IS NULL OR f.agent_id = %(agent)s)"
    f" AND {rule_covers_run_sql('f')}"
)


def standing_rows(run: Run, tool: str, action: str) -> list[tuple[Any, ...]]:
    """``STANDING_JSON_SQL``'s rows through the ORM (the SQLite demo's twin)."""
    qs = (
        StandingFreeze.objects.filter(capability_q(tool, action), lifted_at__isnull=True)
        .filter(Q(agent__isnull=True) | Q(agent_id=run.agent_id))
        .select_related("agent", "team")
        .order_by("frozen_at")
    )
    rows = [
        (f.pk, f.over, f.capability, f.run_filter, f.reason, f.frozen_by, f.frozen_at)
        + (f.agent.name if f.agent else None, f.team.slug if f.team else None)
        for f in qs
        if Run.objects.filter(rule_runs_q(f), pk=run.pk).exists()
    ]
    return sorted(rows, key=lambda r: r[1] == StandingFreeze.FILTER)


def standing_from_json(rows: list[list[Any]] | None) -> list[tuple[Any, ...]]:
    """``STANDING_JSON_SQL``'s JSON arrays as the twin's tuples (a UUID, a datetime)."""
    return [(uuid.UUID(r[0]), *r[1:6], parse_datetime(r[6]), *r[7:9]) for r in rows or ()]


def standing_frozen(
    run: Run, rows: list[tuple[Any, ...]]
) -> tuple[str | None, str, dict[str, Any] | None]:
    """(``capability_frozen``, why, the freeze) if a live standing freeze covers the run, else
    (None, "", None). ``rows``: the candidates the facts statement read."""
    for fid, over, capability, text, reason, by, frozen_at, agent, team in rows:
        if over == StandingFreeze.FILTER and not matches(
            {"over": over, "run_filter": text}, [run.pk]
        ):
            continue
        scope = {"agent": f"agent {agent}", "filter": f"runs matching {text}"}.get(
            over, "every run"
        ) + (f" of team {team}" if team else "")
        at = frozen_at.isoformat()
        freeze = {
            "kind": "standing",
            "id": str(fid),
            "capability": capability,
            "over": over,
            "scope": scope,
            "team": team or "*",
            "frozen_by": by,
            "frozen_at": at,
            "reason": reason,
        }
        why = (
            f"{capability} is frozen over {scope} by {by} since {at} (standing freeze {fid}): "
            f"{reason}; restoring it lifts it for every run"
        )
        return FROZEN, why, freeze
    return None, "", None
