"""Teams over the API (docs/operator/teams.md): the caller's teams with their run counts, and for
admins (``manage_teams``) creating a team and changing its members (runs.services.teams, audited).
A team the caller is not in (and holds no cross_team right for) answers 404, as one never made."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from ninja import Router
from ninja.responses import Status
from pydantic import Field

from api.auth import caller, refuse
from api.responses import ERRORS_READ, ERRORS_WRITE, Out
from api.schemas import Schema
from core.actors import Actor
from core.errors import NotFound
from core.roles import may
from runs.services import teams
from runs.team_scope import members, teams_for

router = Router(tags=["teams"])


class TeamOut(Out):
    slug: str
    runs: int
    member: bool


class TeamListOut(Out):
    teams: list[TeamOut]
    cross_team: bool


class TeamDetailOut(TeamOut):
    members: list[str]


class TeamIn(Schema):
    slug: str = Field(min_length=1, max_length=50)
    name: str = Field(default="", max_length=100)


class MemberIn(Schema):
    username: str = Field(min_length=1, max_length=150)


def _person(request: HttpRequest) -> Actor:
    actor = caller(request)
    if actor.is_worker or not may(actor.roles, "view"):
        raise refuse(request, "teams are for people with a console role")
    return actor


def _shown(actor: Actor, slug: str) -> dict[str, Any]:
    for row in teams_for(actor):
        if row["slug"] == slug:
            return {k: row[k] for k in ("slug", "runs", "member")}
    raise NotFound(f"no team {slug!r}", object="team")


@router.get("/teams", response={200: TeamListOut, **ERRORS_READ})
def list_teams(request: HttpRequest) -> Any:
    actor = _person(request)
    rows = [{k: r[k] for k in ("slug", "runs", "member")} for r in teams_for(actor)]
    return {"teams": rows, "cross_team": actor.cross_team}


@router.post("/teams", response={201: TeamOut, **ERRORS_WRITE})
def create_team(request: HttpRequest, body: TeamIn) -> Any:
    actor = _person(request)
    team = teams.create_team(actor=actor, slug=body.slug, name=body.name)
    return Status(201, {"slug": team.slug, "runs": 0, "member": False})


@router.get("/teams/{slug}", response={200: TeamDetailOut, **ERRORS_READ})
def get_team(request: HttpRequest, slug: str) -> Any:
    actor = _person(request)
    return _shown(actor, slug) | {"members": members(slug)}


@router.post("/teams/{slug}/members", response={201: TeamDetailOut, **ERRORS_WRITE})
def add_member(request: HttpRequest, slug: str, body: MemberIn) -> Any:
    actor = _person(request)
    _shown(actor, slug)  # another team's: 404 before the right is even checked
    teams.add_member(actor=actor, team=slug, username=body.username)
    return Status(201, _shown(actor, slug) | {"members": members(slug)})


@router.delete("/teams/{slug}/members/{username}", response={200: TeamDetailOut, **ERRORS_WRITE})
def remove_member(request: HttpRequest, slug: str, username: str) -> Any:
    actor = _person(request)
    _shown(actor, slug)
    teams.remove_member(actor=actor, team=slug, username=username)
    return _shown(actor, slug) | {"members": members(slug)}
