"""The /api/v1/ surface: one NinjaAPI, JSON errors {"error": code, "detail": ...}, OpenAPI at openapi.json."""

from __future__ import annotations

import logging

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.db import DataError, InterfaceError, OperationalError
from django.http import Http404, HttpRequest
from ninja import NinjaAPI
from ninja.errors import AuthenticationError, AuthorizationError, HttpError, ValidationError

from api.auth import API_AUTH
from api.parser import BodyRefused, StrictJsonParser
from api.redacting import RedactingRenderer
from api.schemas import INSIDE_FIELD
from core.errors import DomainError


class ControlPlaneAPI(NinjaAPI):
    def get_openapi_schema(self, *, path_prefix=None, path_params=None):
        """Built once per prefix: the routes never change after start-up, and with a typed schema
        for every response the document takes about a second of CPU to build."""
        if path_prefix is None:
            path_prefix = self.get_root_path(path_params or {})
        cache = self.__dict__.setdefault("_openapi_cache", {})
        if path_prefix not in cache:
            cache[path_prefix] = super().get_openapi_schema(path_prefix=path_prefix)
        return cache[path_prefix]


api = ControlPlaneAPI(
    parser=StrictJsonParser(),
    renderer=RedactingRenderer(),  # core.redaction on every response to a person
    title="controlplane",
    version="1",
    description="Worker protocol and run-control API. Workers authenticate with `Authorization: Bearer <token>`; "
    'errors are JSON `{"error": code, "detail": ..., "field": ...}`.',
    auth=API_AUTH,
    urls_namespace="api",
)
logger = logging.getLogger(__name__)


def _field(loc: list) -> str:
    parts = [str(p) for p in loc if p not in ("body", "query", "path", "payload")]
    # Nothing left: the body as a whole is missing or of the wrong type.
    return ".".join(parts) or "body"


def _error(e: dict) -> dict[str, str]:
    field, message = _field(e.get("loc", [])), e.get("msg", "")
    ctx = e.get("ctx") or {}
    if e.get("type") == INSIDE_FIELD and ctx.get("path"):  # a value deep inside a JSON document
        field = f"{field}.{ctx['path']}" if field != "body" else str(ctx["path"])
        message = str(ctx.get("why", message))
    return {"field": field, "message": message}


@api.exception_handler(DomainError)
def domain_error(request: HttpRequest, exc: DomainError):
    return api.create_response(request, {"field": ""} | exc.payload(), status=exc.status)


@api.exception_handler(ValidationError)
def validation_error(request: HttpRequest, exc: ValidationError):
    errors = [_error(e) for e in exc.errors]
    first = errors[0] if errors else {"field": "", "message": "invalid input"}
    detail = f"{first['field']}: {first['message']}" if first["field"] else first["message"]
    return api.create_response(
        request,
        {"error": "invalid", "detail": detail, "field": first["field"], "errors": errors},
        status=422,
    )


@api.exception_handler(DataError)
def unstorable(request: HttpRequest, exc: DataError):
    """Last line of "no input ever yields a 500": a value PostgreSQL cannot store (a number out of range,
    a string it refuses) is bad input. The schemas refuse the known cases naming the field; this catches
    the rest -- after the service's transaction has rolled back -- and logs it so a schema gets fixed."""
    logger.warning("unstorable input on %s %s: %s", request.method, request.path, exc)
    first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else "value out of range"
    return api.create_response(
        request,
        {
            "error": "invalid",
            "detail": f"a value could not be stored: {first_line}",
            "field": _unstorable_field(request, exc, first_line),
        },
        status=422,
    )


