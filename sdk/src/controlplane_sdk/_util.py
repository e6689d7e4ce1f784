"""Small helpers shared by the SDK modules."""

from __future__ import annotations

import datetime as _dt
import decimal
import uuid
from typing import Any, NoReturn


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


def raise_sole(group: BaseExceptionGroup[Any]) -> NoReturn:
    """Raise the one exception inside ``group`` (through nested groups of one), else ``group``.

    An agent whose code runs in an asyncio ``TaskGroup`` (or anyio's task group, as MCP's client
    does) has a pause, cancel, lost lease or failure arrive wrapped in a group of one; the run loop
    ends the attempt by the table of the exception itself, as for an agent that raised it directly.
    A group of several is left as it is (a failure of the attempt)."""
    sole: BaseException = group
    while isinstance(sole, BaseExceptionGroup) and len(sole.exceptions) == 1:
        sole = sole.exceptions[0]
    if sole is group:
        raise group
    raise sole from None  # its own traceback says where it came from; the group adds only wrapping
