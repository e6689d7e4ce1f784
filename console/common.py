"""What every console view shares: login and role check, fragment detection, the JSON-value
presenter the templates draw, and the visible-run lookup."""

from __future__ import annotations

import re
from functools import wraps
from typing import Any
from urllib.parse import urlencode
from uuid import UUID

from channels.db import database_sync_to_async
from django.conf import settings
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest
from django_htmx.http import HttpResponseClientRedirect
from django_htmx.middleware import HtmxDetails

from core.actors import Actor
from core.auth import actor_for_user
from core.roles import may
from runs.models import Run
from runs.selectors import visible_run


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
        request.actor = actor_for_user(request.user, request, component="console")
        request.roles = request.actor.roles  # read once (one query), not again here
        if not may(request.roles, "view"):
            raise PermissionDenied("your account holds no role that may view the console")
        return view(request, *args, **kwargs)

    return wrapper


def is_fragment(request: HttpRequest) -> bool:
    """An htmx swap (not a boosted navigation, not a history restore) gets only the partial."""
    htmx = getattr(request, "htmx", None)
    return htmx is not None and bool(htmx) and not htmx.boosted and not htmx.history_restore_request


UUID_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
ISO_TIME_RE = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})?$")


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
    if isinstance(value, str) and ISO_TIME_RE.match(value):
        return {"t": "time", "v": value}  # drawn relative, the absolute time on hover
    return {"t": "text", "v": str(value)}


def _label(key: Any) -> str:
    return str(key).replace("_", " ")


def kind_label(kind: str) -> str:
    return kind.replace("_", " ").capitalize()


def visible_run_or_404(actor, run_id: Any) -> Run:
    run = visible_run(actor, run_id)
    if run is None:
        raise Http404("no such run")
    return run


def off_view_thread(fn: Any) -> Any:
    """``fn`` in a pool thread of its own rather than the one thread that runs this process's HTTP
    views (channels' default, thread_sensitive): under protocol load that thread is a queue of API
    requests, and a push waiting behind them reached its page seconds late. Reads only (session,
    renders); the database pool gives each thread its connection."""
    return database_sync_to_async(fn, thread_sensitive=False)
