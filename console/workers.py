"""The Workers page: which agent workers are alive, when each was last heard, the runs and leases it
holds, the versions it reported, and the leases that ran out in the last hour (runs/workers.py).

A read: the "view" role (console_view), and only runs the viewer may see count. Not pushed live: it
refreshes itself every 5 s (a worker's heartbeat is a lease write, not a run fact).
"""

from __future__ import annotations

from django.http import HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from console.common import ConsoleRequest, console_view, is_fragment
from runs.workers import workers_overview


@console_view
@require_GET
def workers_page(request: ConsoleRequest) -> HttpResponse:
    ctx = workers_overview(request.actor)
    ctx["nav"] = "workers"
    if is_fragment(request):
        return render(request, "console/workers.html#workers", ctx)
    return render(request, "console/workers.html", ctx)
