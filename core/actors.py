"""Who did it, and from where: carried from the edge (view, task, command) into every service."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Actor:
    kind: str  # "user" | "worker" | "system"
    name: str
    role: str = ""
    user_id: int | None = None
    token_id: int | None = None
    agents: tuple[str, ...] = ()  # worker tokens: agents it may act for (empty = any)
    on_behalf_of: str = ""
    component: str = "api"  # where the action was observed
    source_ip: str = ""
    user_agent: str = ""
    request_id: str = ""
    roles: frozenset[str] = field(default_factory=frozenset)
    # Team ids whose runs this actor acts on; 0 = the default team (rows with no team). None: not
    # scoped by team (system actors, and callers built before teams existed). cross_team: the right
    # to act on any team's runs (core.roles "cross_team"); the audit marks its use on other teams'.
    teams: frozenset[int] | None = None
    cross_team: bool = False

    @property
    def is_worker(self) -> bool:
        return self.kind == "worker"

    @property
    def label(self) -> str:
        return f"{self.kind}:{self.name}"

    def may_act_for(self, agent_name: str) -> bool:
        return not self.agents or agent_name in self.agents

    @property
    def team_scoped(self) -> bool:
        """True: only the runs of ``teams`` exist for this actor."""
        return self.teams is not None and not self.cross_team

    def in_team(self, team_id: int | None) -> bool:
        """A row owned by ``team_id`` (None = the default team) is in one of the actor's teams."""
        return self.teams is None or (team_id or 0) in self.teams

    def sees_team(self, team_id: int | None) -> bool:
        return self.cross_team or self.in_team(team_id)

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "name": self.name,
            "role": self.role,
            "on_behalf_of": self.on_behalf_of,
        }


def system_actor(component: str, name: str = "controlplane") -> Actor:
    return Actor(kind="system", name=name, role="system", component=component)
