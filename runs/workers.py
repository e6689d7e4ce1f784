"""Reads for the Workers page (a selector: reads only). A worker is known by the name it claims with:
its execution leases say when it was last heard (a claim or a heartbeat), which runs it holds now
and which of its leases ran out; its attempts say which versions it reported at claim.

A worker that has claimed nothing in the window has left no row to read: the page says so.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.db.models import Q
from django.utils import timezone

from core.actors import Actor
from runs.models import ExecutionLease
from runs.selectors import visible_runs

WINDOW = timedelta(hours=1)
# Heard from within this long (or holding a lease that has not run out): alive. A demo worker
# heartbeats every few seconds while it holds a run (the lease TTL is longer than that).
ALIVE_S = 30
MAX_LEASES = 2000  # the newest leases of the window read at most


def _heard(lease: ExecutionLease) -> datetime:
    return max(t for t in (lease.granted_at, lease.last_heartbeat_at) if t is not None)


def workers_overview(actor: Actor, now: datetime | None = None) -> dict[str, Any]:
    """Every worker heard from in the last hour, the runs it holds, its versions, and the leases
    that expired in that hour. Only runs ``actor`` may see count (visible_runs checks the role)."""
    now = now or timezone.now()
    since = now - WINDOW
    recent = (
        Q(status=ExecutionLease.ACTIVE)
        | Q(granted_at__gte=since)
        | Q(last_heartbeat_at__gte=since)
        | Q(ended_at__gte=since)
    )
    leases = list(
        ExecutionLease.objects.filter(recent, run__in=visible_runs(actor).values("pk"))
        .select_related("run__agent", "attempt")
        .order_by("-granted_at")[:MAX_LEASES]
    )
    workers: dict[str, dict[str, Any]] = {}
    expiries = []
    for lease in leases:
        w = workers.setdefault(
            lease.worker,
            {
                "name": lease.worker,
                "last_heard": None,
                "versions": {},
                "versions_at": None,
                "holds": [],
                "runs": set(),
                "expired": 0,
            },
        )
        heard = _heard(lease)
        if w["last_heard"] is None or heard > w["last_heard"]:
            w["last_heard"] = heard
        if w["versions_at"] is None or lease.attempt.started_at > w["versions_at"]:
            w["versions"], w["versions_at"] = (
                lease.attempt.worker_versions,
                lease.attempt.started_at,
            )
        w["runs"].add(lease.run_id)
        if lease.is_live(now):
            w["holds"].append(lease)
        if lease.status == ExecutionLease.EXPIRED and lease.ended_at and lease.ended_at >= since:
            w["expired"] += 1
            expiries.append(lease)
    rows = []
    for w in workers.values():
        w["alive"] = bool(w["holds"]) or (now - w["last_heard"]).total_seconds() <= ALIVE_S
        w["run_count"] = len(w.pop("runs"))
        rows.append(w)
    rows.sort(key=lambda w: (not w["alive"], w["name"]))
    expiries.sort(key=lambda lease: lease.ended_at or since, reverse=True)
    return {
        "workers": rows,
        "alive": sum(w["alive"] for w in rows),
        "expiries": expiries,
        "truncated": len(leases) >= MAX_LEASES,
        "window_minutes": int(WINDOW.total_seconds() // 60),
        "alive_s": ALIVE_S,
    }
