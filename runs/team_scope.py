"""Which team's rows an actor may know of (docs/operator/teams.md). Reads only.

A row with no team belongs to the default team, written ``0`` in ``Actor.teams``. Whatever is
outside the actor's teams does not exist for them: callers filter with ``scoped`` and answer 404
exactly as for an id nobody ever used, never 403 (a 403 would say it exists).
"""

from __future__ import annotations

from typing import Any

from django.db import connection
from django.db.models import Count, Q, QuerySet, Sum

from core import pg
from core.actors import Actor
from runs.models import DEFAULT_TEAM, Agent, Run, RunTally, Team, TeamMembership


def team_q(teams: frozenset[int], field: str = "team") -> Q:
    """Rows owned by one of ``teams`` (0 = no team = the default team)."""
    q = Q(**{f"{field}_id__in": sorted(t for t in teams if t)})
    if 0 in teams:
        q |= Q(**{f"{field}__isnull": True})
    return q


def scoped[Q_T: QuerySet](qs: Q_T, actor: Actor, field: str = "team") -> Q_T:
    """``qs`` narrowed to the rows ``actor`` may know of (all of them for cross_team people)."""
    if not actor.team_scoped:
        return qs
    assert actor.teams is not None
    return qs.filter(team_q(actor.teams, field))


def team_id_for(slug: str) -> int | None:
    """The id stored for team ``slug``: None for the default team. LookupError if there is none."""
    if slug == DEFAULT_TEAM:
        return None
    pk = Team.objects.filter(slug=slug).values_list("pk", flat=True).first()
    if pk is None:
        raise LookupError(slug)
    return pk


def team_slug(team_id: int | None) -> str:
    if not team_id:
        return DEFAULT_TEAM
    return Team.objects.filter(pk=team_id).values_list("slug", flat=True).first() or DEFAULT_TEAM


def slugs() -> dict[int, str]:
    """team id -> slug, 0 = the default team (for labelling rows)."""
    return {0: DEFAULT_TEAM} | {
        pk: slug for pk, slug in Team.objects.exclude(slug=DEFAULT_TEAM).values_list("pk", "slug")
    }


def teams_for(actor: Actor, *, tallied: bool = False) -> list[dict[str, Any]]:
    """The teams ``actor`` may see (theirs; every team for cross_team people) with their run counts,
    the default team first. One grouped count over the runs they may see; ``tallied`` (the console's
    team switcher, drawn on every list render): from RunTally instead, by each agent's team — a
    read of a few rows at any number of runs (a count of 1,000,000 runs takes 300-700 ms), exact
    unless a run's team is not its agent's now, as the tally's other counts (teams.md)."""
    names = slugs()
    known = set(names) if not actor.team_scoped else set(actor.teams or ())
    counts: dict[int, int] = {}
    if tallied and pg.enabled(connection):
        team_of = dict(Agent.objects.values_list("pk", "team_id"))
        sums = RunTally.objects.order_by().values_list("agent_id").annotate(n=Sum("n"))
        grouped = [(team_of.get(agent_id), n) for agent_id, n in sums]
    else:
        runs = scoped(Run.objects.all(), actor).values_list("team_id").annotate(n=Count("id"))
        grouped = list(runs.values_list("team_id", "n"))
    for team_id, n in grouped:
        counts[team_id or 0] = counts.get(team_id or 0, 0) + n
    rows = [
        {
            "slug": names.get(t, DEFAULT_TEAM),
            "id": t,
            "runs": counts.get(t, 0),
            "member": actor.teams is None or t in actor.teams,
        }
        for t in sorted(known, key=lambda t: (t != 0, names.get(t, "")))
        if t in names
    ]
    return rows


def members(slug: str) -> list[str]:
    """Usernames in team ``slug`` (the default team: those in no team, or in its row)."""
    from django.contrib.auth import get_user_model

    users = get_user_model().objects.filter(is_active=True)
    if slug == DEFAULT_TEAM:
        users = users.filter(
            Q(team_memberships__isnull=True) | Q(team_memberships__team__slug=DEFAULT_TEAM)
        )
    else:
        users = users.filter(team_memberships__team__slug=slug)
    return sorted(set(users.values_list("username", flat=True)))


def may_know(actor: Actor, run: Run) -> bool:
    """Whether ``run`` exists for ``actor`` (visible_runs' rule for one locked row): a decision that
    locked a run by id answers 404 for one outside the actor's teams, or a worker token's agents."""
    if not actor.sees_team(run.team_id):
        return False
    return not (actor.is_worker and actor.agents and run.agent.name not in actor.agents)


