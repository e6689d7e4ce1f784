"""Reading the audit trail: one filter, used by the console's audit page and the API alike."""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

from django.db import connections
from django.db.models import Q, QuerySet

from core import pg
from core.filters import BadFilter, parse_id_prefix, prefix_range

from .models import AuditEvent


def audit_events(
    *,
    action: str = "",
    actor: str = "",
    outcome: str = "",
    object_type: str = "",
    component: str = "",
    run_id: str = "",
    after_seq: int | None = None,
    before_seq: int | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    runs_only: bool = False,
    scope: Q | None = None,
) -> QuerySet[AuditEvent]:
    """Audit events matching every filter given (empty = no filter), unordered.

    ``runs_only``: only events of a run -- what a caller without ``audit_read_all`` may read
    (core.roles; sign-ins, tokens, agents and anchors belong to no run).

    ``action`` names an action or a family of them: ``intervention`` matches ``intervention.pause``,
    ``run.claim`` matches only itself. ``actor`` matches part of the actor's name, case-insensitive.
    ``run_id`` is a run id or its prefix (the 8 characters pages show); one that is not hexadecimal
    matches nothing (it cannot name a run). ``since`` / ``until`` bound ``created_at``. ``scope``:
    the events the reader may know of, None for all (interventions.audit_scope: a team-limited
    reader's teams', docs/operator/teams.md)."""
    qs = AuditEvent.objects.all()
    if runs_only:
        qs = qs.filter(run_id__isnull=False)
    if scope is not None:  # their teams' events only (interventions.audit_scope)
        qs = qs.filter(scope)
    if action:
        family = action if action.endswith(".") else action + "."
        qs = qs.filter(Q(action=action.rstrip(".")) | Q(action__startswith=family))
    if actor:
        qs = qs.filter(actor__icontains=actor)
    if outcome:
        qs = qs.filter(outcome=outcome)
    if object_type:
        qs = qs.filter(object_type=object_type)
    if component:
        qs = qs.filter(component=component)
    if run_id:
        try:
            low, high = prefix_range(parse_id_prefix("run", str(run_id)))
        except BadFilter:
            qs = qs.none()
        else:
            qs = qs.filter(run_id__gte=low, run_id__lte=high)
    if since is not None:
        qs = qs.filter(created_at__gte=since)
    if until is not None:
        qs = qs.filter(created_at__lte=until)
    if after_seq is not None:
        qs = qs.filter(seq__gt=after_seq)
    if before_seq is not None:
        qs = qs.filter(seq__lt=before_seq)
    return qs


# -- the settled horizon --------------------------------------------------------------------------
#
# ``seq`` comes from a PostgreSQL sequence, taken inside the appending transaction: a transaction that
# took seq 10 may commit after one that took seq 11. A reader paging by ``after_seq`` that saw 11
# would move its cursor past 10 and never see it. So readers that page forwards hand out only events
# at or below the *settled* horizon: a seq no transaction still in flight can hold.
#
# Why the horizon below is sound: the append statement (audit/chain/append.py) writes the chain head (which
# gives the transaction its id) before it calls nextval, so a transaction holding a seq ≤ L, where L
# is the sequence's last value read at some moment, already had a transaction id at that moment.
# Once every transaction of this database that had an id then has ended, every seq ≤ L is committed
# or never will be. Read-only transactions have no id and hold no seq.

SETTLE_WAIT_S = 1.0
_POLL_S = 0.005


def settled_seq(
    *, floor: int = 0, wait_s: float = SETTLE_WAIT_S, using: str = "default"
) -> int | None:
    """The highest ``seq`` at or below which every audit event that will ever exist is visible now,
    or ``None`` where appends are serialised (not PostgreSQL: no horizon needed).

    Waits up to ``wait_s`` for the transactions in flight to end (decisions take milliseconds); a
    transaction held open longer holds readers at ``floor`` (their cursor): they get nothing new
    rather than skip an event, and ask again. Call it outside a repeatable-read snapshot: the page
    query that follows must see what committed meanwhile."""
    connection = connections[using]
    if not pg.enabled(connection):
        return None
    deadline = time.monotonic() + wait_s
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM audit_event_order"
        )
        (last,) = cursor.fetchone()
        holders = None
        while True:
            if connection.in_atomic_block:
                # pg_stat_activity is read once per transaction: clear it so a caller's open
                # transaction still sees the others end.
                cursor.execute("SELECT pg_stat_clear_snapshot()")
            cursor.execute(
                "SELECT coalesce(array_agg(backend_xid::text), '{}') FROM pg_stat_activity "
                "WHERE datname = current_database() AND backend_xid IS NOT NULL AND pid <> pg_backend_pid() "
                "AND (%s::text[] IS NULL OR backend_xid::text = ANY(%s::text[]))",
                [holders, holders],
            )
            holders = list(cursor.fetchone()[0])
            if not holders:
                return max(int(last), floor)
            if time.monotonic() >= deadline:
                return floor
            time.sleep(_POLL_S)


def outside_runs(*, action: str = "", object_type: str = "", component: str = "") -> str:
    """For a caller who reads only the events of runs: the filter that names events of no run only
    (``object_type=token``, ``action=login``, ``component=admin``), or "". Such a request asks for
    the part of the log it may not read: refused (403) and audited, rather than answered empty as if
    nothing had happened there. A filter matching nothing at all is no such ask."""
    for name, value in (("action", action), ("object_type", object_type), ("component", component)):
        if not value:
            continue
        named = audit_events(
            action=value if name == "action" else "",
            object_type=value if name == "object_type" else "",
            component=value if name == "component" else "",
        )
        if not named.filter(run_id__isnull=False).exists() and named.exists():
            return f"{name}={value}"
    return ""


def object_types() -> QuerySet:
    """Every object type the trail names, for the audit page's filter."""
    return AuditEvent.objects.order_by().values_list("object_type", flat=True).distinct()


def components() -> QuerySet:
    """Every component that wrote to the trail, for the audit page's filter."""
    return AuditEvent.objects.order_by().values_list("component", flat=True).distinct()


def chain_event(chain: str, chain_seq: int) -> AuditEvent | None:
    """The event at ``chain_seq`` of ``chain`` (the first broken link a verification names)."""
    return AuditEvent.objects.filter(chain=chain, chain_seq=chain_seq).first()


def run_audit_events(run_id: Any, limit: int) -> list[AuditEvent]:
    """A run's newest audit events."""
    return list(AuditEvent.objects.filter(run_id=run_id).order_by("-seq")[:limit])


def events_page(qs: QuerySet[AuditEvent], *, newer_first: bool, n: int) -> list[AuditEvent]:
    """Up to ``n`` of ``qs`` by seq, newest first or oldest first (a keyset page)."""
    return list(qs.order_by("-seq" if newer_first else "seq")[:n])
