"""Binds the request's id to the log context and the trace, before any view runs."""

from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse

from core.auth import request_id
from core.telemetry import new_request


class RequestIdsMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        new_request(request_id=request_id(request))
        return self.get_response(request)