@api.exception_handler(OperationalError)
@api.exception_handler(InterfaceError)
def database_unavailable(request: HttpRequest, exc: Exception):
    """PostgreSQL did not answer (docs/operations/faults.md, the database link cut).

    When this request certainly changed nothing (no COMMIT sent, no write outside a transaction:
    ``core.pg.reach.nothing_applied``, typically a checkout refused at once by the backend), a 503
    marked ``X-Controlplane-Draining: 1``: the SDK sends it again, and through the load balancer it
    lands on a replica that reaches the database. Otherwise a 500: a call whose connection broke
    during its COMMIT may have taken effect; the caller reads back or resends with the same
    idempotency key."""
    from django.db import connection

    from core.pg import reach

    if not reach.is_unreachable(exc):  # a query's own failure (a deadlock...)
        raise exc  # not an unreachable database: Django's 500, as before
    did_nothing = reach.nothing_applied(connection)
    logger.error(
        "database unavailable on %s %s (%s): %s",
        request.method,
        request.path,
        "nothing applied: 503" if did_nothing else "outcome unknown: 500",
        exc,
    )
    if did_nothing:
        response = api.create_response(
            request,
            {
                "error": "database_unavailable",
                "detail": "this replica could not reach the database and did nothing with the "
                "call: send it again",
                "field": "",
            },
            status=503,
        )
        response["X-Controlplane-Draining"] = "1"  # "refused unread": the SDK resends any call
        return response
    return api.create_response(
        request,
        {
            "error": "database_unavailable",
            "detail": "the database did not answer; if this was a write, whether it took effect "
            "is unknown: read it back, or resend it with the same idempotency key",
            "field": "",
        },
        status=500,
    )


def _unstorable_field(request: HttpRequest, exc: DataError, message: str) -> str:
    """The field a DataError is about: PostgreSQL's column when it names one, else the body field
    whose text is longer than the varchar(N) it complains of, else the body as a whole."""
    import json
    import re

    diag = getattr(exc.__cause__, "diag", None)
    if column := getattr(diag, "column_name", None):
        return str(column)
    if (width := re.search(r"varying\((\d+)\)", message)) is not None:
        try:
            body = json.loads(request.body or b"{}")
        except ValueError:
            body = None
        if isinstance(body, dict):
            for key, value in body.items():
                if isinstance(value, str) and len(value) > int(width.group(1)):
                    return str(key)
    return "body"


@api.exception_handler(AuthenticationError)
def unauthenticated(request: HttpRequest, exc: AuthenticationError):
    return api.create_response(
        request,
        {
            "error": "unauthenticated",
            "detail": "a valid bearer token or session is required",
            "field": "authorization",
        },
        status=401,
    )


@api.exception_handler(AuthorizationError)
def unauthorized(request: HttpRequest, exc: AuthorizationError):
    return api.create_response(
        request, {"error": "forbidden", "detail": str(exc) or "forbidden", "field": ""}, status=403
    )


@api.exception_handler(Http404)
def not_found(request: HttpRequest, exc: Http404):
    return api.create_response(
        request, {"error": "not_found", "detail": str(exc) or "not found", "field": ""}, status=404
    )


@api.exception_handler(HttpError)
def http_error(request: HttpRequest, exc: HttpError):
    # ninja wraps whatever the body parser raised in a 400 "Cannot parse request body": say why.
    cause = exc.__cause__
    if isinstance(cause, RequestDataTooBig):
        return body_too_large(request, cause)
    if isinstance(cause, BodyRefused):
        payload = {"error": "malformed_body", "detail": str(cause), "field": cause.field}
        return api.create_response(request, payload, status=400)
    if exc.status_code == 403 and "CSRF" in str(exc):
        payload = {"error": "csrf_failed", "detail": str(exc), "field": "csrfmiddlewaretoken"}
        return api.create_response(request, payload, status=403)
    code = "bad_request" if exc.status_code == 400 else "error"
    return api.create_response(
        request, {"error": code, "detail": str(exc), "field": ""}, status=exc.status_code
    )


@api.exception_handler(RequestDataTooBig)
def body_too_large(request: HttpRequest, exc: Exception):
    return api.create_response(
        request,
        {
            "error": "too_large",
            "detail": f"the request body exceeds {settings.DATA_UPLOAD_MAX_MEMORY_SIZE} bytes",
            "field": "body",
        },
        status=413,
    )


def _register_routers() -> None:
    from api.agents import router as agents_router
    from api.audit import router as audit_router
    from api.channels import router as channels_router
    from api.fleet import router as fleet_router
    from api.freezes import router as freezes_router
    from api.intake import router as intake_router
    from api.interventions import router as interventions_router
    from api.runs import router as runs_router
    from api.teams import router as teams_router
    from api.work import router as work_router

    api.add_router("", runs_router)
    api.add_router("", audit_router)
    api.add_router("", interventions_router)
    api.add_router("", work_router)
    api.add_router("", freezes_router)  # before /fleet/{operation_id}
    api.add_router("", fleet_router)
    api.add_router("", intake_router)
    api.add_router("", channels_router)
    api.add_router("", teams_router)
    api.add_router("", agents_router)


_register_routers()
