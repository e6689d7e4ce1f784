"""The operator console: run list and run detail (server-rendered, htmx, live over Channels).

One template serves the full page, its htmx swap and its WebSocket push (Django 6 template
partials). Views read through the selectors and never write; console/interventions.py calls the
services. Pushes are hints: ``render_list_push`` / ``render_detail_push`` re-render from the database,
and console/consumers.py sends them on every (re)connect and on every "run.changed".
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from django.contrib.auth import get_user_model
from django.db.models import Count, Q
from django.http import HttpResponse, QueryDict
from django.shortcuts import render
from django.template.loader import render_to_string
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
from core.roles import may, roles_of
from interventions.base import descendants
from interventions.contracts import CONTRACT_SPECS
from interventions.jobs import attention
from interventions.selectors import receipt_dict
from interventions.transfer import holders
from runs.models import Agent, AuthorityGrant, Effect, HistoryEvent, Run
from runs.selectors import ledger, run_detail, run_summary, visible_runs
from runs.states import State, allowed_events

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


def render_list_push(user, query_string: str) -> str:
    """The run table, as an out-of-band swap, for the "runs" group (filters from the socket's URL)."""
    actor = actor_for_user(user, None, component="console")
    ctx = list_context(actor, list_filters(QueryDict(query_string)))
    return render_to_string("runs/list.html#run-table", ctx | {"oob": True})


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
