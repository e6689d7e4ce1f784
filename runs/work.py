"""Work for workers: which queued runs a worker may claim now, and the wake-up key that tells a
long-polling worker a run became claimable (sent in the deciding transaction, like a directive)."""

from __future__ import annotations

from datetime import datetime

from django.db.models import Min, Q
from django.utils import timezone

from core.actors import Actor
from runs.models import Agent, Run
from runs.services.intake import not_held
from runs.states import State
from runs.team_scope import scoped

# The channel services NOTIFY on in the deciding transaction (runs/services/decisions.py) and the
# directive bus LISTENs on (runs/directive_bus.py): a run id wakes its heartbeats, a work_key its workers.
NOTIFY_CHANNEL = "cp_runs"


def work_key(agent_id: int) -> str:
    """The NOTIFY payload for "a run of this agent became claimable" (cf. a run id for a directive)."""
    return f"work:{agent_id}"


def agent_ids(names: list[str] | None, actor: Actor | None = None) -> dict[str, int]:
    """Registered agents by name (``None``: every agent), of ``actor``'s team if given."""
    agents = Agent.objects.all() if names is None else Agent.objects.filter(name__in=names)
    if actor is not None:
        agents = scoped(agents, actor)
    return dict(agents.values_list("name", "pk"))


def _waiting(ids: list[int], worker: str, actor: Actor | None = None):
    # Runs a live intake hold covers stay queued, out of every worker's sight until released.
    runs = Run.objects.filter(agent_id__in=ids, state=State.QUEUED)
    if actor is not None:  # a run keeps its team when its agent moves to another
        runs = scoped(runs, actor)
    return not_held(runs).filter(
        Q(execution_pin="") | Q(execution_pin__isnull=True) | Q(execution_pin=worker)
    )


def claimable_runs(
    ids: list[int], worker: str, limit: int = 5, actor: Actor | None = None
) -> list[str]:
    """Oldest first, so no run starves behind newer ones; retry backoff respected."""
    now = timezone.now()
    due = Q(claimable_after__isnull=True) | Q(claimable_after__lte=now)
    rows = (
        _waiting(ids, worker, actor).filter(due).order_by("created_at").values_list("pk", flat=True)
    )
    return [str(pk) for pk in rows[:limit]]


def next_due(ids: list[int], worker: str, actor: Actor | None = None) -> datetime | None:
    """When the earliest run in retry backoff becomes claimable (a waiter wakes itself then)."""
    later = _waiting(ids, worker, actor).filter(claimable_after__gt=timezone.now())
    return later.aggregate(at=Min("claimable_after"))["at"]
