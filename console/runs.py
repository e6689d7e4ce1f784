"""The operator console: run list and run detail (server-rendered, htmx, live over Channels).

One template serves the full page, its htmx swap and its WebSocket push (Django 6 template
partials). Views read through the selectors and never write; console/interventions.py calls the
services. Pushes are hints: ``render_list_push`` / ``render_detail_push`` re-render from the database,
and console/consumers.py sends them on every (re)connect and on every "run.changed".
"""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

from django.contrib.auth import get_user_model
from django.core.exceptions import BadRequest
from django.http import Http404, HttpResponse, QueryDict
from django.shortcuts import redirect, render
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET

from audit.models import AuditEvent
from console.common import (
    ConsoleRequest,
    console_view,
    is_fragment,
    kind_label,
    present,
    visible_run_or_404,
)
from console.reports import receipt_rest, run_reports
from core.auth import actor_for_user
from core.filters import BadFilter, check_text
from core.roles import may, roles_of
from interventions.base import descendants
from interventions.contracts import CONTRACT_SPECS
from interventions.jobs import attention
from interventions.selectors import receipt_dict
from interventions.transfer import holders
from runs.models import Agent, AuthorityGrant, HistoryEvent, Run
from runs.search import RunFilter, page_runs, runs_by_prefix, state_counts, with_unresolved
from runs.selectors import ledger, run_detail, run_summary, visible_runs
from runs.states import State, allowed_events

TIMELINE_LIMIT = 200
AUDIT_LIMIT = 50

# --- run list -------------------------------------------------------------------------------------
# What the list shows is runs/search.py's RunFilter (the same filter the API and fleet operations
# read), paged by keyset: the URL holds the filter, the sort and the cursor, so a view can be shared.

PAGE_SIZE = 50
ATTENTION_CAP = 1000  # the "needs attention" chip counts up to this many ("1000+")
SORT_LABELS = {"created": "created", "updated": "updated", "state": "state", "agent": "agent"}


def run_row(run: Run, now: datetime | None = None) -> dict[str, Any]:
    """What one row of the list shows (the ``run-row`` partial draws it): times relative, with the
    absolute time for the hover, computed here once (a template filter per cell costs more)."""
    now = now or timezone.now()
    unresolved = getattr(run, "n_unresolved", None)
    return run_summary(run, unresolved) | {
        "url": reverse("console:run", args=[run.pk]),
        "created": _when(run.created_at, now),
        "updated": _when(run.updated_at, now),
        "state_since": _when(run.state_changed_at, now),
    }


def _when(moment: datetime, now: datetime) -> dict[str, str]:
    seconds = int((now - moment).total_seconds())
    if seconds < 0:
        ago = "just now"
    elif seconds < 60:
        ago = f"{seconds} s ago"
    elif seconds < 3600:
        ago = f"{seconds // 60} min ago"
    elif seconds < 86400:
        ago = f"{seconds // 3600} h {seconds % 3600 // 60} min ago"
    else:
        ago = f"{seconds // 86400} d {seconds % 86400 // 3600} h ago"
    return {"ago": ago, "iso": moment.isoformat(), "abs": f"{moment:%Y-%m-%d %H:%M:%S} UTC"}


def row_context(actor, run_ids: list[Any]) -> list[dict[str, Any]]:
    """Rows for the given runs (one query), for pushing changed rows with ``runs/list.html#run-row``."""
    runs = with_unresolved(visible_runs(actor).filter(pk__in=run_ids))
    now = timezone.now()
    return [run_row(r, now) for r in runs]


