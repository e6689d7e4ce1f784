"""The ids an operator searches by -- run, attempt, effect, intervention, action -- on the current
trace span and in every log line written while a decision runs. Both are optional: without
OpenTelemetry or structlog installed, :func:`annotate` does nothing."""

from __future__ import annotations

from typing import Any

try:
    from opentelemetry import trace
except ImportError:  # pragma: no cover - tracing is an optional extra
    trace = None  # type: ignore[assignment]

try:
    import structlog
except ImportError:  # pragma: no cover
    structlog = None  # type: ignore[assignment]


def annotate(**ids: Any) -> None:
    """``annotate(run_id=..., attempt_id=..., effect_id=..., intervention_id=..., action=...)``."""
    clean = {k: str(v) for k, v in ids.items() if v not in (None, "")}
    if not clean:
        return
    if structlog is not None:
        structlog.contextvars.bind_contextvars(**clean)
    if trace is not None:
        span = trace.get_current_span()
        if span.is_recording():
            for key, value in clean.items():
                span.set_attribute(f"controlplane.{key}", value)


def new_request(**ids: Any) -> None:
    """Forget the previous request's ids (threads are reused) and bind this one's."""
    if structlog is not None:
        structlog.contextvars.clear_contextvars()
    annotate(**ids)
