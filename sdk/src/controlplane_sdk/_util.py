"""Small helpers shared by the SDK modules."""

from __future__ import annotations

import datetime as _dt
import decimal
import uuid
from typing import Any


def json_default(o: Any) -> Any:
    """``json.dumps`` fallback: datetimes/dates as ISO 8601, Decimal and UUID as strings, sets as lists."""
    if isinstance(o, (_dt.datetime, _dt.date)):
        return o.isoformat()
    if isinstance(o, (decimal.Decimal, uuid.UUID)):
        return str(o)
    if isinstance(o, (set, frozenset, tuple)):
        return list(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def now_iso() -> str:
    """Current UTC time, ISO 8601."""
    return _dt.datetime.now(_dt.UTC).isoformat()
