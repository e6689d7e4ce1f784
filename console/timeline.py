"""One timeline per run: history, effects, interventions, approvals, leases and jobs interleaved in
commit order, filterable by kind, paginated (keyset on time), with routine denials folded.

The run's hash-chained history already holds every fact a service wrote about the run (effects,
checkpoints, claims, state changes, approvals, job results), in commit order. Three more sources
fill in what history does not say: interventions as issued (who, why), leases ending (expired or
released), follow-up jobs (queued, done, failed), and the refused decisions the audit log keeps
(claim races, a fenced-out worker), which are folded into one line per kind of refusal.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from django.http import QueryDict
from django.utils.dateparse import parse_datetime

from console.common import present
from interventions.models import Job
from interventions.selectors import (
    denials_page,
    ended_leases_page,
    history_page,
    interventions_page,
    jobs_page,
)
from runs.models import HistoryEvent, Run

PAGE = 50

# Chips: the operator's names for the kinds of fact, and the history kinds under each.
KINDS: dict[str, tuple[str, ...]] = {
    "state": ("run_created", "state_changed", "timer_fired", "timers_delivered"),
    "effect": (
        "effect_intent",
        "effect_outcome",
        "effect_denied",
        "effect_discrepancy",
        "effect_reconciled",
    ),
    "checkpoint": ("checkpoint",),
    "lease": ("attempt_started",),
    "approval": (
        "approval_requested",
        "approval_decided",
        "approval_escalated",
        "approval_superseded",
        "approval_timed_out",
    ),
    "intervention": ("ownership_transferred", "authority_suspended", "authority_changed"),
    "job": (
        "revalidation",
        "assumption_reobserved",
        "recovery_report",
        "compensation_planned",
        "compensation_started",
        "compensation_step_done",
        "compensation_finished",
        "job_failed",
    ),
    "denial": (),
}
CATEGORY = {kind: chip for chip, kinds in KINDS.items() for kind in kinds}


@dataclass
class Entry:
    at: datetime
    kind: str  # a chip of KINDS (or "other")
    ref: str  # unique on the page: the DOM id
    title: str
    detail: str = ""
    actor: str = ""
    state_from: str = ""
    state_to: str = ""
    status: str = ""
    data: dict[str, Any] | None = None
    audit: str = ""  # audit query for "the audit events of this"
    count: int = 1
    since: datetime | None = None  # a folded line: first..last
    fold_key: tuple[str, ...] | None = field(default=None, repr=False)

    @property
    def when(self) -> dict[str, str]:
        """Its time as the line shows it (UTC): machine-readable, the hover, and the label (a
        folded line's span of minutes). Formatted here: three ``date`` filters per line cost the
        timeline more than the rest of its markup."""
        at = self.at.astimezone(UTC)
        label = f"{self.since.astimezone(UTC):%H:%M}–{at:%H:%M}" if self.since else f"{at:%H:%M:%S}"
        return {
            "iso": f"{at:%Y-%m-%dT%H:%M:%SZ}",
            "title": f"{at:%Y-%m-%d %H:%M:%S}",
            "label": label,
        }


def parse_kinds(params: QueryDict) -> list[str]:
    return [k for k in params.getlist("kind") for k in k.split(",") if k in KINDS]


def parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        return parse_datetime(value.replace(" ", "+"))
    except ValueError:
        return None


def timeline(
    run: Run,
    *,
    kinds: list[str] | None = None,
    before: datetime | None = None,
    after: datetime | None = None,
    limit: int = PAGE,
    sources: set[str] | None = None,
) -> dict[str, Any]:
    """Newest first: one page before ``before`` (or the newest page), or everything after ``after``
    (the live push, up to ``limit``). ``next_before``: the cursor of the older page, if any.
    ``sources``: read only these tables (a live push knows which facts it carries)."""
    chosen = set(kinds or KINDS)
    entries: list[Entry] = []
    more = False
    for name, source in SOURCES.items():
        if sources is not None and name not in sources:
            continue
        rows, full = source(run, chosen, before, after, limit + 1)
        entries.extend(rows)
        more = more or full
    entries.sort(key=lambda e: e.at, reverse=True)
    more = more or len(entries) > limit
    entries = entries[:limit]
    return {
        "entries": fold(entries),
        "next_before": entries[-1].at.isoformat() if more and entries else None,
        "newest": entries[0].at.isoformat() if entries else None,
        "kinds": sorted(chosen) if kinds else [],
    }


def fold(entries: list[Entry]) -> list[Entry]:
    """Routine refusals of one kind on one page become one line: "12 claim races, 14:02–14:05".
    The line stands where the newest of them stood."""
    out: list[Entry] = []
    folded: dict[tuple[str, ...], Entry] = {}
    for e in entries:
        if e.fold_key is None:
            out.append(e)
            continue
        line = folded.get(e.fold_key)
        if line is None:
            folded[e.fold_key] = e
            e.since = e.at
            out.append(e)
        else:
            line.count += 1
            line.since = e.at  # newest first: each later one is older
    for line in folded.values():
        if line.count > 1:
            line.title = f"{line.count} {_plural(line.title)}"
        else:
            line.since = None
    return out


def _plural(title: str) -> str:
    return title if title.endswith("s") else f"{title}s"


def _history(run, chosen, before, after, n):
    kinds = None if chosen == set(KINDS) else [k for chip in chosen for k in KINDS[chip]]
    rows = history_page(run, kinds, before, after, n)
    return [_from_history(run, h) for h in rows], len(rows) >= n


def _from_history(run: Run, h: HistoryEvent) -> Entry:
    d = h.data or {}
    e = Entry(
        at=h.created_at,
        kind=CATEGORY.get(h.kind, "other"),
        ref=f"h-{h.seq}",
        title=h.kind.replace("_", " "),
        actor=h.actor,
        data=present(d) if d else None,
        audit=f"run={run.pk}",
    )
    if h.kind == "state_changed":
        e.title, e.state_from, e.state_to = "state", d.get("from", ""), d.get("to", "")
        e.detail = d.get("reason", "")
    elif h.kind in ("effect_intent", "effect_denied", "effect_outcome"):
        what = f"{d.get('tool', '')}:{d.get('action', '')}".strip(":")
        e.title = {
            "effect_intent": "effect declared",
            "effect_denied": "effect denied",
            "effect_outcome": "effect outcome",
        }[h.kind]
        e.status = d.get("status", "") or ("denied" if h.kind == "effect_denied" else "in_flight")
        e.detail = " ".join(x for x in (what, d.get("idempotency_key", "")) if x)
        if h.kind == "effect_denied":
            e.detail = f"{e.detail} ({d.get('reason', '')})"
            e.fold_key = ("effect_denied", what, d.get("reason", ""))
        e.data = None  # the ledger row has it all
    elif h.kind == "checkpoint":
        e.title, e.detail, e.data = f"checkpoint {d.get('seq')}", d.get("step", ""), None
    elif h.kind == "attempt_started":
        e.title = f"attempt {d.get('attempt')} claimed"
        e.detail = f"by {d.get('worker', '')}, fencing token {d.get('fencing_token')}"
        e.data = None
    elif h.kind.startswith("approval_"):
        e.status = d.get("status", "")
    elif h.kind == "revalidation":
        e.status = "passed" if d.get("ok") else "blocked"
        e.detail = ", ".join(d.get("failing") or [])
    return e


def _interventions(run, chosen, before, after, n):
    if "intervention" not in chosen:
        return [], False
    rows = interventions_page(run, before, after, n)
    return [
        Entry(
            at=i.created_at,
            kind="intervention",
            ref=f"i-{i.pk}",
            title=f"{i.kind.replace('_', ' ')} issued",
            detail=i.reason,
            actor=f"{i.actor_label} ({i.role})" if i.role else i.actor_label,
            status=i.status,
            audit=f"run={run.pk}&object_type=intervention",
        )
        for i in rows
    ], len(rows) >= n


def _leases(run, chosen, before, after, n):
    """A lease's end; its grant is the history's "attempt claimed"."""
    if "lease" not in chosen:
        return [], False
    rows = ended_leases_page(run, before, after, n)
    return [
        Entry(
            at=le.ended_at,
            kind="lease",
            ref=f"l-{le.pk}",
            title=f"lease {le.status}",
            detail=f"{le.worker}, token {le.fencing_token}: {le.end_reason}",
            status=le.status,
            audit=f"run={run.pk}&object_type=lease",
        )
        for le in rows
    ], len(rows) >= n


def _jobs(run, chosen, before, after, n):
    if "job" not in chosen:
        return [], False
    queued, ended = jobs_page(run, before, after, n)
    out = [
        Entry(at=j.created_at, kind="job", ref=f"jq-{j.pk}", title=f"{j.kind} job queued")
        for j in queued
    ]
    out += [
        Entry(
            at=j.finished_at,
            kind="job",
            ref=f"je-{j.pk}",
            title=f"{j.kind} job {j.status}",
            status=j.status,
            detail=(
                f"after {j.attempts} attempt{'s' if j.attempts != 1 else ''}"
                + (f"; last error: {j.last_error[:200]}" if j.status == Job.FAILED else "")
            ),
            audit=f"run={run.pk}&object_type=job",
        )
        for j in ended
    ]
    return out, len(queued) >= n or len(ended) >= n


def _denials(run, chosen, before, after, n):
    """Refused decisions (audited after their rollback, so not in history): a claim race, a
    fenced-out heartbeat. Folded per action and reason."""
    if "denial" not in chosen:
        return [], False
    rows = denials_page(run, before, after, n)
    out = []
    for a in rows:
        code = (a.reason or "").split(":", 1)[0]
        title = "claim race" if a.action == "run.claim" else f"{a.action} refused"
        out.append(
            Entry(
                at=a.created_at,
                kind="denial",
                ref=f"a-{a.seq}",
                title=title,
                detail=code,
                actor=a.actor,
                status="denied",
                audit=f"run={run.pk}&outcome=denied&action={a.action}",
                fold_key=("denial", a.action, code),
            )
        )
    return out, len(rows) >= n


SOURCES = {
    "history": _history,
    "intervention": _interventions,
    "lease": _leases,
    "job": _jobs,
    "denial": _denials,
}
