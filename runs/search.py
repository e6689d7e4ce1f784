"""Run selection from a query string, shared by the run list, the API and fleet operations.

Minimal until the full search (keyset paging, id prefixes, time range, tool:action, owner) lands:
``state`` (repeated or comma-separated), ``agent`` and ``id`` (repeated or comma-separated UUIDs).
``RunFilter.from_query`` raises :class:`core.errors.Invalid` naming the field for a bad value.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from django.db.models import QuerySet

from core.actors import Actor
from core.errors import Invalid
from runs.models import Run
from runs.selectors import visible_runs
from runs.states import State

MAX_IDS = 1000


def _values(query: Any, name: str) -> list[str]:
    raw = query.getlist(name) if hasattr(query, "getlist") else query.get(name) or []
    if isinstance(raw, str):
        raw = [raw]
    return [v.strip() for item in raw for v in str(item).split(",") if v.strip()]


@dataclass(frozen=True)
class RunFilter:
    states: tuple[str, ...] = ()
    agent: str = ""
    ids: tuple[uuid.UUID, ...] = field(default_factory=tuple)

    @classmethod
    def from_query(cls, query: Any) -> RunFilter:
        """From a QueryDict (or a plain dict of str / list values)."""
        states = tuple(dict.fromkeys(_values(query, "state")))
        known = {s.value for s in State}
        bad = [s for s in states if s not in known]
        if bad:
            raise Invalid(f"unknown state(s) {bad}; states are {sorted(known)}", field="state")
        agents = _values(query, "agent")
        if len(agents) > 1:
            raise Invalid("give one agent", field="agent")
        raw_ids = _values(query, "id")
        if len(raw_ids) > MAX_IDS:
            raise Invalid(f"at most {MAX_IDS} ids", field="id")
        try:
            ids = tuple(dict.fromkeys(uuid.UUID(v) for v in raw_ids))
        except ValueError:
            raise Invalid("id must be full run ids (UUIDs)", field="id") from None
        return cls(states=states, agent=agents[0] if agents else "", ids=ids)

    def queryset(self, actor: Actor) -> QuerySet[Run]:
        qs = visible_runs(actor)
        if self.states:
            qs = qs.filter(state__in=self.states)
        if self.agent:
            qs = qs.filter(agent__name=self.agent)
        if self.ids:
            qs = qs.filter(pk__in=self.ids)
        return qs

    def as_query(self) -> str:
        """The filter as a query string: what a fleet operation records and a link carries."""
        from urllib.parse import urlencode

        pairs = [("state", s) for s in self.states]
        pairs += [("agent", self.agent)] if self.agent else []
        pairs += [("id", str(i)) for i in self.ids]
        return urlencode(pairs)

    @property
    def empty(self) -> bool:
        return not (self.states or self.agent or self.ids)