def list_context(
    actor, flt: RunFilter, *, after: str = "", before: str = "", limit: int = PAGE_SIZE
) -> dict[str, Any]:
    """One page of the list plus its chips: a constant number of queries whatever the page (the
    page, one GROUP BY for the state counts, one capped count for "needs attention")."""
    page = page_runs(actor, flt, after=after, before=before, limit=limit)
    counted = state_counts(actor, flt)
    counts = counted.by_state
    total = sum(counts.get(s, 0) for s in flt.states) if flt.states else counted.total
    attention = (
        flt.replace(attention=True, states=())
        .queryset(actor)
        .select_related(None)
        .order_by()
        .values("pk")[: ATTENTION_CAP + 1]
        .count()
    )
    base = flt.to_query()
    cursor = {"after": after} if after else {"before": before} if before else {}
    now = timezone.now()
    return {
        "runs": [run_row(r, now) for r in page.runs],
        "total": total,
        "counts_complete": counted.complete,
        "filter": flt,
        "query": flt.to_query(**cursor),
        "base_query": base,
        "next_query": flt.to_query(after=page.next_cursor) if page.next_cursor else None,
        "prev_query": flt.to_query(before=page.prev_cursor) if page.prev_cursor else None,
        "first_page": not (after or before),
        "chips": [
            {
                "state": s.value,
                "n": counts.get(s.value, 0),
                "on": s.value in flt.states,
            }
            for s in State
            if counts.get(s.value) or s.value in flt.states
        ],
        "attention_n": attention,
        "attention_more": attention > ATTENTION_CAP,
        "attention_cap": ATTENTION_CAP,
        "sorts": [
            {
                "name": name,
                "label": label,
                "on": flt.sort.lstrip("-") == name,
                "desc": flt.descending,
                # click: descending first; on the active column, flip
                "query": flt.replace(
                    sort=name if flt.sort == f"-{name}" else f"-{name}"
                ).to_query(),
            }
            for name, label in SORT_LABELS.items()
        ],
        "nav": "runs",
        "limit": limit,
    }


def _filter_or_400(params: QueryDict) -> tuple[RunFilter, str, str]:
    try:
        flt = RunFilter.from_query(params)
        after = check_text("after", params.get("after", ""), max_len=400)
        before = check_text("before", params.get("before", ""), max_len=400)
    except BadFilter as exc:
        raise BadRequest(exc.detail) from None
    return flt, after, before


@console_view
@require_GET
def run_list(request: ConsoleRequest) -> HttpResponse:
    flt, after, before = _filter_or_400(request.GET)
    try:
        ctx = list_context(request.actor, flt, after=after, before=before)
    except BadFilter as exc:  # a cursor that does not decode
        raise BadRequest(exc.detail) from None
    if is_fragment(request):
        return render(request, "runs/list.html#run-live", ctx)
    ctx |= {
        "agents": Agent.objects.order_by("name").values_list("name", flat=True),
        "owners": get_user_model()
        .objects.filter(is_active=True)
        .order_by("username")
        .values_list("username", flat=True),
        "states": [s.value for s in State],
    }
    return render(request, "runs/list.html", ctx)


def render_list_push(user, query_string: str) -> str:
    """The run table, as an out-of-band swap, for the "runs" group (filter and page from the socket's
    URL). A bad filter there pushes nothing: the page itself answered it with a 400."""
    actor = actor_for_user(user, None, component="console")
    try:
        flt, after, before = _filter_or_400(QueryDict(query_string))
        ctx = list_context(actor, flt, after=after, before=before)
    except (BadRequest, BadFilter):
        return ""
    return render_to_string("runs/list.html#run-table", ctx | {"oob": True})


@console_view
@require_GET
def run_by_prefix(request: ConsoleRequest, prefix: str) -> HttpResponse:
    """``/runs/<prefix>/``: the 8-character ids shown everywhere work as URLs. One match redirects
    to the run (keeping the rest of the path's query), several are listed, none is a 404."""
    try:
        matches = runs_by_prefix(request.actor, prefix)
    except BadFilter as exc:
        raise BadRequest(exc.detail) from None
    if len(matches) == 1:
        url = reverse("console:run", args=[matches[0].pk])
        if request.GET:
            url += "?" + request.GET.urlencode()
        return redirect(url)
    if not matches:
        raise Http404(f"no run starts with {prefix}")
    return render(
        request,
        "runs/prefix.html",
        {"prefix": prefix, "runs": [run_row(r) for r in matches], "nav": "runs"},
    )


# --- run detail -----------------------------------------------------------------------------------


def offered_interventions(
    run: Run, roles: frozenset[str], data: dict[str, Any]
) -> list[tuple[str, str]]:
    """Buttons: the kinds the state table allows from this state AND the user's role may issue.
    The table and the matrix are read, not restated; the data only hides buttons with nothing to
    act on (no pending approval, no grant to restore). The services check everything again."""
    allowed = set(allowed_events(run.state))
    grants = {g["status"] for g in data["authority"]}
    has = {
        "approve": data["pending_approvals"],
        "reject": data["pending_approvals"],
        "reconcile": data["unresolved_effects"],
        "restore_authority": "suspended" in grants,
        "revoke_authority": bool(grants & {"active", "suspended"}),
        "suspend_authority": "active" in grants,
    }
    out = []
    for kind, spec in CONTRACT_SPECS.items():
        event = spec["event"]
        applies = event in allowed if event is not None else run.state != State.CLOSED
        if applies and has.get(kind, True) and may(roles, kind):
            out.append((kind, kind_label(kind)))
    return out


