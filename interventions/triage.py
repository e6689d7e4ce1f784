"""Why a run needs an operator, in the operator's words: one reason per trouble it holds, read for a
page of runs at once (a query per kind of trouble, never per run). The "needs attention" list draws
them under each run (console/run_list.py); runs/search.py's ``attention_q`` decides which runs are
listed, this module only says why."""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.utils import timezone

from interventions.cards import duration
from interventions.models_jobs import Job
from runs.models import Approval, Effect, Run
from runs.search import STUCK_JOB_GRACE

SHOWN = 3  # reasons per run: the rest are on the run page
STATE_WHY = {
    "orphaned": "orphaned {age} ago: the worker's lease ran out without a release",
    "recovering": "recovering for {age}: the control plane is reconciling it with the world",
    "needs_attention": "needs a decision for {age}: a follow-up job gave up",
    "compensation_failed": "compensation failed {age} ago: committed effects could not all be undone",
}
# "WorldUnavailable: 503 from the world" -> "503 from the world": the class name is for developers.
EXCEPTION_PREFIX = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Unavailable|Timeout)?: ")


def short_error(text: str, limit: int = 80) -> str:
    said = EXCEPTION_PREFIX.sub("", (text or "").strip().splitlines()[-1] if text else "")
    return said if len(said) <= limit else said[: limit - 1] + "…"


def _age(since: datetime | None, now: datetime) -> str:
    return duration((now - since).total_seconds()) if since else "a while"


def attention_reasons(runs: Iterable[Run], now: datetime | None = None) -> dict[str, list[str]]:
    """run id -> its reasons, worst first: jobs that gave up, effects nobody knows, contradictions,
    approvals waiting on people, jobs overdue, then the state the run is in."""
    now = now or timezone.now()
    runs = list(runs)
    ids = [r.pk for r in runs]
    out: dict[str, list[str]] = {str(r.pk): [] for r in runs}
    if not ids:
        return out
    changed: dict[Any, datetime] = {r.pk: r.state_changed_at for r in runs}
    for j in Job.objects.filter(run_id__in=ids, status=Job.FAILED).order_by("-finished_at"):
        if j.run_id in changed and j.finished_at and j.finished_at >= changed[j.run_id]:
            error = short_error(j.last_error)
            out[str(j.run_id)].append(
                f"job {j.kind} failed {j.failures}×" + (f": {error}" if error else "")
            )
    effects = Effect.objects.filter(
        run_id__in=ids, status__in=(Effect.UNKNOWN, Effect.DISCREPANCY)
    ).order_by("declared_at")
    for e in effects:
        what = f"{e.tool}:{e.action}"
        if e.status == Effect.UNKNOWN:
            line = f"unknown outcome of {what} for {_age(e.outcome_at or e.declared_at, now)}"
        else:
            d = e.discrepancy or {}
            line = (
                f"{what} contradicts its reconciliation: recorded {d.get('reconciled', '?')}, "
                f"then reported {d.get('reported', '?')}"
            )
        out[str(e.run_id)].append(line)
    pending = Approval.objects.filter(run_id__in=ids, status=Approval.PENDING)
    for a in pending.order_by("requested_at"):
        out[str(a.run_id)].append(
            f"approval of {a.tool}:{a.action} waiting {_age(a.requested_at, now)} "
            f"for {a.required_role.replace('_', ' ')}"
        )
    stuck = Job.objects.filter(
        run_id__in=ids, status__in=Job.OPEN, due_at__lt=now - STUCK_JOB_GRACE
    )
    for j in stuck:
        out[str(j.run_id)].append(f"job {j.kind} overdue by {_age(j.due_at, now)}")
    for r in runs:
        if r.state in STATE_WHY and not (r.state == "needs_attention" and out[str(r.pk)]):
            out[str(r.pk)].append(STATE_WHY[r.state].format(age=_age(r.state_changed_at, now)))
    return {k: v[:SHOWN] for k, v in out.items()}


def waiting_words(a: Approval, now: datetime | None = None) -> str:
    """An approval in the inbox: what it holds up, and for how long."""
    now = now or timezone.now()
    line = f"blocks the run for {_age(a.requested_at, now)}"
    if a.deadline:
        left = (a.deadline - now).total_seconds()
        line += f"; deadline in {duration(left)}" if left > 0 else "; past its deadline"
    return line
