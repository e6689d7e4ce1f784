"""Which standing freezes cover which runs (runs.models.StandingFreeze): the rule, as reads.

A freeze over ``everything`` or an ``agent`` is decided from columns alone (the declaration does it
inside its one facts statement: runs/services/effects.py). One over a ``filter`` is the run list's
filter over what a run *is* -- its agent, owner, goal text, id, the tools it touched -- evaluated
against the run when it declares, so a run created, retried, resumed or delegated to later is
covered as soon as it matches. Filters by state or time are refused when the freeze is set
(interventions/fleet/freezes.py): a standing rule does not lapse as a run moves on.
"""

from __future__ import annotations

from typing import Any

from django.db.models import Q, QuerySet
from django.http import QueryDict

from core.actors import Actor
from runs.models import Run, StandingFreeze
from runs.search import RunFilter
from runs.team_scope import rule_runs_q, rule_team_slug, rules_scoped

# Keys a standing freeze's filter may use: what a run is, not where it is in its life.
FILTER_KEYS = frozenset({"q", "id", "agent", "touched", "owner"})
# Reads every run, whoever set the freeze: coverage does not depend on who looks.
READER = Actor(kind="system", name="standing-freeze", role="system", roles=frozenset({"viewer"}))


def run_filter(text: str) -> RunFilter:
    return RunFilter.from_query(QueryDict(text))


def matches(freeze: StandingFreeze | dict[str, Any], run_ids: list[Any]) -> set[Any]:
    """The runs of ``run_ids`` the freeze covers (a dict: a candidate the declaration read, its
    team already matched in SQL)."""
    over = freeze["over"] if isinstance(freeze, dict) else freeze.over
    runs = Run.objects.filter(pk__in=run_ids)
    if not isinstance(freeze, dict) and freeze.team_id is not None:
        runs = runs.filter(rule_runs_q(freeze))  # a team's freeze covers its team's runs only
    elif over == StandingFreeze.EVERYTHING:
        return set(run_ids)
    if over == StandingFreeze.EVERYTHING:
        return set(runs.values_list("pk", flat=True))
    if over == StandingFreeze.AGENT:
        agent: int = freeze["agent_id"] if isinstance(freeze, dict) else freeze.agent_id  # type: ignore[assignment]
        return set(runs.filter(agent_id=agent).values_list("pk", flat=True))
    text = freeze["run_filter"] if isinstance(freeze, dict) else freeze.run_filter
    qs = run_filter(text).queryset(READER, within=runs.values("pk")).filter(pk__in=run_ids)
    return set(qs.values_list("pk", flat=True))


def live_standing(
    capability: str | None = None, actor: Actor | None = None
) -> QuerySet[StandingFreeze]:
    """The live standing freezes (of one capability), oldest first; those ``actor`` may know of."""
    qs = (
        StandingFreeze.objects.filter(lifted_at__isnull=True)
        .select_related("agent", "team")
        .order_by("frozen_at")
    )
    if actor is not None:
        qs = rules_scoped(qs, actor)
    return qs.filter(capability=capability) if capability else qs


def covering(runs: list[Run]) -> dict[Any, list[StandingFreeze]]:
    """For each run (by id), the live standing freezes covering it, oldest first. One query for the
    freezes, one per filter freeze (few: they are set during incidents)."""
    ids = [r.pk for r in runs]
    out: dict[Any, list[StandingFreeze]] = {pk: [] for pk in ids}
    if not ids:
        return out
    for freeze in live_standing():
        for pk in matches(freeze, ids):
            out[pk].append(freeze)
    return out


def runs_covered(freeze: StandingFreeze) -> QuerySet[Run]:
    """Every run the freeze covers today (its preview and the fleet page count them)."""
    runs = Run.objects.filter(rule_runs_q(freeze))
    if freeze.over == StandingFreeze.AGENT and freeze.agent_id is not None:
        return runs.filter(agent_id=freeze.agent_id)
    if freeze.over == StandingFreeze.FILTER:
        return run_filter(freeze.run_filter).queryset(READER).filter(rule_runs_q(freeze))
    return runs


def capability_q(tool: str, action: str) -> Q:
    return Q(capability__in=(f"{tool}:{action}", f"{tool}:*"))


def freeze_dict(f: StandingFreeze) -> dict[str, Any]:
    return {
        "id": str(f.pk),
        "capability": f.capability,
        "over": f.over,
        "agent": f.agent.name if f.agent_id and f.agent else None,
        "filter": f.run_filter or None,
        "scope": f.scope_label,
        "team": rule_team_slug(f),  # "*": every team's runs
        "reason": f.reason,
        "frozen_by": f.frozen_by,
        "frozen_at": f.frozen_at.isoformat(),
        "live": f.live,
        "lifted_at": f.lifted_at.isoformat() if f.lifted_at else None,
        "lifted_by": f.lifted_by or None,
        "lift_reason": f.lift_reason or None,
    }
