"""What every request meets before a view: query strings and form fields a page can store and show,
and error pages in the caller's language (JSON under /api/, HTML for the console).

The API's JSON bodies are checked by its schemas (api/schemas.py, core/limits.py); query strings and
console form posts never reach a schema, so their characters are checked here, once, for every view.
"""

from __future__ import annotations

from collections.abc import Callable

from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render

from core.limits import bad_character
from core.pg import reach

API_PREFIX = "/api/"


def is_api(request: HttpRequest) -> bool:
    return request.path.startswith(API_PREFIX)


def error_response(request: HttpRequest, status: int, error: str, detail: str, field: str = ""):
    if is_api(request):
        return JsonResponse({"error": error, "detail": detail, "field": field}, status=status)
    context = {"status": status, "detail": detail, "field": field}
    return render(request, "error.html", context, status=status)


def _refused_field(request: HttpRequest) -> tuple[str, str] | None:
    """(field, why) of the first query or form value a page could not store or show."""
    sources = [request.GET]
    if request.method == "POST" and not is_api(request):
        # Form posts only: the API parses its JSON bodies itself. Reading POST here may raise
        # RequestDataTooBig / TooManyFieldsSent, which Django answers 400 (SuspiciousOperation).
        sources.append(request.POST)
    for data in sources:
        for key, values in data.lists():
            if why := bad_character(key):
                return key[:40], f"parameter name {why}"
            for value in values:
                if why := bad_character(value):
                    return key, why
    return None


class InputGuardMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        refused = _refused_field(request)
        if refused:
            field, why = refused
            # 422 as the API's schemas answer for any other bad parameter; a plain 400 page for a form.
            status = 422 if is_api(request) else 400
            return error_response(request, status, "invalid", f"{field}: {why}", field)
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exc: Exception) -> HttpResponse | None:
        """A console page or dialog whose database did not answer says what happened instead of
        Django's 500 page (the API has its own handler: api/app.py ``database_unavailable``)."""
        if is_api(request) or not isinstance(exc, DatabaseError) or not reach.is_unreachable(exc):
            return None
        from django.db import connection

        return database_unavailable(request, did_nothing=reach.nothing_applied(connection))


def database_unavailable(request: HttpRequest, did_nothing: bool) -> HttpResponse:
    """503 marked "refused unread, send it again" when this request certainly changed nothing (the
    console's pages send a dialog's GET again: static/console/console.js), else a 500 saying the
    outcome is unknown. Drawn without a template: rendering the usual page reads the session, from
    the database that just did not answer. JSON for htmx (its sentence goes to the page's notice)."""
    if did_nothing:
        status = 503
        detail = "the console could not reach its database just now and did nothing: try again"
    else:
        status = 500
        detail = (
            "the database stopped answering during this request: whether it took effect is "
            "unknown; check the run's history before trying again"
        )
    if request.headers.get("HX-Request"):
        response: HttpResponse = JsonResponse(
            {"error": "database_unavailable", "detail": detail, "field": ""}, status=status
        )
    else:
        page = (
            "<!doctype html><meta charset=utf-8><title>Database unavailable · controlplane</title>"
            f"<h1>The database did not answer</h1><p>{detail[0].upper()}{detail[1:]}.</p>"
        )
        response = HttpResponse(page, status=status)
    if did_nothing:
        response["X-Controlplane-Draining"] = "1"
        response["Retry-After"] = "1"
    return response


# Django's error handlers (controlplane/urls.py): JSON under /api/, the console's pages elsewhere.


def bad_request(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    # BadRequest("name: why") from a view names its parameter; other 400s (a form too large) do not.
    detail = str(exception) if exception and str(exception) else "the request could not be read"
    field = detail.split(":", 1)[0] if ":" in detail and " " not in detail.split(":", 1)[0] else ""
    return error_response(request, 400, "bad_request", detail, field)


def forbidden(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    if is_api(request):
        return error_response(request, 403, "forbidden", str(exception or "forbidden"))
    return render(request, "403.html", {"exception": exception}, status=403)


def not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    if is_api(request):
        return error_response(request, 404, "not_found", f"no such resource: {request.path}")
    return render(request, "404.html", status=404)


def server_error(request: HttpRequest) -> HttpResponse:
    if is_api(request):
        return error_response(request, 500, "server_error", "internal error (logged)")
    return HttpResponse("<h1>Server error</h1>", status=500)
