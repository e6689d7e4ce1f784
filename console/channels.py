"""Notification channels, for admins only (others get 403 like every role-gated page): the list, a
form to add or change one, delete, and a test-send whose result is drawn in place. Parses the form,
calls notifications.services / notifications.jobs, renders."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from console.common import ConsoleRequest, console_view
from core.errors import DomainError
from core.roles import may
from notifications import jobs, selectors, services
from notifications.models import Channel

TEXT = ("name", "kind", "url", "recipients", "smtp_host", "smtp_username", "from_email", "roles")


def _admin(request: ConsoleRequest) -> None:
    if not may(request.roles, "manage_channels"):
        raise PermissionDenied("only an admin may configure notification channels")


def _form_data(request: ConsoleRequest) -> dict[str, Any]:
    """The posted form as the service's fields; a number that is not one is left for the service to
    name (it is refused there, with its field)."""
    post = request.POST
    data: dict[str, Any] = {k: post.get(k, "").strip() for k in TEXT}
    data["enabled"] = post.get("enabled") == "on"
    data["smtp_use_tls"] = post.get("smtp_use_tls") == "on"
    data["escalate_to"] = post.get("escalate_to", "").strip()
    for field in ("smtp_port", "escalate_after_s"):
        raw = post.get(field, "").strip()
        data[field] = (int(raw) if raw.isdigit() else raw) if raw else None
    if data["smtp_port"] is None:
        data.pop("smtp_port")
    if post.get("secret"):
        data["secret"] = post["secret"]
    return data


@console_view
@require_http_methods(["GET", "POST"])
def channels_page(request: ConsoleRequest) -> HttpResponse:
    _admin(request)
    error, status = None, 200
    if request.method == "POST":
        try:
            channel = services.create_channel(actor=request.actor, data=_form_data(request))
            return redirect("console:channel", channel_id=channel.pk)
        except DomainError as exc:
            error, status = {"field": exc.extra.get("field"), "detail": exc.detail}, 422
    ctx = {
        "nav": "channels",
        "channels": [services.shown(c) for c in selectors.channels()],
        "kinds": Channel.KINDS,
        "error": error,
        "form": request.POST if request.method == "POST" else {},
    }
    return render(request, "console/channels.html", ctx, status=status)


@console_view
@require_http_methods(["GET", "POST"])
def channel_page(request: ConsoleRequest, channel_id) -> HttpResponse:
    _admin(request)
    channel = selectors.channel(channel_id)
    if channel is None:
        raise Http404("no such channel")
    error, status = None, 200
    if request.method == "POST":
        try:
            channel = services.change_channel(
                actor=request.actor, channel_id=channel.pk, data=_form_data(request)
            )
            return redirect("console:channel", channel_id=channel.pk)
        except DomainError as exc:
            error, status = {"field": exc.extra.get("field"), "detail": exc.detail}, 422
    ctx = {"nav": "channels", "c": services.shown(channel), "kinds": Channel.KINDS, "error": error}
    return render(request, "console/channel.html", ctx, status=status)


@console_view
@require_POST
def channel_delete(request: ConsoleRequest, channel_id) -> HttpResponse:
    _admin(request)
    try:
        services.delete_channel(actor=request.actor, channel_id=channel_id)
    except DomainError:
        raise Http404("no such channel")
    return redirect("console:channels")


@console_view
@require_POST
def channel_test(request: ConsoleRequest, channel_id) -> HttpResponse:
    """One message now (network I/O; no transaction is open): the fragment replaces the button's
    result area, and the channel's health line with it."""
    _admin(request)
    if selectors.channel(channel_id) is None:
        raise Http404("no such channel")
    result = jobs.test_send(actor=request.actor, channel_id=channel_id)
    channel = selectors.channel(channel_id)
    ctx = {"result": result, "c": services.shown(channel) if channel else {}}
    return render(request, "console/channel.html#test-result", ctx)
