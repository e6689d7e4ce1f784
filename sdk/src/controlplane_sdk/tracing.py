"""W3C trace context on every call: ``traceparent: 00-<trace id>-<span id>-01``.

With OpenTelemetry installed and a span active, the header continues that trace. Otherwise every call
a run makes carries the run's own trace id (its UUID, which is 32 hex digits like a trace id), so the
server's logs and traces group one run's calls without any setup; outside a run, each call starts a
trace of its own.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Iterator
from contextvars import ContextVar

_trace_id: ContextVar[str | None] = ContextVar("controlplane_trace_id", default=None)


def _otel() -> str | None:
    try:
        from opentelemetry import trace
    except ImportError:
        return None
    sc = trace.get_current_span().get_span_context()
    if not sc.is_valid:
        return None
    return f"00-{sc.trace_id:032x}-{sc.span_id:016x}-{int(sc.trace_flags):02x}"


def traceparent() -> str:
    """The header value for the next call (a fresh span id each time)."""
    return _otel() or f"00-{_trace_id.get() or secrets.token_hex(16)}-{secrets.token_hex(8)}-01"


def trace_id_for(run_id: str) -> str:
    hex_id = run_id.replace("-", "").lower()
    valid = len(hex_id) == 32 and all(c in "0123456789abcdef" for c in hex_id)
    return hex_id if valid and hex_id != "0" * 32 else secrets.token_hex(16)


@contextlib.contextmanager
def run_trace(run_id: str) -> Iterator[str]:
    """Every call made inside (in this context) belongs to the run's trace."""
    token = _trace_id.set(trace_id_for(run_id))
    try:
        yield _trace_id.get() or ""
    finally:
        _trace_id.reset(token)
