"""The operator console: run list and run detail (server-rendered, htmx, live over Channels).

One template serves the full page, its htmx swap and its WebSocket push (Django 6 template
partials). Views read through the selectors and never write; interventions/views.py calls the
services. Pushes are hints: ``render_list_push`` / ``render_detail_push`` re-render from the database,
and runs/consumers.py sends them on every (re)connect and on every "run.changed".
"""

from __future__ import annotations

import re
from functools import wraps
from typing import Any
from urllib.parse import urlencode
from uuid import UUID

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.db.models import Count, Q
from django.http import Http404, HttpRequest, HttpResponse, QueryDict
from django.shortcuts import render
from django.template.loader import render_to_string
from django.views.decorators.http import require_GET
from django_htmx.http import HttpResponseClientRedirect
from django_htmx.middleware import HtmxDetails

from audit.models import AuditEvent
from core.actors import Actor
from core.auth import actor_for_user
from core.roles import may, roles_of
from interventions.base import descendants
from interventions.contracts import CONTRACTS as CONTRACT_SPECS
from interventions.jobs import attention
from interventions.selectors import receipt_dict
from interventions.transfer import holders
from runs.models import Agent, AuthorityGrant, Effect, HistoryEvent, Run
from runs.selectors import ledger, run_detail, run_summary, visible_runs
from runs.states import State, allowed_events

LIST_LIMIT = 100
TIMELINE_LIMIT = 200
AUDIT_LIMIT = 50

# --- console plumbing shared by every console view ------------------------------------------------


class ConsoleRequest(HttpRequest):
    """A request inside a console view: HtmxMiddleware set ``htmx``, console_view set the rest."""

    htmx: HtmxDetails
    roles: frozenset[str]
    actor: Actor


def console_view(view):
    """Login, then the "view" role; sets request.roles and request.actor (component "console").

    An htmx request whose session ended is sent to the login page with HX-Redirect instead of
    swapping the login form into a fragment."""

    @wraps(view)
    def wrapper(request: ConsoleRequest, *args, **kwargs):
        if not request.user.is_authenticated:
            if getattr(request, "htmx", False):
                back = urlencode({"next": request.htmx.current_url_abs_path or "/"})
                return HttpResponseClientRedirect(f"{settings.LOGIN_URL}?{back}")
            return redirect_to_login(request.get_full_path())
        request.roles = roles_of(request.user)
        if not may(request.roles, "view"):
            raise PermissionDenied("your account holds no role that may view the console")
        request.actor = actor_for_user(request.user, request, component="console")
        return view(request, *args, **kwargs)

    return wrapper


def is_fragment(request: HttpRequest) -> bool:
    """An htmx swap (not a boosted navigation, not a history restore) gets only the partial."""
    htmx = getattr(request, "htmx", None)
    return htmx is not None and bool(htmx) and not htmx.boosted and not htmx.history_restore_request


UUID_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def present(value: Any, depth: int = 0) -> dict[str, Any]:
    """A JSON value (preview, receipt, report) as a tree the recursive template ``_value.html`` draws:
    dicts as definition lists, lists of flat dicts as tables, ids shortened, nothing dropped."""
    if depth > 8:
        return {"t": "text", "v": str(value)}
    if isinstance(value, dict):
        if not value:
            return {"t": "empty"}
        return {
            "t": "dict",
            "items": [(_label(k), present(v, depth + 1)) for k, v in value.items()],
        }
    if isinstance(value, (list, tuple)):
        if not value:
            return {"t": "empty"}
        if all(isinstance(v, dict) and v for v in value):
            cols = list(dict.fromkeys(k for v in value for k in v))
            if (
                all(not isinstance(x, (dict, list)) or not x for v in value for x in v.values())
                and len(cols) <= 9
            ):
                return {
                    "t": "table",
                    "cols": [_label(c) for c in cols],
                    "rows": [[present(v.get(c), depth + 1) for c in cols] for v in value],
                }
        return {"t": "list", "items": [present(v, depth + 1) for v in value]}
    if value is None:
        return {"t": "none"}
    if isinstance(value, bool):
        return {"t": "bool", "v": value}
    if isinstance(value, (str, UUID)) and UUID_RE.match(str(value)):
        return {"t": "id", "v": str(value)}
    return {"t": "text", "v": str(value)}


def _label(key: Any) -> str:
    return str(key).replace("_", " ")


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
            filter=Q(
                effects__decision=Effect.AUTHORIZED, effects__status__in=list(Effect.UNRESOLVED)
            ),
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


def kind_label(kind: str) -> str:
    return kind.replace("_", " ").capitalize()


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
    from console.interventions import receipt_rest, run_reports

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


def visible_run_or_404(actor, run_id: Any) -> Run:
    run = visible_runs(actor).filter(pk=run_id).first()
    if run is None:
        raise Http404("no such run")
    return run


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
