"""What runs/ keeps, verified: every run's history chain, and the effect ledger against the history.

Registered with ``audit.registry`` at startup (``RunsConfig.ready``), so ``audit_verify`` checks these
in the same snapshot as the audit chain. Each check names its first broken position.

The ledger rule: every effect row was written together with a history event (services are the only
writers, one transaction per decision), so the history explains the ledger. An effect needs its
declaration event (``effect_intent`` when authorised, ``effect_denied`` when denied), and its current
status must be the last status the history recorded for it (``in_flight``/``denied`` if none). A ledger
row changed by hand (a status set without the decision that sets it) or deleted no longer matches.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from datetime import timedelta
from functools import reduce
from operator import or_
from typing import Any

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from audit.chain.hashing import GENESIS, link_hash
from runs.models import Effect, HistoryEvent, Run

# History kinds that change an effect's status, and the data key holding the new status.
STATUS_EVENTS = {"effect_outcome": "status", "effect_reconciled": "now"}
DECLARATION_EVENTS = {"effect_intent": Effect.AUTHORIZED, "effect_denied": Effect.DENIED}
MAX_REPORTED = 20


def history_fields(event: HistoryEvent) -> dict[str, Any]:
    return {
        "run": str(event.run_id),
        "seq": event.seq,
        "kind": event.kind,
        "attempt": str(event.attempt_id) if event.attempt_id else None,
        "actor": event.actor,
        "data": event.data,
        "created_at": event.created_at,
    }


# --- history chains --------------------------------------------------------------------------------


def walk_history(events: Iterable[HistoryEvent], head_seq: int, head_hash: str) -> dict[str, Any]:
    """Walk one run's events in seq order against the run row's head; name the first broken link."""
    prev, prev_prev, expected = GENESIS, None, 1
    for event in events:
        if event.seq != expected:
            problem = "deleted" if event.seq > expected else "reordered"
            return _broken(expected, problem, f"expected seq {expected}, found {event.seq}")
        intact = link_hash(event.prev_hash, history_fields(event)) == event.hash
        if event.prev_hash != prev:
            if prev_prev is not None and event.prev_hash == prev_prev:
                return _broken(
                    expected - 1, "inserted", f"seq {expected} links past seq {expected - 1}"
                )
            if (
                intact
            ):  # the row is whole but its predecessor changed under it (rewritten and rehashed)
                return _broken(
                    expected - 1, "edited", f"seq {expected} does not link to seq {expected - 1}"
                )
            return _broken(
                expected, "reordered", f"seq {expected} does not link to seq {expected - 1}"
            )
        if not intact:
            return _broken(
                expected, "edited", f"seq {expected}'s stored hash does not match its content"
            )
        prev_prev, prev, expected = prev, event.hash, expected + 1
    count = expected - 1
    if head_seq > count:
        return _broken(
            count + 1, "deleted", f"the run's head says {head_seq} events, found {count}"
        )
    if head_seq < count:
        return _broken(
            head_seq + 1, "inserted", f"the run's head says {head_seq} events, found {count}"
        )
    if (head_hash or GENESIS) != prev:
        return _broken(
            count, "edited", f"seq {count}'s hash is not the one the run's head recorded"
        )
    return {"ok": True, "checked": count}


def _broken(seq: int, problem: str, detail: str) -> dict[str, Any]:
    return {"ok": False, "first_broken_seq": seq, "problem": problem, "detail": detail}


def verify_histories() -> dict[str, Any]:
    """Every run's chain; one pass over the history table in (run, seq) order."""
    heads = {
        pk: (seq, head)
        for pk, seq, head in Run.objects.values_list("pk", "history_seq", "history_head")
    }
    broken, runs, events = [], 0, 0
    for run_id, group in _by_run(
        HistoryEvent.objects.order_by("run_id", "seq").iterator(chunk_size=2000)
    ):
        runs += 1
        events += len(group)
        if run_id not in heads:
            broken.append(
                {
                    "run": str(run_id),
                    **_broken(1, "orphaned", "history of a run that does not exist"),
                }
            )
            continue
        walked = walk_history(group, *heads.pop(run_id))
        if not walked["ok"]:
            broken.append({"run": str(run_id), **walked})
    for run_id, (seq, _) in heads.items():  # runs whose every history row is gone
        if seq:
            runs += 1
            broken.append(
                {
                    "run": str(run_id),
                    **_broken(1, "deleted", f"the run's head says {seq} events, found 0"),
                }
            )
    report: dict[str, Any] = {"ok": not broken, "runs": runs, "events": events}
    if broken:
        first = broken[0]
        report |= {
            "broken": broken[:MAX_REPORTED],
            "broken_runs": len(broken),
            "summary": f"run {first['run']} history broken at seq {first['first_broken_seq']}: "
            f"{first['problem']} ({first['detail']})",
        }
    return report


def _by_run(events: Iterator[HistoryEvent]) -> Iterator[tuple[Any, list[HistoryEvent]]]:
    run_id: Any = None
    group: list[HistoryEvent] = []
    for event in events:
        if event.run_id != run_id and group:
            yield run_id, group
            group = []
        run_id = event.run_id
        group.append(event)
    if group:
        yield run_id, group


# --- the ledger against the history ----------------------------------------------------------------


