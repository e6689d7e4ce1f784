"""Floor routes for bench.floor: what one HTTP call costs before the control plane does any work.

``/bench/noop/`` is a plain Django view; ``/bench/echo/`` is a django-ninja operation that validates a
body shaped like an effect declaration and returns it. Both pass through the full middleware stack,
daphne and the same ASGI handler as every protocol call, and neither touches the database. Served only
by the benchmark's servers (bench/settings.py), never by the product."""

from typing import Any

from django.http import JsonResponse
from django.urls import path
from ninja import NinjaAPI, Schema

from controlplane.urls import urlpatterns as control_plane_urls

floor_api = NinjaAPI(urls_namespace="bench-floor", docs_url=None, openapi_url=None)


class EchoIn(Schema):
    fencing_token: int
    step: str
    tool: str
    action: str
    idempotency_key: str
    args: dict[str, Any] = {}
    compensation: dict[str, Any] | None = None
    irreversible: bool = False


@floor_api.post("/echo/", response=dict)
def echo(request, body: EchoIn):
    return body.dict()


def noop(request):
    return JsonResponse({"ok": True})


def stats(request):
    """This server process's SQL statement count so far (bench/sqlcount.py)."""
    from bench import sqlcount

    return JsonResponse(sqlcount.snapshot())


urlpatterns = [
    path("bench/noop/", noop),
    path("bench/stats/", stats),
    path("bench/", floor_api.urls),
    *control_plane_urls,
]
