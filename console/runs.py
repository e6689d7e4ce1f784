"""The operator console: run list and run detail (server-rendered, htmx, live over Channels).

One template serves the full page, its htmx swap and its WebSocket push (Django 6 template
partials). Views read through the selectors and never write; console/interventions.py calls the
services. Pushes are hints: ``render_list_push`` / ``render_detail_push`` re-render from the database,
and console/consumers.py sends them on every (re)connect and on every "run.changed".
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.contrib.auth import get_user_model
from django.core.exceptions import BadRequest
from django.http import Http404, HttpResponse, QueryDict
from django.shortcuts import redirect, render
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET

from console.common import (
    ConsoleRequest,
    console_view,
    is_fragment,
)
from core.auth import actor_for_user
from core.filters import BadFilter, check_text
from runs.models import Agent, Run
from runs.search import (
    RunFilter,
    attention_ids,
    page_runs,
    runs_by_prefix,
    state_counts,
    with_unresolved,
)
from runs.selectors import run_summary, visible_runs
from runs.states import State

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
    trouble = attention_ids(timezone.now())
    attention = (
        flt.replace(attention=False, states=())
        .queryset(actor, within=trouble)
        .filter(pk__in=trouble)
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


def render_list_rows(user, run_ids: list[str]) -> str:
    """The rows of these runs (``run-row`` of runs/list.html), each an out-of-band swap: a live list
    redraws only the runs that changed (console/consumers.py). A row not on the page is ignored."""
    actor = actor_for_user(user, None, component="console")
    return "".join(
        render_to_string("runs/list.html#run-row", {"r": row, "oob": True})
        for row in row_context(actor, run_ids)
    )


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


# --- run detail: console/run_page.py (kept importable from here) ----------------------------------

from console.run_page import (  # noqa: E402
    DETAIL_PARTS,
    detail_context,
    offered_interventions,
    render_detail_push,
    run_page,
)

__all__ = [
    "DETAIL_PARTS",
    "detail_context",
    "offered_interventions",
    "render_detail_push",
    "run_page",
]
