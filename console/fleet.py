"""Fleet operations in the console: choose runs by filter -> preview -> confirm -> live progress
(waves, per-run receipts, halt). The services (interventions/fleet/operations.py) decide and check everything;
this edge parses the form and maps domain errors to the page with their HTTP status."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from django.http import Http404, HttpResponse, QueryDict
from django.shortcuts import render
from django.template.loader import render_to_string
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST
from django_htmx.http import HttpResponseClientRedirect, reswap, retarget

from console.common import ConsoleRequest, console_view, is_fragment, kind_label
from console.freezes import freezes_context
from console.interventions import error_dict
from core.errors import DomainError, Invalid, PreviewStale
from core.roles import may
from interventions.fleet.operations import (
    FleetParams,
    cancel_fleet_operation,
    confirm_fleet_operation,
    halt_fleet_operation,
    preview_fleet_operation,
    start_fleet_operation,
)
from interventions.fleet.selection import FLEET_KINDS
from interventions.fleet.selectors import operation_dict, recent_operations
from interventions.models import FleetOperation
from interventions.selectors import operation_by_id

FORM_KEYS = frozenset(
    {
        "kind",
        "filter",
        "suspend_authority",
        "wave_size",
        "pause_s",
        "max_failures",
        "max_failure_pct",
        "override_reason",
        "reason",
        "digest",
        "previewed",
        "check",
        "csrfmiddlewaretoken",
    }
)


def _kinds(roles: frozenset[str]) -> list[tuple[str, str]]:
    rights = {k: ("take_command" if k == "take_command" else k) for k in FLEET_KINDS}
    return [
        (k, kind_label(k)) for k in FLEET_KINDS if may(roles, "fleet") and may(roles, rights[k])
    ]


def _int(data: QueryDict, name: str, default: int | None) -> int | None:
    raw = data.get(name, "").strip()
    if not raw:
        return default
    if not raw.isdigit() or len(raw) > 9:
        raise Invalid(f"{name.replace('_', ' ')} must be a whole number", field=name)
    return int(raw)


def params_from(data: QueryDict) -> FleetParams:
    options: dict[str, Any] = {}
    if data.get("suspend_authority") in ("on", "1", "true"):
        options["suspend_authority"] = True
    pct = _int(data, "max_failure_pct", None)
    return FleetParams(
        options=options,
        wave_size=_int(data, "wave_size", 10) or 0,
        pause_s=_int(data, "pause_s", 0) or 0,
        max_failures=_int(data, "max_failures", None),
        max_failure_pct=float(pct) if pct is not None else None,
        override_reason=data.get("override_reason", "").strip(),
    )


def _filter_of(data: QueryDict) -> str:
    """The run list's filter, as a query string: every key but the fleet form's own, so a key the
    fleet selection does not understand is refused by the service rather than silently dropped."""
    if given := str(data.get("filter", "")).strip():
        return given
    kept = data.copy()
    for key in FORM_KEYS & set(kept):
        del kept[key]
    return kept.urlencode()


@console_view
@require_GET
def fleet_page(request: ConsoleRequest) -> HttpResponse:
    """The operations list and the "new operation" form, prefilled from a run list filter."""
    ctx = {
        "nav": "fleet",
        "kinds": _kinds(request.roles),
        "filter": _filter_of(request.GET),
        "form": request.GET,
        "operations": list(recent_operations(actor=request.actor)),
    } | freezes_context(request.actor)
    return render(request, "console/fleet_operations.html", ctx)


def selection_moved(before: str, now: int, same: bool) -> str:
    """What moved in a fleet preview's selection, in the operator's words ("" if nothing did)."""
    if same:
        return ""
    was = int(before) if before.isdigit() else None
    if was is None or was == now:
        return f"the same number of runs ({now}), not the same runs"
    return f"{now} run{'' if now == 1 else 's'} now, {was} when previewed"


def _preview(request: ConsoleRequest, data: QueryDict) -> dict[str, Any]:
    return preview_fleet_operation(
        actor=request.actor,
        kind=data.get("kind", ""),
        run_filter=_filter_of(data),
        params=params_from(data),
    )


@console_view
@require_POST
def fleet_preview(request: ConsoleRequest) -> HttpResponse:
    """The preview; with ``check``, only whether the previewed selection moved on (the note the
    preview polls: one selection, no redraw of what the operator is reading or typing)."""
    data = request.POST
    ctx: dict[str, Any] = {"form": data, "filter": _filter_of(data), "kind": data.get("kind", "")}
    if data.get("check"):
        try:
            now = _preview(request, data)
            ctx["moved"] = selection_moved(
                data.get("previewed", ""), now["will_act_on"], now["digest"] == data.get("digest")
            )
        except DomainError as err:
            ctx["moved"] = error_dict(err)["sentence"]
        return render(request, "console/fleet_operations.html#moved", ctx)
    try:
        ctx["preview"] = _preview(request, data)
    except DomainError as err:
        ctx["error"] = error_dict(err)
        return render(request, "console/fleet_operations.html#preview", ctx, status=err.status)
    ctx["label"] = kind_label(ctx["kind"])
    return render(request, "console/fleet_operations.html#preview", ctx)


@console_view
@require_POST
def fleet_start(request: ConsoleRequest) -> HttpResponse:
    """Start; a refusal is shown inside the start form, which is not redrawn (the reason typed
    stays, and the cursor); a stale selection comes back as the new preview in place (its summary,
    its basis and its button), to be read and started again."""
    data = request.POST
    try:
        op = start_fleet_operation(
            actor=request.actor,
            kind=data.get("kind", ""),
            run_filter=_filter_of(data),
            reason=data.get("reason", "").strip(),
            params=params_from(data),
            digest=data.get("digest", ""),
        )
    except PreviewStale as err:
        try:
            preview = _preview(request, data)
        except DomainError as again:
            return _start_refused(request, again)
        ctx = {
            "form": data,
            "preview": preview,
            "label": kind_label(data.get("kind", "")),
            "changed": selection_moved(data.get("previewed", ""), preview["will_act_on"], False),
        }
        html = render_to_string("console/fleet_operations.html#summary", ctx, request=request)
        html += render_to_string(
            "console/fleet_operations.html#basis", ctx | {"oob": True}, request=request
        ) + render_to_string(
            "console/fleet_operations.html#start-button", ctx | {"oob": True}, request=request
        )
        response = HttpResponse(html, status=err.status)
        return reswap(retarget(response, "#fleet-summary"), "outerHTML")
    except DomainError as err:
        return _start_refused(request, err)
    return HttpResponseClientRedirect(reverse("console:fleet-operation", args=[op.pk]))


def _start_refused(request: ConsoleRequest, err: DomainError) -> HttpResponse:
    ctx = {"error": error_dict(err)}
    response = render(request, "console/fleet_operations.html#start-error", ctx, status=err.status)
    return reswap(retarget(response, "#fleet-start-error"), "innerHTML")


def _operation_or_404(request: ConsoleRequest, operation_id: UUID) -> FleetOperation:
    op = operation_by_id(operation_id, request.actor)  # another team's: as absent
    if op is None:
        raise Http404("no such fleet operation")
    return op


def _progress_ctx(request: ConsoleRequest, op: FleetOperation) -> dict[str, Any]:
    return progress_context(request.user.pk, request.roles, op)


def progress_context(user_id: Any, roles: frozenset[str], op: FleetOperation) -> dict[str, Any]:
    """The progress section's context (the page, its htmx poll and its live push alike)."""
    data = operation_dict(op)
    return {
        "nav": "fleet",
        "op": data,
        "obj": op,
        "label": kind_label(op.kind),
        "running": op.state == FleetOperation.RUNNING,
        "held": op.state == FleetOperation.PREVIEWED,
        "may_halt": op.state in (FleetOperation.RUNNING, FleetOperation.PREVIEWED)
        and (op.created_by_id == user_id or any(k == op.kind for k, _ in _kinds(roles))),
        "percent": round(100 * (data["total"] - data["pending"]) / data["total"])
        if data["total"]
        else 100,
    }


