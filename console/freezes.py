"""Standing capability freezes on the fleet page: preview -> set, and preview -> restore, each
answered with its receipt and the refreshed list. The service (interventions/fleet/freezes.py)
decides and checks everything; this edge parses the form and maps refusals to the page."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from django.http import HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_POST

from console.common import ConsoleRequest, console_view
from console.interventions import error_dict
from core.actors import Actor
from core.errors import DomainError
from core.roles import may
from interventions.fleet import freezes as service
from runs.freezes import freeze_dict

TEMPLATE = "console/fleet_freezes.html"


def freezes_context(actor: Actor) -> dict[str, Any]:
    """The list (live first; those of the operator's teams and every team's), and whether this
    operator may set or restore one."""
    roles = actor.roles
    rows = sorted(service.freezes(actor), key=lambda f: (not f.live, -f.frozen_at.timestamp()))
    return {
        "standing_freezes": [freeze_dict(f) for f in rows],
        "may_freeze": may(roles, "fleet") and may(roles, "standing_freeze"),
        "may_restore": may(roles, "fleet") and may(roles, "standing_restore"),
    }


def _form(data) -> dict[str, str]:
    return {
        "capability": data.get("capability", "").strip(),
        "over": data.get("over", "").strip(),
        "agent": data.get("agent", "").strip(),
        "filter_text": data.get("filter", "").strip(),
        "team": data.get("team", "").strip(),
    }


def _answer(request: ConsoleRequest, part: str, ctx: dict[str, Any], status: int = 200):
    ctx = freezes_context(request.actor) | ctx
    return render(request, f"{TEMPLATE}#{part}", ctx, status=status)


@console_view
@require_POST
def freeze_preview(request: ConsoleRequest) -> HttpResponse:
    form = _form(request.POST)
    try:
        shown = service.preview_freeze(actor=request.actor, **form)
    except DomainError as err:
        return _answer(request, "freeze-preview", {"error": error_dict(err)}, err.status)
    return _answer(request, "freeze-preview", {"shown": shown, "form": form})


@console_view
@require_POST
def freeze_set(request: ConsoleRequest) -> HttpResponse:
    form = _form(request.POST)
    try:
        _, receipt = service.set_freeze(
            actor=request.actor,
            reason=request.POST.get("reason", "").strip(),
            digest=request.POST.get("digest", ""),
            **form,
        )
    except DomainError as err:
        return _answer(request, "freeze-preview", {"error": error_dict(err)}, err.status)
    return _answer(request, "freeze-receipt", {"receipt": receipt, "restored": False})


@console_view
@require_POST
def freeze_restore_preview(request: ConsoleRequest, freeze_id: UUID) -> HttpResponse:
    try:
        shown = service.preview_restore(actor=request.actor, freeze_id=freeze_id)
    except DomainError as err:
        return _answer(request, "freeze-preview", {"error": error_dict(err)}, err.status)
    return _answer(request, "restore-preview", {"shown": shown})


@console_view
@require_POST
def freeze_restore(request: ConsoleRequest, freeze_id: UUID) -> HttpResponse:
    try:
        _, receipt = service.restore_freeze(
            actor=request.actor,
            freeze_id=freeze_id,
            reason=request.POST.get("reason", "").strip(),
            digest=request.POST.get("digest", ""),
        )
    except DomainError as err:
        return _answer(request, "freeze-preview", {"error": error_dict(err)}, err.status)
    return _answer(request, "freeze-receipt", {"receipt": receipt, "restored": True})
