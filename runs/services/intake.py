"""Whether a live intake hold covers a run (runs/models/intake.py): the claim's check and the work
queue's filter. The claim reads it as one subquery of its facts statement on PostgreSQL (``HOLD_SQL``,
answered by the partial unique index one_live_intake_hold and the grants' run index); elsewhere
(the SQLite demo) ``covering_hold`` runs the same lookup through the ORM."""

from __future__ import annotations

from typing import Any

from django.db.models import Exists, OuterRef, Q, QuerySet

from core.actors import Actor
from runs.models import Agent, AuthorityGrant, IntakeHold, Run
from runs.team_scope import rule_covers_run_sql, rule_runs_q, rules_scoped

HELD = "intake_held"
_HOLDS, _GRANTS = IntakeHold._meta.db_table, AuthorityGrant._meta.db_table

# (id, scope, target, reason, held_by) of one live hold covering the run (of every team or the run's
# team), or NULL. Params: run, agent.
HOLD_SQL = (
    f"(SELECT json_build_array(h.id, h.scope, h.target, h.reason, h.held_by) FROM {_HOLDS} h"
    f" WHERE h.released_at IS NULL AND {rule_covers_run_sql('h')} AND (h.scope = '{IntakeHold.ALL}'"
    f"  OR (h.scope = '{IntakeHold.AGENT}'"
    f"      AND h.target = (SELECT name FROM {Agent._meta.db_table} WHERE id = %(agent)s))"
    f"  OR (h.scope = '{IntakeHold.TOOL}' AND EXISTS (SELECT 1 FROM {_GRANTS} g"
    f"      WHERE g.run_id = %(run)s AND g.status = '{AuthorityGrant.ACTIVE}'"
    f"      AND split_part(g.scope, ':', 1) = h.target)))"
    f" ORDER BY h.held_at LIMIT 1)"
)


def scope_label(scope: str, target: str) -> str:
    return "every agent" if scope == IntakeHold.ALL else f"{scope} {target}"


def held_message(hold: list[Any] | tuple[Any, ...]) -> str:
    """The claim's refusal, naming the hold, who set it and why."""
    _id, scope, target, reason, by = hold
    return (
        f"intake is held for {scope_label(scope, target)} by {by}: {reason}; "
        "the run stays queued until the hold is released"
    )


def _tools(run: Run) -> set[str]:
    scopes = AuthorityGrant.objects.filter(run=run, status=AuthorityGrant.ACTIVE)
    return {s.partition(":")[0] for s in scopes.values_list("scope", flat=True)}


def covering_hold(run: Run) -> list[Any] | None:
    """The ORM twin of ``HOLD_SQL`` (the SQLite demo)."""
    live = IntakeHold.objects.filter(released_at__isnull=True).select_related("team")
    for hold in live.order_by("held_at"):
        if not Run.objects.filter(rule_runs_q(hold), pk=run.pk).exists():
            continue  # another team's hold
        if (
            hold.scope == IntakeHold.ALL
            or (hold.scope == IntakeHold.AGENT and hold.target == run.agent.name)
            or (hold.scope == IntakeHold.TOOL and hold.target in _tools(run))
        ):
            return [str(hold.pk), hold.scope, hold.target, hold.reason, hold.held_by]
    return None


def live_holds(actor: Actor | None = None) -> list[IntakeHold]:
    """The live holds, oldest first; those ``actor`` may know of (their teams' and every team's)."""
    qs = IntakeHold.objects.filter(released_at__isnull=True).select_related("team")
    return list((rules_scoped(qs, actor) if actor is not None else qs).order_by("held_at"))


def _covers_q(hold: IntakeHold) -> Q:
    """The runs one hold covers: its scope, within its team (every team's: all)."""
    if hold.scope == IntakeHold.ALL:
        q = Q(pk__isnull=False)
    elif hold.scope == IntakeHold.AGENT:
        q = Q(agent__name=hold.target)
    else:
        grants = AuthorityGrant.objects.filter(
            run=OuterRef("pk"), status=AuthorityGrant.ACTIVE, scope__startswith=f"{hold.target}:"
        )
        q = Q(Exists(grants))
    return q & rule_runs_q(hold)


def held_q(holds: list[IntakeHold]) -> Q:
    """Runs any of ``holds`` covers (for a queryset of runs)."""
    q = Q(pk__isnull=True)  # matches nothing
    for hold in holds:
        q |= _covers_q(hold)
    return q


def not_held(runs: QuerySet[Run]) -> QuerySet[Run]:
    """``runs`` without those a live hold covers (one small read of the live holds, usually none)."""
    holds = live_holds()
    return runs.exclude(held_q(holds)) if holds else runs
