"""In-process observations the edges make for /metrics (controlplane/metrics.py exposes them).

Only what the database cannot tell: how long issuing an intervention took, as the caller saw it, and
how long each worker-protocol call took, by endpoint. Counts
and ages are read from the database at scrape time instead, so every server process reports the same.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from prometheus_client import Histogram

from core.errors import DomainError
from core.roles import PERMISSIONS

INTERVENTION_SECONDS = Histogram(
    "controlplane_intervention_issue_seconds",
    "Time to issue an intervention (preview check, decision, commit), by kind and outcome.",
    ["kind", "outcome"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)


@contextmanager
def observe_intervention(kind: str) -> Iterator[None]:
    """Time one ``interventions.base.issue`` call. ``outcome`` is "issued" or the refusal's error code."""
    # The kind comes from the request: an unknown one is folded into "other", so a caller cannot
    # create label values (one time series each) at will.
    label = kind if kind in PERMISSIONS else "other"
    outcome, started = "error", time.perf_counter()
    try:
        yield
        outcome = "issued"
    except DomainError as exc:
        outcome = exc.code
        raise
    finally:
        INTERVENTION_SECONDS.labels(kind=label, outcome=outcome).observe(
            time.perf_counter() - started
        )


PROTOCOL_SECONDS = Histogram(
    "controlplane_protocol_call_seconds",
    "Time to answer a worker-protocol call (/api/v1), by endpoint (the URL pattern), method and "
    "status class. Heartbeat long-polls include their wait.",
    ["endpoint", "method", "status"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
)
API_PREFIX = "/api/"


class ProtocolTimingMiddleware:
    """Observes PROTOCOL_SECONDS for every request under /api/. The endpoint label is the matched
    URL pattern (``api/v1/runs/<uuid:run_id>/claim``), never the path, so ids make no new series;
    an unmatched path is "unmatched"."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if not request.path.startswith(API_PREFIX):
            return self.get_response(request)
        started = time.perf_counter()
        response = self.get_response(request)
        match = getattr(request, "resolver_match", None)
        endpoint = match.route if match is not None and match.route else "unmatched"
        PROTOCOL_SECONDS.labels(
            endpoint=endpoint,
            method=request.method if request.method in _METHODS else "other",
            status=f"{response.status_code // 100}xx",
        ).observe(time.perf_counter() - started)
        return response


_METHODS = frozenset({"GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"})
