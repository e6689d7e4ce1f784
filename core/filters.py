"""Reading the values of list filters from a query string: times ("2h" or ISO 8601), id prefixes,
and keyset cursors. Shared by the run list (runs/search.py) and the audit trail (audit/selectors.py),
so "since=2h" and "a run id prefix" mean the same on every page and in the API.

Every parser raises :class:`BadFilter` naming the parameter; the console answers it with a 400 page,
the API with a 400 JSON body ``{"error": "bad_filter", "detail", "field"}``.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import uuid
from datetime import UTC, datetime, timedelta

from core.errors import DomainError
from core.limits import MAX_INT, bad_character
from core.window import DATETIME_MAX, DATETIME_MIN


class BadFilter(DomainError):
    status, code = 400, "bad_filter"

    def __init__(self, field: str, why: str):
        super().__init__(f"{field}: {why}", field=field)
        self.field = field


_RELATIVE = re.compile(r"^(\d{1,6})\s*(s|m|min|h|d|w)$")
_UNITS = {"s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_when(field: str, raw: str, *, now: datetime | None = None) -> datetime:
    """``2h`` / ``30m`` / ``7d`` (that long ago) or an ISO 8601 date or datetime (UTC when it carries
    no offset)."""
    text = raw.strip().lower()
    match = _RELATIVE.match(text)
    if match:
        seconds = int(match.group(1)) * _UNITS[match.group(2)]
        if seconds > 100 * 365 * 86400:
            raise BadFilter(field, "a duration of at most 100 years")
        return (now or datetime.now(UTC)) - timedelta(seconds=seconds)
    try:
        value = datetime.fromisoformat(raw.strip())
    except ValueError:
        raise BadFilter(
            field, "a duration such as 30m, 2h, 7d or an ISO time such as 2030-01-01T12:00Z"
        ) from None
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    if not DATETIME_MIN <= value <= DATETIME_MAX:
        raise BadFilter(field, "must lie between 2000-01-01 and 2100-12-31 (UTC)")
    return value


_HEX = re.compile(r"^[0-9a-f]+$")


def parse_id_prefix(field: str, raw: str, *, min_len: int = 1) -> str:
    """The hex digits of a UUID or of its prefix (hyphens ignored, any case)."""
    digits = raw.strip().lower().replace("-", "")
    if not digits or not _HEX.match(digits) or len(digits) > 32:
        raise BadFilter(field, "an id or the start of one: hexadecimal digits (0-9, a-f)")
    if len(digits) < min_len:
        raise BadFilter(field, f"at least {min_len} hexadecimal digits of an id")
    return digits


def looks_like_id_prefix(raw: str, *, min_len: int = 4) -> bool:
    digits = raw.strip().lower().replace("-", "")
    return min_len <= len(digits) <= 32 and bool(_HEX.match(digits))


def prefix_range(digits: str) -> tuple[uuid.UUID, uuid.UUID]:
    """The first and last UUID starting with ``digits``: a prefix becomes a range on the primary-key
    index (PostgreSQL compares uuids byte by byte, which is the order of their hex digits)."""
    return uuid.UUID(digits.ljust(32, "0")), uuid.UUID(digits.ljust(32, "f"))


def check_text(field: str, raw: str, *, max_len: int) -> str:
    value = raw.strip()
    if len(value) > max_len:
        raise BadFilter(field, f"at most {max_len} characters")
    if why := bad_character(value):
        raise BadFilter(field, why)
    return value


def encode_cursor(values: list) -> str:
    """An opaque, URL-safe cursor for keyset paging: the last row's sort key values."""
    raw = json.dumps(values, separators=(",", ":"), default=str).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(field: str, raw: str, *, size: int) -> list:
    """The values of ``encode_cursor``; anything else is a BadFilter (never a 500)."""
    text = raw.strip()
    if len(text) > 400:
        raise BadFilter(field, "not a cursor from this list")
    try:
        values = json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
    except (binascii.Error, ValueError, UnicodeDecodeError):
        raise BadFilter(field, "not a cursor from this list") from None
    if (
        not isinstance(values, list)
        or len(values) != size
        or not all(
            isinstance(v, str) or (isinstance(v, int) and abs(v) <= MAX_INT) or v is None
            for v in values
        )
    ):
        raise BadFilter(field, "not a cursor from this list")
    return values
