"""Console audit review: filtered trail, chain verification (first broken link), JSON Lines export.

Reads only. The Django admin serves the same rows read-only; this page adds verification and export.
"""

from __future__ import annotations

import tempfile
from datetime import datetime
from urllib.parse import urlencode

from django.core.exceptions import BadRequest, PermissionDenied
from django.http import FileResponse, HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.http import require_GET

from audit.integrity import verify_for_people
from audit.models import AuditEvent
from audit.selectors import (
    audit_events,
    chain_event,
    components,
    events_page,
    object_types,
    outside_runs,
    settled_seq,
)
from audit.services import export_jsonl, record_audit
from console.common import ConsoleRequest, console_view, is_fragment, present
from core.filters import BadFilter, check_text, parse_id_prefix, parse_when
from core.limits import parse_seq
from core.roles import may, reads_whole_audit_log
from interventions.audit_scope import audit_scope

PAGE = 100
FILTERS = ("action", "actor", "outcome", "object_type", "component", "run", "since", "until")
TEXT_LIMITS = {"action": 60, "actor": 150, "object_type": 30, "component": 30}


def _seq_param(request: HttpRequest, name: str) -> int | None:
    """A sequence number from the query string, or a 400 page naming it (never a 500 from int() or
    from PostgreSQL's bigint)."""
    try:
        return parse_seq(request.GET.get(name))
    except ValueError as exc:
        raise BadRequest(f"{name}: {exc}") from None


def audit_filters(request: HttpRequest) -> dict[str, str]:
    """The filters as written (they go back into the form and the URL), each checked: a bad value is
    a 400 page naming it."""
    filters = {name: request.GET.get(name, "").strip() for name in FILTERS}
    try:
        for name, limit in TEXT_LIMITS.items():
            check_text(name, filters[name], max_len=limit)
        if filters["outcome"] and filters["outcome"] not in OUTCOMES:
            raise BadFilter("outcome", f"one of {', '.join(OUTCOMES)}")
        if filters["run"]:
            parse_id_prefix("run", filters["run"])
        for name in ("since", "until"):
            if filters[name]:
                parse_when(name, filters[name])
    except BadFilter as exc:
        raise BadRequest(exc.detail) from None
    return filters


OUTCOMES = [AuditEvent.ALLOWED, AuditEvent.DENIED, AuditEvent.ERROR]


def refuse(request: ConsoleRequest, detail: str) -> PermissionDenied:
    """A read of the audit trail the caller's roles do not cover: audited, then a 403 page."""
    record_audit(
        actor=request.actor,
        action="console.denied",
        object_type="page",
        object_id=request.path[:64],
        outcome=AuditEvent.DENIED,
        reason=f"forbidden: {detail}",
        context={
            "method": request.method,
            "path": request.path,
            "query": request.GET.urlencode()[:500],
        },
    )
    return PermissionDenied(detail)


def audit_context(request: ConsoleRequest) -> dict:
    """One page by keyset on seq: ``before`` walks to older events, ``after`` back to newer ones;
    either way two queries at most, whatever the depth."""
    filters = audit_filters(request)
    whole = reads_whole_audit_log(request.roles)  # core.roles "audit_read_all"
    if not whole and (
        asked := outside_runs(
            action=filters["action"],
            object_type=filters["object_type"],
            component=filters["component"],
        )
    ):
        raise refuse(
            request, f"{asked} names events of no run: the whole audit log needs audit_read_all"
        )
    before, after = _seq_param(request, "before"), _seq_param(request, "after")
    if before is None:
        # The newest page and newer pages end at the settled horizon, so the "newer" link's cursor
        # never passes an event still being committed (audit/selectors.py).
        horizon = settled_seq(floor=after or 0)
        before = None if horizon is None else horizon + 1
        newest = True
    else:
        newest = False
    now = timezone.now()
    qs = audit_events(
        action=filters["action"],
        actor=filters["actor"],
        outcome=filters["outcome"],
        object_type=filters["object_type"],
        component=filters["component"],
        run_id=filters["run"],
        before_seq=before,
        after_seq=after if newest else None,
        since=parse_when("since", filters["since"], now=now) if filters["since"] else None,
        until=parse_when("until", filters["until"], now=now) if filters["until"] else None,
        runs_only=not whole,
        scope=audit_scope(request.actor),  # their teams' events only (docs/operator/teams.md)
    )
    newer_first = not newest or after is None
    rows = events_page(qs, newer_first=newer_first, n=PAGE + 1)
    more = len(rows) > PAGE
    rows = rows[:PAGE]
    if not newer_first:
        rows.reverse()
    query = urlencode({k: v for k, v in filters.items() if v})
    has_older = more if newer_first else True
    has_newer = (not newest) if newer_first else more
    return {
        "events": [{"a": a, "context": present(a.context)} for a in rows],
        "filters": filters,
        "next_before": rows[-1].seq if has_older and rows else None,
        "prev_after": rows[0].seq if has_newer and rows else None,
        "first_page": newest and after is None,
        "query": query,
        "outcomes": OUTCOMES,
        "may_export": may(request.roles, "audit_export"),
        "may_verify": may(request.roles, "audit_verify"),
        "whole_log": whole,
        "nav": "audit",
    }


@console_view
@require_GET
def audit_page(request: ConsoleRequest) -> HttpResponse:
    ctx = audit_context(request)
    if is_fragment(request):
        return render(request, "console/audit_list.html#events", ctx)
    ctx["object_types"] = object_types()
    ctx["components"] = components()
    return render(request, "console/audit_list.html", ctx)


@console_view
@require_GET
def audit_verify(request: ConsoleRequest) -> HttpResponse:
    """Run every check ``audit_verify`` runs (audit chains, run histories, the ledger, anchors once
    written) now; the answer first, then the first break named with its event."""
    if not may(request.roles, "audit_verify"):
        raise refuse(request, "verifying the audit trail needs the audit_verify permission")
    result = verify_for_people(named=audit_scope(request.actor) is None)
    chain = result["report"]["chain"]
    broken = (
        chain_event(chain["chain"], chain["first_broken_seq"])
        if not chain["ok"] and chain.get("first_broken_seq")
        else None
    )
    anchored_at = result["anchored_at"]
    return render(
        request,
        "console/audit_list.html#verify",
        {
            "result": result,
            "broken": broken,
            "checked_at": timezone.now(),
            "anchored_at": datetime.fromisoformat(anchored_at) if anchored_at else None,
        },
    )


@console_view
@require_GET
def audit_export(request: ConsoleRequest) -> FileResponse:
    """JSON Lines, one event per line with its hashes (role audit_export). Spooled, so a long chain
    goes to a temporary file instead of memory."""
    if not may(request.roles, "audit_export"):
        raise refuse(request, "exporting the audit log needs the audit_export permission")
    since = _seq_param(request, "since_seq") or 0
    spool = tempfile.SpooledTemporaryFile(max_size=8 * 1024 * 1024, mode="w+b")
    writer = _Utf8Writer(spool)
    export_jsonl(writer, since, scope=audit_scope(request.actor))
    spool.seek(0)
    name = f"audit-{timezone.now():%Y%m%dT%H%M%SZ}.jsonl"
    return FileResponse(
        spool, as_attachment=True, filename=name, content_type="application/x-ndjson"
    )


class _Utf8Writer:
    def __init__(self, raw):
        self.raw = raw

    def write(self, text: str) -> None:
        self.raw.write(text.encode("utf-8"))