def team_slugs_of(user_id: int | None) -> frozenset[str]:
    """The slugs of a person's teams (``default`` when in none, as ``members`` counts them); empty
    for no person. Read now, not from the actor's sign-in: a decision asks inside its transaction."""
    if user_id is None:
        return frozenset()
    slugs = TeamMembership.objects.filter(user_id=user_id).values_list("team__slug", flat=True)
    return frozenset(slugs) or frozenset({DEFAULT_TEAM})


def team_deciders(slug: str, run_team_id: int | None) -> list[str]:
    """Who may decide a step naming team ``slug`` on a run of team ``run_team_id``: its active
    members holding a role that may approve, who also see the run (in the run's team, or with the
    cross_team right) -- a member who cannot see the run finds it absent, so is not named."""
    from django.contrib.auth import get_user_model

    from core.roles import ROLES, may

    people: dict[str, tuple[set[str], set[int]]] = {}
    rows = (
        get_user_model()
        .objects.filter(is_active=True, username__in=members(slug))
        .values_list("username", "is_superuser", "groups__name", "team_memberships__team__slug",
                     "team_memberships__team_id")
    )  # fmt: skip
    for username, superuser, role, team, team_id in rows:
        roles, teams = people.setdefault(username, (set(), set()))
        if role in ROLES:
            roles.add(role)
        if superuser:
            roles.add("admin")
        teams.add(0 if team is None or team == DEFAULT_TEAM else team_id)
    return sorted(
        name
        for name, (roles, teams) in people.items()
        if may(roles, "approve") and (may(roles, "cross_team") or (run_team_id or 0) in teams)
    )


# --- rules over a scope of the fleet that belong to a team: standing freezes and intake holds -----
# (``team`` NULL: every team's runs, set only under the cross_team right; the default team's rule
# points at the default team's row, since its runs' NULL is taken.)

EVERY_TEAM = "*"  # how the API, the console and the audit name a rule's "every team"


def rules_scoped[Q_T: QuerySet](qs: Q_T, actor: Actor) -> Q_T:
    """The rules (freezes, holds) ``actor`` may know of: every team's, and their teams'. Another
    team's does not exist for them (404, as for an id nobody used)."""
    if not actor.team_scoped:
        return qs
    assert actor.teams is not None
    q = Q(team__isnull=True) | Q(team_id__in=sorted(t for t in actor.teams if t))
    if 0 in actor.teams:
        q |= Q(team__slug=DEFAULT_TEAM)
    return qs.filter(q)


def rule_team(rule: Any) -> int | None:
    """A rule's team as ``Actor.teams`` spells it (0 = the default team), None for every team."""
    if rule.team_id is None:
        return None
    return 0 if rule.team.slug == DEFAULT_TEAM else rule.team_id


def rule_team_slug(rule: Any) -> str:
    return EVERY_TEAM if rule.team_id is None else rule.team.slug


def crosses_teams(actor: Actor, rule: Any) -> bool:
    """Whether ``actor`` acts on the rule under the cross_team right: it is every team's, or another
    team's than theirs (the audit says so: ``context.cross_team``)."""
    if not actor.cross_team or actor.teams is None:
        return False
    team = rule_team(rule)
    return team is None or team not in actor.teams


def rule_runs_q(rule: Any, field: str = "team") -> Q:
    """The runs a rule's team covers: all for every team's, else those of its team."""
    team = rule_team(rule)
    if team is None:
        return Q()
    return Q(**{f"{field}__isnull": True}) if team == 0 else Q(**{f"{field}_id": team})


def rule_covers_run_sql(alias: str) -> str:
    """SQL: the rule ``alias`` covers the run ``%(run)s``'s team (a primary-key read of the run,
    locked already by the caller, and of the default team's row)."""
    return (
        f"({alias}.team_id IS NULL OR {alias}.team_id = (SELECT COALESCE(r.team_id,"
        f" (SELECT t.id FROM {Team._meta.db_table} t WHERE t.slug = '{DEFAULT_TEAM}'))"
        f" FROM {Run._meta.db_table} r WHERE r.id = %(run)s))"
    )


def runs_by_team_and_state() -> dict[tuple[int, str], int]:
    """(team id, 0 = the default team; state) -> runs: one GROUP BY over every run (the
    metrics' read, controlplane/metrics.py; its cost grows with the run table)."""
    rows = Run.objects.values_list("team_id", "state").annotate(n=Count("id")).order_by()
    return {(team or 0, state): n for team, state, n in rows}
