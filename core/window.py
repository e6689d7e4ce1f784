"""The window of times this project stores: PostgreSQL accepts years psycopg cannot read back
(year 1 at +14:00, 9999 at -14:00), so every time a worker or a person writes must lie inside it
(docs/security.md). core.limits and core.times both read it; it imports neither."""

from __future__ import annotations

from datetime import UTC, datetime

MIN_YEAR, MAX_YEAR = 2000, 2100  # psycopg cannot read back years past 9999 (after any offset)
DATETIME_MIN = datetime(MIN_YEAR, 1, 1, tzinfo=UTC)
DATETIME_MAX = datetime(MAX_YEAR, 12, 31, 23, 59, 59, tzinfo=UTC)


def datetime_problem(value: datetime) -> str | None:
    if value.tzinfo is None or value.utcoffset() is None:
        return "must carry a time zone offset (e.g. 2030-01-01T12:00:00Z)"
    try:
        inside = DATETIME_MIN <= value <= DATETIME_MAX
    except OverflowError:  # its UTC form is outside Python's years 1-9999 (year 1 at +14:00)
        inside = False
    if not inside:
        return f"must lie between {MIN_YEAR}-01-01 and {MAX_YEAR}-12-31 (UTC)"
    return None
