"""The Workers page: which agent workers are alive, when each was last heard, the runs and leases it
holds, the versions it reported, and the leases that ran out in the last hour (runs/workers.py).

A read: the "view" role (console_view), and only runs the viewer may see count. Pushed live: a
claim (``attempt_started``), a lease's end (``lease``) or a state change on any run redraws the
workers (``/ws/runs/?view=workers``, console/consumers.py), within a second; a heartbeat is a lease
write, not a run fact, so the page also refreshes itself every 5 s for the "last heard" times.
"""

from __future__ import annotations

from typing import Any

from django.http import HttpResponse
from django.shortcuts import render
from django.template.loader import render_to_string
from django.views.decorators.http import require_GET

from console.common import ConsoleRequest, console_view, is_fragment
from core.auth import actor_for_user
from runs.workers import workers_overview


@console_view
@require_GET
def workers_page(request: ConsoleRequest) -> HttpResponse:
    ctx = workers_overview(request.actor)
    ctx["nav"] = "workers"
    if is_fragment(request):
        return render(request, "console/workers.html#workers", ctx)
    return render(request, "console/workers.html", ctx)


# The facts that change what the page shows: a claim, a lease's end, a run's state (None: everything).
WORKER_FACTS = frozenset({"attempt_started", "lease", "state_changed"})


def render_workers_push(user: Any) -> str:
    """The workers section, out of band, for the page's socket (what a reload would draw)."""
    ctx = workers_overview(actor_for_user(user, None, component="console"))
    return render_to_string("console/workers.html#workers", ctx | {"oob": True})
