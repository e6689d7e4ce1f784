"""Intake holds in the console: the live holds with their queued runs and ages, a hold form ->
preview -> confirm, and release (preview -> confirm). The services (interventions/intake.py)
decide and check everything; this edge parses the form and shows refusals with their status."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from django.http import HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET, require_POST

from console.common import ConsoleRequest, console_view
from console.interventions import error_dict
from core.errors import DomainError
from core.roles import may
from interventions.intake import (
    hold_dict,
    hold_intake,
    hold_preview,
    intake_state,
    release_intake,
    release_preview,
)


def _page(request: ConsoleRequest, status: int = 200, **extra: Any) -> HttpResponse:
    ctx = {
        "nav": "intake",
        **intake_state(request.actor),
        "may_hold": may(request.roles, "hold_intake"),
        "may_release": may(request.roles, "release_intake"),
        "form": request.POST or request.GET,
        **extra,
    }
    return render(request, "console/intake.html", ctx, status=status)


@console_view
@require_GET
def intake_page(request: ConsoleRequest) -> HttpResponse:
    return _page(request)


def _attempt(request: ConsoleRequest, fn, **kwargs) -> tuple[Any, dict[str, Any] | None, int]:
    try:
        return fn(actor=request.actor, **kwargs), None, 200
    except DomainError as err:
        return None, error_dict(err), err.status


@console_view
@require_POST
def hold_preview_view(request: ConsoleRequest) -> HttpResponse:
    data = request.POST
    shown, error, status = _attempt(
        request,
        hold_preview,
        scope=data.get("scope", ""),
        target=data.get("target", ""),
        team=data.get("team", "").strip(),
    )
    return _page(request, status, hold_shown=shown, error=error)


@console_view
@require_POST
def hold_confirm(request: ConsoleRequest) -> HttpResponse:
    data = request.POST
    made, error, status = _attempt(
        request,
        hold_intake,
        scope=data.get("scope", ""),
        target=data.get("target", ""),
        reason=data.get("reason", "").strip(),
        seen_digest=data.get("digest") or None,
        team=data.get("team", "").strip(),
    )
    receipt = made and hold_dict(made, actor=request.actor)
    return _page(request, 202 if made else status, receipt=receipt, error=error)


@console_view
@require_POST
def release_preview_view(request: ConsoleRequest, hold_id: UUID) -> HttpResponse:
    shown, error, status = _attempt(request, release_preview, hold_id=hold_id)
    return _page(request, status, release_shown=shown, error=error)


@console_view
@require_POST
def release_confirm(request: ConsoleRequest, hold_id: UUID) -> HttpResponse:
    data = request.POST
    done, error, status = _attempt(
        request,
        release_intake,
        hold_id=hold_id,
        reason=data.get("reason", "").strip(),
        seen_digest=data.get("digest") or None,
    )
    return _page(
        request, status, receipt=done and hold_dict(done, actor=request.actor), error=error
    )