def _tree(run: Run) -> list[dict[str, Any]]:
    """Descendants in depth-first order with their depth, for an indented tree."""
    rows = descendants(run)
    by_parent: dict[Any, list[Run]] = {}
    for child in rows:
        by_parent.setdefault(child.parent_id, []).append(child)
    out: list[dict[str, Any]] = []

    def walk(parent_id: Any, depth: int) -> None:
        for child in by_parent.get(parent_id, []):
            out.append(
                {
                    "id": str(child.pk),
                    "agent": child.agent.name,
                    "state": child.state,
                    "goal": child.goal,
                    "depth": depth,
                    "indent": depth * 1.25,
                }
            )
            walk(child.pk, depth + 1)

    walk(run.pk, 0)
    return out


def detail_context(run: Run, user, roles: frozenset[str]) -> dict[str, Any]:
    data = run_detail(run)
    data["pending_approvals"] = [a for a in data["approvals"] if a["status"] == "pending"]
    effects = ledger(run)
    grants = list(AuthorityGrant.objects.filter(run=run).order_by("granted_at"))
    interventions = list(run.interventions.select_related("actor").order_by("-created_at")[:50])
    reports = run_reports(run, interventions)  # revalidation, compensation plans, recovery gate

    return {
        "run": run,
        "data": data,
        "roles": roles,
        "user": user,
        "nav": "runs",
        "facets": holders(run),
        "failed_jobs": attention(run),  # the banner: a job gave up; what failed and how often
        "offered": offered_interventions(run, roles, data),
        "may_reconcile": may(roles, "reconcile"),
        "effects": effects,
        "discrepancies": [e for e in effects if e["status"] == "discrepancy"],
        "grants": [{"g": g, "status": g.effective_status()} for g in grants],
        "timeline": [
            {"e": e, "data": present(e.data)}
            for e in HistoryEvent.objects.filter(run=run).order_by("-seq")[:TIMELINE_LIMIT]
        ],
        "tree": _tree(run),
        "checkpoints": [
            {"c": c, "state": present(c.state)} for c in run.checkpoints.order_by("-seq")
        ],
        "starting_checkpoint": (data["checkpoint"] or {}).get("seq"),
        "interventions": [
            {
                "i": i,
                "r": receipt_dict(i),
                "rep": reports["reports"][i.pk],
                "receipt": present(receipt_rest(i, reports["reports"][i.pk])),
            }
            for i in interventions
        ],
        "plans": reports["plans"],
        "recovery": reports["recovery"],
        "audit": [
            {"a": a, "context": present(a.context)}
            for a in AuditEvent.objects.filter(run_id=run.pk).order_by("-seq")[:AUDIT_LIMIT]
        ],
        "parent": run.parent,
    }


@console_view
@require_GET
def run_page(request: ConsoleRequest, run_id: UUID) -> HttpResponse:
    run = visible_run_or_404(request.actor, run_id)
    ctx = detail_context(run, request.user, request.roles)
    part = request.GET.get("part", "")
    if is_fragment(request) and part in DETAIL_PARTS:
        return render(request, f"runs/detail.html#{part}", ctx)
    return render(request, "runs/detail.html", ctx)


DETAIL_PARTS = (
    "header",
    "timeline",
    "ledger",
    "compensation",
    "recovery",
    "authority",
    "tree",
    "attempts",
    "checkpoints",
    "approvals",
    "interventions",
    "audit",
    "sections",
)


def render_detail_push(user, run_id: Any) -> str:
    """Every section of the run page as out-of-band swaps, fresh from the database."""
    roles = roles_of(user)
    actor = actor_for_user(user, None, component="console")
    run = visible_runs(actor).filter(pk=run_id).first()
    if run is None:
        return ""
    return render_to_string(
        "runs/detail.html#sections", detail_context(run, user, roles) | {"oob": True}
    )
