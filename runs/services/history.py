"""A run's history: the hash-chained links every decision appends (runs/integrity.py walks them),
written with the run's new head in one statement. Caller holds the run lock (runs/services/decisions.py)."""

from __future__ import annotations

from typing import Any

from django.utils import timezone

from audit.chain.hashing import GENESIS, link_hash, normalise
from core.actors import Actor
from core.live import announce
from core.pg.append import insert_and_update
from runs.integrity import history_fields
from runs.models import HistoryEvent, Run


def append_history(
    run: Run,
    kind: str,
    data: dict[str, Any] | None = None,
    *,
    attempt=None,
    actor: Actor | None = None,
    run_updates: dict[str, Any] | None = None,
) -> HistoryEvent:
    """Append to the run's hash chain. Caller holds the run lock, so seq and head cannot race.
    ``run_updates``: further columns of the run row to write in the same UPDATE as the new head."""
    event = next_history(run, kind, data, attempt=attempt, actor=actor)
    # The event's INSERT and the run's head UPDATE in one round trip (see core.pg.append).
    insert_and_update(event, Run, run.pk, {**(run_updates or {}), **history_head(run, event)})
    return event


def next_history(
    run: Run,
    kind: str,
    data: dict[str, Any] | None = None,
    *,
    attempt=None,
    actor: Actor | None = None,
) -> HistoryEvent:
    """The run's next history link, hashed but not written, and the run's head moved to it in memory:
    for decisions that write it together with their other rows (``core.pg.rows.write_rows``, with
    ``history_head(run, event)`` in the run's UPDATE). Caller holds the run lock."""
    seq = run.history_seq + 1
    prev = run.history_head or GENESIS
    payload = normalise(data or {})
    # ``attempt`` may be an Attempt or its id: callers pass the id so no row is loaded just for this.
    attempt_id = getattr(attempt, "pk", attempt)
    event = HistoryEvent(
        run=run,
        seq=seq,
        kind=kind,
        attempt_id=attempt_id,
        actor=actor.label if actor else "",
        data=payload,
        created_at=timezone.now(),
        prev_hash=prev,
    )
    event.hash = link_hash(prev, history_fields(event))
    run.history_seq, run.history_head = seq, event.hash
    announce(run.pk, kind, fact_object(kind, payload))  # the console hears it after COMMIT
    return event


def fact_object(kind: str, data: dict[str, Any]) -> Any:
    """The object a history event is about (an effect, approval, intervention, plan, lease,
    checkpoint), named in the live hint so the page redraws that object only."""
    if kind == "checkpoint":
        return data.get("seq")
    for key in ("effect", "approval", "intervention", "plan", "lease", "job"):
        if isinstance(data.get(key), str):
            return data[key]
    return None


def history_head(run: Run, event: HistoryEvent) -> dict[str, Any]:
    """The run columns that record its chain's head after ``event``."""
    return {
        "history_seq": run.history_seq,
        "history_head": run.history_head,
        "updated_at": event.created_at,
    }
