"""Worker-written times: one parser at the edge, and a reader that never fails on a stored one.

A worker writes times in many places -- a run's deadline, a timer's ``fire_at``, an assumption's
``observed_at``, and any ISO 8601 text inside event data, outcome details, checkpoint state or run
input. PostgreSQL accepts more than Python can read back: ``0001-01-01T00:00:00+14:00`` is year 0 in
UTC, ``9999-12-31T23:00:00-14:00`` is year 10000; psycopg then raises ``DataError`` on every read of
the row, and the run's page, its pause preview and the timer beat would fail with it.

So, in two layers (docs/security/hardening.md, "Unreadable times"):

- **The edge refuses them.** ``parse_worker_time`` is the one parser of a typed time field (inside
  core.limits' window, a 4xx naming the field otherwise); ``time_text_problem`` is the check
  core.limits.json_problem runs on every string of every JSON document an edge accepts: text that
  is an ISO 8601 time must be readable in UTC and in every offset a page may render it in.
- **A reader never fails on one already stored** (by an older release, or by raw SQL). The
  ``timestamptz`` loader installed on every PostgreSQL connection turns a value Python cannot hold
  into an ``UnreadableTime``: a datetime clamped to the window's nearer edge ("long ago" or "far
  off", so a due check, a staleness check or a subtraction still works) that says it is one. Pages
  render it as "unreadable" (console_tags.reltime), and a log line names the stored text.
"""

from __future__ import annotations

import logging
import re
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any

from django.utils import timezone
from django.utils.dateparse import parse_datetime

from core import pg
from core.errors import Invalid
from core.window import DATETIME_MAX, DATETIME_MIN, datetime_problem

log = logging.getLogger("controlplane.times")

# Text a page would take for a time (console_tags.ISO_RE, with a looser tail).
ISO_TIME_RE = re.compile(r"^\s*[+-]?\d{4,}-\d{1,2}-\d{1,2}[T ]\d{1,2}:\d{2}")
# Python's range, less a day each side: any offset (at most ±24 h) still lands inside it.
_READABLE_MIN = datetime(1, 1, 2, tzinfo=UTC)
_READABLE_MAX = datetime(9999, 12, 30, tzinfo=UTC)


def parse_worker_time(value: Any, field: str) -> datetime:
    """A typed time a worker sent (an ISO 8601 string or an aware datetime), inside the window the
    database and every page can hold, or ``Invalid`` naming ``field``. Naive text is taken as UTC."""
    parsed: datetime | None
    if isinstance(value, datetime):
        parsed = value
    else:
        try:
            parsed = parse_datetime(value) if isinstance(value, str) else None
        except (ValueError, OverflowError):  # well formed but not a date (month 13, offset 25 h)
            parsed = None
    if parsed is None:
        raise Invalid(f"{field} must be an ISO 8601 datetime", field=field)
    if timezone.is_naive(parsed):
        parsed = parsed.replace(tzinfo=UTC)
    if why := datetime_problem(parsed):
        raise Invalid(f"{field} {why}", field=field)
    return parsed


def time_text_problem(text: str) -> str | None:
    """Why ``text``, a time in ISO 8601, could not be read back and shown; None when it can or when
    it is no time at all (free text is the JSON document's business, not ours)."""
    if not ISO_TIME_RE.match(text):
        return None
    raw = text.strip()
    try:
        parsed = parse_datetime(raw)
    except (ValueError, OverflowError):
        parsed = None
    if parsed is None:
        try:  # what console_tags.as_datetime also accepts
            parsed = datetime.fromisoformat(raw.replace("Z", "+00:00"))
        except ValueError:  # no time a page could read: just text
            return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    try:
        inside = _READABLE_MIN <= parsed <= _READABLE_MAX
    except OverflowError:
        inside = False
    if not inside:
        return "is a time outside years 1-9999 in UTC: it could not be read back"
    return None


class UnreadableTime(datetime):
    """A stored time Python cannot hold, clamped to the nearer edge of the window. ``stored`` is
    PostgreSQL's text of it (for the log and the page)."""

    stored: str = ""
    unreadable = True

    def __reduce__(self):  # pickled by the cache / Celery as a plain datetime
        return (datetime, tuple(datetime.__reduce__(self)[1]))


def unreadable(stored: str, *, too_early: bool) -> UnreadableTime:
    edge = DATETIME_MIN if too_early else DATETIME_MAX
    value = UnreadableTime(
        edge.year, edge.month, edge.day, edge.hour, edge.minute, edge.second, tzinfo=UTC
    )
    value.stored = stored
    return value


def is_unreadable(value: Any) -> bool:
    return isinstance(value, UnreadableTime)


@lru_cache(maxsize=32)
def _safe_loader_class(base: type, tz: Any) -> type:
    """One class per (base, zone), built once: every pool checkout registers it again (Django sends
    ``connection_created`` on each), and a class is costlier to build than to look up."""

    class SafeTzLoader(base):
        timezone = tz

        def load(self, data):
            try:
                return super().load(data)
            except Exception as exc:  # psycopg.DataError: before year 1 / after year 10K
                text = bytes(data).decode("ascii", "replace")
                log.warning("unreadable stored time %r read as the window's edge: %s", text, exc)
                early = text.rstrip().endswith("BC") or "small" in str(exc)
                return unreadable(text, too_early=early)

    return SafeTzLoader


def install_safe_time_loader(sender: Any = None, connection: Any = None, **_: Any) -> None:
    """connection_created receiver: on PostgreSQL (psycopg 3), replace Django's ``timestamptz``
    loader with one that reads an out-of-range value as an ``UnreadableTime`` instead of raising.
    The class keeps Django's ``timezone`` attribute, so Django's per-cursor re-registration (which
    compares it) leaves ours in place."""
    if connection is None or not pg.enabled(connection):
        return
    try:
        from django.db.backends.postgresql.psycopg_any import BaseTzLoader, is_psycopg3
    except ImportError:  # pragma: no cover - psycopg2
        return
    if not is_psycopg3:  # pragma: no cover
        return
    raw = connection.connection
    raw.adapters.register_loader(
        "timestamptz", _safe_loader_class(BaseTzLoader, connection.timezone)
    )


def iso(value: datetime | None) -> str | None:
    """A stored time as ISO 8601 text for a page, a preview or a receipt; None when it is unreadable
    (the caller's row says so with ``unreadable_time(value)``) -- never the clamped edge as fact."""
    if value is None or is_unreadable(value):
        return None
    return value.isoformat()


def unreadable_note(value: Any) -> dict[str, str]:
    """``{"unreadable": <stored text>}`` for a row whose time could not be read, else ``{}``."""
    return {"unreadable": value.stored} if is_unreadable(value) else {}
