"""The API's JSON renderer: every response to a person passes core.redaction on its way out.

A worker token reads back what it declared (reconciliation and retries need the real values), so
its responses are rendered as they are; that also keeps the protocol's hot path free of the walk.
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from ninja.renderers import JSONRenderer

from core.actors import Actor
from core.redaction import redact


class RedactingRenderer(JSONRenderer):
    def render(self, request: HttpRequest, data: Any, *, response_status: int) -> Any:
        actor = getattr(request, "auth", None)
        if not (isinstance(actor, Actor) and actor.is_worker):
            data = redact(data)
        return super().render(request, data, response_status=response_status)