@console_view
@require_GET
def fleet_operation(request: ConsoleRequest, operation_id: UUID) -> HttpResponse:
    ctx = _progress_ctx(request, _operation_or_404(request, operation_id))
    template = (
        "console/fleet_operation.html#progress"
        if is_fragment(request)
        else "console/fleet_operation.html"
    )
    return render(request, template, ctx)


def _decide(request: ConsoleRequest, operation_id: UUID, service, **kwargs) -> HttpResponse:
    """Halt, confirm or cancel; the progress fragment answers, with the refusal if there was one."""
    op = _operation_or_404(request, operation_id)
    status, error = 200, None
    try:
        op = service(actor=request.actor, operation_id=op.pk, **kwargs)
    except DomainError as err:
        status, error = err.status, error_dict(err)
    ctx = _progress_ctx(request, op) | {"error": error}
    return render(request, "console/fleet_operation.html#progress", ctx, status=status)


@console_view
@require_POST
def fleet_halt(request: ConsoleRequest, operation_id: UUID) -> HttpResponse:
    reason = request.POST.get("reason", "").strip()
    return _decide(request, operation_id, halt_fleet_operation, reason=reason)


@console_view
@require_POST
def fleet_confirm(request: ConsoleRequest, operation_id: UUID) -> HttpResponse:
    return _decide(request, operation_id, confirm_fleet_operation)


@console_view
@require_POST
def fleet_cancel(request: ConsoleRequest, operation_id: UUID) -> HttpResponse:
    reason = request.POST.get("reason", "").strip()
    return _decide(request, operation_id, cancel_fleet_operation, reason=reason)


def render_progress_push(user, roles: frozenset[str], operation_id: Any) -> str:
    """The progress section as an out-of-band swap, for the operation's live socket
    (console/consumers.py FleetConsumer); "" once the operation is gone."""
    op = operation_by_id(operation_id)
    if op is None:
        return ""
    ctx = progress_context(user.pk, roles, op) | {"oob": True}
    return render_to_string("console/fleet_operation.html#progress", ctx)
