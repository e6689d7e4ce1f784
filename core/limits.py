"""Input limits at every edge (API bodies and queries, console forms and query strings).

Whatever an edge accepts is stored, read back and rendered later -- by an operator who must be able
to pause or cancel the run it belongs to. So a value is refused at the edge (a 4xx naming the field)
unless PostgreSQL can store it, psycopg can read it back and a page can render it: no NUL, no lone
surrogates or Unicode non-characters, finite numbers inside 64-bit range, datetimes tz-aware and
inside a sane window, JSON documents of bounded depth and size. docs/security.md ("Input limits") lists
these numbers; keep the two in step.
"""

from __future__ import annotations

import json
import math
from typing import Any

from core.times import time_text_problem

MAX_BODY_BYTES = 1024 * 1024  # a whole request body (settings.DATA_UPLOAD_MAX_MEMORY_SIZE)
MAX_JSON_BYTES = 256 * 1024  # one JSON-valued field (args, input, state, detail, data, options ...)
MAX_JSON_DEPTH = 32  # nesting of objects and arrays inside one such field
MAX_INT = 2**63 - 1  # PostgreSQL bigint; integers inside JSON documents too
MAX_FLOAT = 1e300  # finite, and far from overflow when a page or a backoff multiplies it


def bad_character(text: str) -> str | None:
    """Why ``text`` cannot be stored and shown, or None. PostgreSQL refuses NUL in text and jsonb;
    a lone surrogate cannot be encoded as UTF-8 at all; non-characters (U+FDD0..U+FDEF, U+xFFFE,
    U+xFFFF) are reserved "never interchange" code points that only a hostile client sends."""
    for ch in text:
        code = ord(ch)
        if code == 0:
            return "must not contain NUL (\\u0000) characters"
        if 0xD800 <= code <= 0xDFFF:
            return "must not contain unpaired surrogates"
        if 0xFDD0 <= code <= 0xFDEF or (code & 0xFFFE) == 0xFFFE:
            return f"must not contain the Unicode non-character U+{code:04X}"
    return None


def _scalar_problem(value: Any) -> str | None:
    if isinstance(value, str):
        return bad_character(value) or time_text_problem(value)
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return None if -MAX_INT - 1 <= value <= MAX_INT else "integers must fit in 64 bits"
    if isinstance(value, float):
        if not math.isfinite(value):
            return "numbers must be finite"
        return None if abs(value) <= MAX_FLOAT else f"numbers must be within ±{MAX_FLOAT:g}"
    return None


def json_problem(value: Any, path: str = "") -> tuple[str, str] | None:
    """(path, why) of the first value inside ``value`` that must be refused, or None.

    Iterative, so a hostile nesting depth cannot exhaust the interpreter's stack while we look."""
    stack: list[tuple[Any, str, int]] = [(value, path, 0)]
    while stack:
        item, where, depth = stack.pop()
        if isinstance(item, dict | list | tuple):
            if depth >= MAX_JSON_DEPTH:
                return where, f"nested deeper than {MAX_JSON_DEPTH} levels"
            pairs = item.items() if isinstance(item, dict) else enumerate(item)
            for key, child in pairs:
                if isinstance(key, str) and (why := bad_character(key)):
                    return where, f"key {key[:40]!r}: {why}"
                stack.append((child, f"{where}.{key}" if where else str(key), depth + 1))
        elif why := _scalar_problem(item):
            return where, why
    if isinstance(value, dict | list) and value:
        size = len(json.dumps(value, ensure_ascii=False, default=str).encode())
        if size > MAX_JSON_BYTES:
            return path, f"larger than {MAX_JSON_BYTES} bytes as JSON ({size})"
    return None


def parse_seq(raw: str | None, *, default: int | None = None) -> int | None:
    """A sequence number from a query string: digits only, inside bigint. ValueError otherwise."""
    if raw is None or raw == "":
        return default
    if not raw.isascii() or not raw.isdigit() or len(raw) > 19 or int(raw) > MAX_INT:
        raise ValueError(f"must be a whole number between 0 and {MAX_INT}")
    return int(raw)
