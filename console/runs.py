"""The operator console: run list and run detail (server-rendered, htmx, live over Channels).

One template serves the full page, its htmx swap and its WebSocket push (Django 6 template
partials). Views read through the selectors and never write; console/interventions.py calls the
services. Pushes are hints: ``render_list_push`` / ``render_detail_push`` re-render from the database,
and console/consumers.py sends them on every (re)connect and on every "run.changed".
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.db.models import Count, Q
from django.http import HttpResponse, QueryDict
from django.shortcuts import render
from django.template.loader import render_to_string
from django.views.decorators.http import require_GET

from console.common import (
    ConsoleRequest,
    console_view,
    is_fragment,
)
from core.auth import actor_for_user
from runs.models import Agent, Effect
from runs.selectors import run_summary, visible_runs
from runs.states import State

LIST_LIMIT = 100
TIMELINE_LIMIT = 200
AUDIT_LIMIT = 50

# --- run list -------------------------------------------------------------------------------------


def list_filters(params: QueryDict) -> dict[str, Any]:
    states = [
        s for s in params.getlist("state") for s in s.split(",") if s in State._value2member_map_
    ]
    return {
        "state": states,
        "agent": params.get("agent", "").strip(),
        "owner": params.get("owner", "").strip(),
    }


def list_context(actor, filters: dict[str, Any]) -> dict[str, Any]:
    qs = visible_runs(actor)
    if filters["state"]:
        qs = qs.filter(state__in=filters["state"])
    if filters["agent"]:
        qs = qs.filter(agent__name=filters["agent"])
    if filters["owner"]:
        qs = qs.filter(
            Q(assignee__username=filters["owner"])
            | Q(decision_authority__username=filters["owner"])
        )
    total = qs.count()
    qs = qs.annotate(
        n_unresolved=Count(
            "effects",
            filter=Effect.unresolved_q("effects__"),
        )
    )
    runs = [run_summary(r, r.n_unresolved) for r in qs.order_by("-created_at")[:LIST_LIMIT]]
    query = QueryDict(mutable=True)
    query.setlist("state", filters["state"])
    for key in ("agent", "owner"):
        if filters[key]:
            query[key] = filters[key]
    return {
        "runs": runs,
        "total": total,
        "filters": filters,
        "query": query.urlencode(),
        "nav": "runs",
        "states": [s.value for s in State],
        "limit": LIST_LIMIT,
    }


@console_view
@require_GET
def run_list(request: ConsoleRequest) -> HttpResponse:
    ctx = list_context(request.actor, list_filters(request.GET))
    if is_fragment(request):
        return render(request, "runs/list.html#run-live", ctx)
    users = get_user_model().objects.filter(
        Q(assigned_runs__isnull=False) | Q(decided_runs__isnull=False)
    )
    ctx |= {
        "agents": Agent.objects.order_by("name").values_list("name", flat=True),
        "owners": users.order_by("username").values_list("username", flat=True).distinct(),
    }
    return render(request, "runs/list.html", ctx)


def render_list_rows(user, run_ids: list[str]) -> str:
    """The rows of these runs (``run-row`` of runs/list.html), each an out-of-band swap: a live list
    redraws only the runs that changed. A row not on the page is ignored by htmx."""
    actor = actor_for_user(user, None, component="console")
    qs = (
        visible_runs(actor)
        .filter(pk__in=run_ids)
        .annotate(n_unresolved=Count("effects", filter=Effect.unresolved_q("effects__")))
    )
    return "".join(
        render_to_string(
            "runs/list.html#run-row", {"r": run_summary(r, r.n_unresolved), "row_oob": True}
        )
        for r in qs
    )


def render_list_push(user, query_string: str) -> str:
    """The run table, as an out-of-band swap, for the "runs" group (filters from the socket's URL)."""
    actor = actor_for_user(user, None, component="console")
    ctx = list_context(actor, list_filters(QueryDict(query_string)))
    return render_to_string("runs/list.html#run-table", ctx | {"oob": True})


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