def verify_ledger() -> dict[str, Any]:
    told = _history_of_effects()
    problems, checked = [], 0
    for pk, run_id, decision, status in (
        Effect.objects.order_by("declared_at", "pk")
        .values_list("pk", "run_id", "decision", "status")
        .iterator(chunk_size=2000)
    ):
        checked += 1
        why = _explained(told.pop(str(pk), None), run_id, decision, status)
        if why:
            problems.append(
                {"effect": str(pk), "run": str(run_id), "problem": why[0], "detail": why[1]}
            )
    for effect_id, story in told.items():  # the history names effects the ledger no longer has
        problems.append(
            {
                "effect": effect_id,
                "run": str(story["run"]),
                "problem": "missing_from_ledger",
                "detail": f"history seq {story['seq']} records it, the ledger has no such effect",
            }
        )
    report: dict[str, Any] = {"ok": not problems, "effects": checked}
    if problems:
        first = problems[0]
        report |= {
            "problems": problems[:MAX_REPORTED],
            "count": len(problems),
            "summary": f"effect {first['effect']} (run {first['run']}): {first['problem']} ({first['detail']})",
        }
    return report


def _history_of_effects() -> dict[str, dict[str, Any]]:
    """effect id -> what the history says: its run, how it was declared, its last recorded status."""
    told: dict[str, dict[str, Any]] = {}
    kinds = [*DECLARATION_EVENTS, *STATUS_EVENTS]
    rows = (
        HistoryEvent.objects.filter(kind__in=kinds)
        .order_by("run_id", "seq")
        .values_list("run_id", "seq", "kind", "data")
        .iterator(chunk_size=2000)
    )
    for run_id, seq, kind, data in rows:
        effect_id = data.get("effect") if isinstance(data, dict) else None
        if not effect_id:
            continue
        story = told.setdefault(
            effect_id, {"run": run_id, "seq": seq, "declared": None, "status": None}
        )
        if kind in DECLARATION_EVENTS:
            story["declared"] = DECLARATION_EVENTS[kind]
        else:
            story["status"], story["status_seq"] = data.get(STATUS_EVENTS[kind]), seq
    return told


def _explained(
    story: dict[str, Any] | None, run_id: Any, decision: str, status: str
) -> tuple[str, str] | None:
    if story is None or story["declared"] is None:
        return (
            "no_history",
            f"the ledger has a {decision} effect ({status}) the history never recorded",
        )
    if story["run"] != run_id:
        return "wrong_run", f"the history records it under run {story['run']}"
    if story["declared"] != decision:
        return "decision_mismatch", f"the ledger says {decision}, the history {story['declared']}"
    expected = story["status"] or (
        Effect.IN_FLIGHT if decision == Effect.AUTHORIZED else Effect.DENIED
    )
    if status != expected:
        where = f"history seq {story['status_seq']}" if story["status"] else "its declaration"
        return "status_without_history", f"the ledger says {status}, {where} says {expected}"
    return None


# --- run history heads, signed with every audit anchor ---------------------------------------------


def anchor_run_heads() -> list[list[Any]]:
    """[run, history_seq, history_head] of every run whose history moved in the last three anchor
    intervals (newest first, at most ANCHOR_MAX_RUNS): each change is signed by two or more anchors, so
    a run's history rewritten and rehashed afterwards, head and all, no longer matches."""
    window = timedelta(seconds=3 * (settings.ANCHOR_INTERVAL_S or 60))
    rows = (
        Run.objects.filter(updated_at__gte=timezone.now() - window, history_seq__gt=0)
        .order_by("-updated_at")
        .values_list("pk", "history_seq", "history_head")[: settings.ANCHOR_MAX_RUNS]
    )
    return [[str(pk), seq, head] for pk, seq, head in rows]


def check_anchored_run_heads(anchored: list[tuple[str, Any]]) -> dict[str, Any]:
    """Every anchored (run, seq, head) must still be the hash of that run's history row at that seq."""
    first_at: dict[tuple[str, int, str], str] = {}
    for at, heads in anchored:
        for run_id, seq, head in heads:
            first_at.setdefault((run_id, seq, head), at)
    stored = _history_hashes(sorted({(run_id, seq) for run_id, seq, _ in first_at}))
    problems: dict[str, dict[str, Any]] = {}
    for (run_id, seq, head), at in sorted(first_at.items(), key=lambda item: item[0][1]):
        have = stored.get((run_id, seq))
        if have == head or run_id in problems:  # per run, the lowest anchored seq that fails
            continue
        problem = "cut" if have is None else "rewritten"
        problems[run_id] = {
            "run": run_id,
            "first_broken_seq": seq,
            "problem": problem,
            "detail": f"the anchor of {at} signed seq {seq} ({head[:12]}…), the history "
            + ("has no such row" if have is None else f"holds {have[:12]}… there"),
        }
    report: dict[str, Any] = {"ok": not problems, "checked": len(first_at)}
    if problems:
        first = min(problems.values(), key=lambda p: (p["first_broken_seq"], p["run"]))
        report |= {
            "problems": list(problems.values())[:MAX_REPORTED],
            "summary": f"run {first['run']} history {first['problem']} at seq "
            f"{first['first_broken_seq']} ({first['detail']})",
        }
    return report


def _history_hashes(keys: list[tuple[str, int]]) -> dict[tuple[str, int], str]:
    stored: dict[tuple[str, int], str] = {}
    for i in range(0, len(keys), 200):
        match = reduce(or_, (Q(run_id=run_id, seq=seq) for run_id, seq in keys[i : i + 200]))
        for run_id, seq, value in HistoryEvent.objects.filter(match).values_list(
            "run_id", "seq", "hash"
        ):
            stored[(str(run_id), seq)] = value
    return stored
