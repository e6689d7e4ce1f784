"""Which audit events a team-limited reader may know of (docs/operator/teams.md). Reads only.

An event belongs to a team when it is about a run of that team, or about an object of that team --
a fleet operation, a standing freeze or an intake hold, an agent, a worker token, the team itself --
read from the object's own row, so events written before teams existed are placed as exactly as new
ones. What is not placed in the reader's teams does not exist for them, whichever way it is asked for:
the audit page, ``GET /audit`` and the JSONL export leave it out alike.

The rule is by the objects the reader may know of, never by "the others' objects": an event naming a
run, operation, freeze or hold nobody has (a refusal on a made-up id) is left out exactly as one
naming another team's, so the trail cannot tell the two apart. Events of no object of a team --
refusals at a page or an endpoint (whose path may name anything), jobs, anchors -- are for cross_team
readers only. Accounts, roles and notification channels belong to no team: every reader of the
whole log sees them, as before teams.
"""

from __future__ import annotations

from django.db.models import CharField, Exists, OuterRef, Q, QuerySet
from django.db.models.functions import Cast

from core.actors import Actor
from interventions.models import FleetOperation
from runs.models import DEFAULT_TEAM, Agent, ApiToken, IntakeHold, Run, StandingFreeze, Team
from runs.team_scope import rules_scoped, scoped, team_q

# object_type of events about nobody's team: people's accounts and sign-ins, roles, channels.
OF_NO_TEAM = ("user", "role", "channel")


def _ids(qs: QuerySet, field: str = "pk") -> QuerySet:
    """``qs``'s ``field`` as text, to compare with ``AuditEvent.object_id`` (a hashed string)."""
    return qs.annotate(audit_key=Cast(field, CharField())).values("audit_key")


def audit_scope(actor: Actor) -> Q | None:
    """A filter over ``AuditEvent``: the events ``actor`` may know of; None for cross_team readers
    and for a reader in every team there is (every event). One condition in the page's query: a
    primary-key probe for a run's event, and for an event of no run a membership in the (small)
    sets of their teams' operations, rules, agents, tokens and teams."""
    if not actor.team_scoped:
        return None
    assert actor.teams is not None
    mine = [t for t in actor.teams if t]
    if not Team.objects.exclude(slug=DEFAULT_TEAM).exclude(pk__in=mine).exists():
        return None  # no team but theirs (an install without teams): nothing to leave out
    of_run = Exists(Run.objects.filter(team_q(actor.teams), pk=OuterRef("run_id")))
    agents = scoped(Agent.objects.all(), actor)
    tokens = scoped(ApiToken.objects.filter(kind=ApiToken.WORKER), actor)
    slugs = list(Team.objects.filter(pk__in=mine).values_list("slug", flat=True))
    if 0 in actor.teams:
        slugs.append(DEFAULT_TEAM)
    owned = (
        Q(object_type="fleet_operation", object_id__in=_ids(scoped(FleetOperation.objects.all(), actor)))
        | Q(object_type="standing_freeze", object_id__in=_ids(rules_scoped(StandingFreeze.objects.all(), actor)))
        | Q(object_type="intake_hold", object_id__in=_ids(rules_scoped(IntakeHold.objects.all(), actor)))
        # An agent's events name its id once it exists, its name when refused or changed by name.
        | Q(object_type="agent", object_id__in=_ids(agents))
        | Q(object_type="agent", object_id__in=agents.values("name"))
        # A worker token is its team's; a person's own token is theirs, as their sign-ins are.
        | Q(object_type="token", object_id__in=tokens.values("prefix"))
        | Q(object_type="token", object_id__in=ApiToken.objects.filter(kind=ApiToken.OPERATOR).values("prefix"))
        | Q(object_type="team", object_id__in=slugs)
        | Q(object_type__in=OF_NO_TEAM)
    )  # fmt: skip
    return (Q(run_id__isnull=False) & of_run) | (Q(run_id__isnull=True) & owned)
