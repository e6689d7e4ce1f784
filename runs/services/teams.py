"""Teams: create one, add or remove a person, move an agent (docs/operator/teams.md).

Each change is one audited transaction, and so is each refusal (``decision``). Only admins (the
``manage_teams`` right) and the management commands (system actors) change teams. A membership is
one row per (team, person), unique in the database: two concurrent adds of the same person leave one
row, and the second is refused (409) — a savepoint turns the unique violation into that refusal.
"""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction

from audit.services import record_audit
from core.actors import Actor
from core.errors import Conflict, Forbidden, Invalid, NotFound
from core.names import name_problem
from core.roles import may
from runs.models import DEFAULT_TEAM, Agent, Team, TeamMembership
from runs.team_scope import EVERY_TEAM

from .decisions import decision


def _check_right(actor: Actor) -> None:
    if actor.kind != "system" and not may(actor.roles, "manage_teams"):
        raise Forbidden("changing teams needs the manage_teams right (admin)")


def _team(slug: str) -> Team:
    team = Team.objects.filter(slug=slug).first()
    if team is None:
        if slug == DEFAULT_TEAM:  # the default team's row is made when first needed
            return Team.objects.get_or_create(slug=DEFAULT_TEAM, defaults={"name": "Default"})[0]
        raise NotFound(f"no team {slug!r}", field="team")
    return team


def _user(username: str):
    user = get_user_model().objects.filter(username=username).first()
    if user is None:
        raise NotFound(f"no user {username!r}", field="username")
    return user


def create_team(*, actor: Actor, slug: str, name: str = "") -> Team:
    with decision(actor, "team.create", "team", slug):
        _check_right(actor)
        if why := name_problem(slug):
            raise Invalid(f"team name {slug!r} {why}", field="slug")
        if len(slug) > 50 or len(name) > 100:
            raise Invalid("a team's slug is at most 50 characters, its name 100", field="slug")
        if Team.objects.filter(slug=slug).exists():
            raise Conflict(f"team {slug!r} exists", field="slug")
        try:
            with transaction.atomic():  # savepoint: a concurrent create of the same slug
                team = Team.objects.create(slug=slug, name=name)
        except IntegrityError:
            raise Conflict(f"team {slug!r} exists", field="slug") from None
        record_audit(
            actor=actor, action="team.created", object_type="team", object_id=slug,
            context={"slug": slug, "name": name},
        )  # fmt: skip
    return team


def add_member(*, actor: Actor, team: str, username: str) -> TeamMembership:
    with decision(actor, "team.add_member", "team", team):
        _check_right(actor)
        row, user = _team(team), _user(username)
        try:
            with transaction.atomic():  # savepoint: the unique constraint settles a concurrent add
                membership = TeamMembership.objects.create(
                    team=row, user=user, created_by=actor.label
                )
        except IntegrityError:
            raise Conflict(f"{username} is already in team {team!r}", field="username") from None
        record_audit(
            actor=actor, action="team.member_added", object_type="team", object_id=team,
            context={"team": team, "username": username},
        )  # fmt: skip
    return membership


def remove_member(*, actor: Actor, team: str, username: str) -> None:
    with decision(actor, "team.remove_member", "team", team):
        _check_right(actor)
        row, user = _team(team), _user(username)
        # The delete's row count is the compare-and-swap: of two concurrent removals one deletes.
        deleted, _ = TeamMembership.objects.filter(team=row, user=user).delete()
        if not deleted:
            raise NotFound(f"{username} is not in team {team!r}", field="username")
        record_audit(
            actor=actor, action="team.member_removed", object_type="team", object_id=team,
            context={"team": team, "username": username},
        )  # fmt: skip


def move_agent(*, actor: Actor, agent: str, team: str) -> Agent:
    """The agent's new runs (and worker tokens issued later) belong to ``team``; runs it already has
    keep theirs (a run's team is fixed when it is created)."""
    with decision(actor, "agent.move_team", "agent", agent):
        _check_right(actor)
        row = Agent.objects.select_for_update().filter(name=agent).first()
        if row is None:
            raise NotFound(f"no agent {agent!r}", field="agent")
        before = row.team.slug if row.team is not None else DEFAULT_TEAM
        target = None if team == DEFAULT_TEAM else _team(team)
        Agent.objects.filter(pk=row.pk).update(team=target)
        row.team = target
        record_audit(
            actor=actor, action="agent.team_moved", object_type="agent", object_id=row.pk,
            context={"agent": agent, "before": before, "after": team},
        )  # fmt: skip
    return row


def team_for_new_row(team: str | None) -> Team | None:
    """The Team a new agent or token is created in (None = the default team); inside the caller's
    transaction, so an unknown name refuses the whole change."""
    if not team or team == DEFAULT_TEAM:
        return None
    found = Team.objects.filter(slug=team).first()
    if found is None:
        raise NotFound(f"no team {team!r} (manage.py teams create {team})", field="team")
    return found


def team_for_rule(actor: Actor, team: str | None) -> Team | None:
    """The team a new standing freeze or intake hold belongs to (None: every team's runs), inside
    the caller's decision: the team named, if the actor may see it (one they are in; any with
    cross_team); ``*``, every team, only under cross_team (or for a system actor); none named: the
    actor's only team (system actors: every team, as before teams). A team the actor may not see is
    refused as one that does not exist."""
    team = (team or "").strip()
    if team == EVERY_TEAM:
        if actor.teams is not None and not actor.cross_team:
            raise Forbidden(
                "a freeze or hold over every team needs the cross_team right: name your team",
                field="team",
            )
        return None
    if not team:
        if actor.teams is None:
            return None
        if len(actor.teams) != 1:
            raise Invalid("you are in several teams: name the team it is for", field="team")
        (key,) = actor.teams
        return _team(DEFAULT_TEAM) if key == 0 else Team.objects.get(pk=key)
    found = None if team == DEFAULT_TEAM else Team.objects.filter(slug=team).first()
    key = 0 if team == DEFAULT_TEAM else (found.pk if found else -1)
    if key == -1 or not actor.sees_team(key):
        raise Invalid(f"no team {team!r}", field="team")
    return found or _team(DEFAULT_TEAM)
