"""One redaction policy for everything that leaves the system (docs/security/hardening.md, "Redaction").

What it masks:

- **by key**, at any depth: a key is compared case- and separator-insensitively (``cardNumber``,
  ``Card_Number`` and ``card-number`` are all ``cardnumber``) against ``REDACTION_KEYS`` (exact) and
  ``REDACTION_KEY_PARTS`` (contained), both settings; a card-like key keeps its last four digits;
- **by value**, in any string (and any integer): a Luhn-valid 13-19 digit card number (spaces or
  dashes between groups allowed) keeps its last four; common secret formats (provider API keys,
  bearer tokens, private key blocks, ``key=value`` pairs of a secret key) are hidden.

Where it is applied: every API response to a person (api.app's renderer; a worker reads back what
it declared), every console page and dialog and every text export (core.middleware's
``RedactResponsesMiddleware`` on the rendered bytes, and console_tags' value tables on the data),
and every log line (``RedactingFilter``). The ledger stores what the worker sent -- reconciliation
needs the real values -- unless ``REDACTION_STORE_MASKED`` says to store args masked too.
"""

from __future__ import annotations

import logging
import re
from functools import lru_cache
from typing import Any

from django.conf import settings

MASK = "••••"

DEFAULT_KEYS = (
    "pan",
    "card",
    "cc",
    "ccnumber",
    "cvv",
    "cvc",
    "cvv2",
    "pin",
    "token",
    "ssn",
    "iban",
)
DEFAULT_KEY_PARTS = (
    "cardnumber",
    "creditcard",
    "cardno",
    "apikey",
    "secret",
    "password",
    "passwd",
    "passphrase",
    "accesstoken",
    "refreshtoken",
    "authtoken",
    "bearertoken",
    "privatekey",
    "authorization",
    "securitycode",
)
# Keys whose value is a card: masked to its last four digits (the rest are hidden entirely).
_CARD_KEYS = {"pan", "card", "cc", "ccnumber", "cardnumber", "creditcard", "cardno"}

# Not the fraction of a decimal number ("40.3000000000000005" in a metrics scrape or a float in JSON):
# a digit run right after "<digit>." or right before ".<digit>" is a number, never a card.
_CARD_RE = re.compile(
    r"(?<![0-9A-Za-z])(?<!\d\.)[2-6]\d{3}(?:[ -]?\d){9,15}(?![0-9A-Za-z])(?!\.\d)"
)
FOLDED = "\x00folded"  # a hint's first item: look for the rest in the case-folded text (_fold)
# Each secret pattern beside what it cannot match without: a literal (or a case-blind keyword),
# found in microseconds, where the pattern's own scan of a 60 KB console page costs ~1.3 ms (the
# middleware below masks every page: 15.7 ms of a list page's ~45 ms of CPU before these hints).
_SECRET_RES: list[tuple[tuple[str, ...], re.Pattern[str]]] = [
    (
        ("sk_", "rk_", "pk_"),
        re.compile(r"\b(?:sk|rk|pk)_(?:live|test)_[0-9A-Za-z]{8,}"),
    ),  # payments
    (("AKIA",), re.compile(r"\bAKIA[0-9A-Z]{16}\b")),  # cloud access key ids
    (("ghp_", "gho_", "ghu_", "ghs_", "ghr_"), re.compile(r"\bgh[pousr]_[0-9A-Za-z]{20,}")),
    (("xox",), re.compile(r"\bxox[abprs]-[0-9A-Za-z-]{10,}")),  # chat tokens
    (("AIza",), re.compile(r"\bAIza[0-9A-Za-z_\-]{30,}")),
    (("eyJ",), re.compile(r"\beyJ[0-9A-Za-z_-]{8,}\.[0-9A-Za-z_-]{8,}\.[0-9A-Za-z_-]{8,}")),  # JWTs
    ((FOLDED, "bearer"), re.compile(r"(?i)\bbearer\s+[0-9A-Za-z._~+/=-]{16,}")),
    (
        ("-----BEGIN ",),
        re.compile(
            r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?(?:-----END [A-Z ]*PRIVATE KEY-----|$)", re.S
        ),
    ),
]
# "api_key=abc123", "password: hunter2" inside free text (a log line, an error message).
_PAIR_RE = re.compile(
    r"(?i)\b([A-Za-z_\-]*(?:api[_-]?key|secret|password|passwd|access[_-]?token|private[_-]?key)"
    r"[A-Za-z_\-]*)(\s*[=:]\s*)(['\"]?)([^\s'\",;&<]{4,})"
)
# Its keywords alone: without one (in the folded text), _PAIR_RE cannot match, and its scan (a
# word-class run tried at every word) costs 5 ms on a 60 KB page.
_PAIR_HINT = (
    *(FOLDED, "apikey", "api_key", "api-key", "secret", "password", "passwd", "accesstoken"),
    *("access_token", "access-token", "privatekey", "private_key", "private-key"),
)


def _fold(text: str) -> str:
    """``text`` lower-cased, so that a keyword a case-blind pattern finds is a plain substring; or
    all of the hints when it holds one of the four non-ASCII letters that an IGNORECASE pattern's
    ASCII letters also match (Python's re: İ ı for i, ſ for s, K for k), so the pattern runs."""
    if any(c in text for c in _ODD_LETTERS):
        return " ".join(_PAIR_HINT[1:] + ("bearer",))
    return text.lower()


_ODD_LETTERS = ("\u0130", "\u0131", "\u017f", "\u212a")


def _may_match(hint: tuple[str, ...], text: str, folded: list[str]) -> bool:
    if hint[0] is FOLDED:
        if not folded:
            folded.append(_fold(text))
        return any(h in folded[0] for h in hint[1:])
    return any(h in text for h in hint)


def normal_key(key: str) -> str:
    return re.sub(r"[^0-9a-z]", "", str(key).casefold())


@lru_cache(maxsize=1)
def _policy() -> tuple[frozenset[str], tuple[str, ...]]:
    keys = getattr(settings, "REDACTION_KEYS", DEFAULT_KEYS)
    parts = getattr(settings, "REDACTION_KEY_PARTS", DEFAULT_KEY_PARTS)
    return frozenset(normal_key(k) for k in keys), tuple(normal_key(p) for p in parts)


def reset_policy() -> None:
    """Forget the cached settings (tests that change REDACTION_KEYS call it)."""
    _policy.cache_clear()


def sensitive_key(key: Any) -> str | None:
    """``"last4"`` or ``"hide"`` if values under ``key`` are masked, else None."""
    if not isinstance(key, str):
        return None
    norm = normal_key(key)
    keys, parts = _policy()
    if norm in keys or any(p in norm for p in parts):
        return "last4" if norm in _CARD_KEYS or "card" in norm else "hide"
    return None


def luhn_valid(digits: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = ord(ch) - 48
        if i % 2:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def _card(match: re.Match) -> str:
    digits = re.sub(r"[ -]", "", match.group(0))
    if 13 <= len(digits) <= 19 and luhn_valid(digits):
        return MASK + digits[-4:]
    return match.group(0)


def redact_text(text: str) -> str:
    """Card numbers and secrets found in free text, masked; everything else kept."""
    if not text or len(text) < 8:
        return text
    out = _CARD_RE.sub(_card, text) if any(c.isdigit() for c in text) else text
    folded: list[str] = []  # made once, when a case-blind pattern's hint needs it
    for hint, rx in _SECRET_RES:
        if _may_match(hint, out, folded):
            out = rx.sub(MASK, out)
            folded.clear()
    if not _may_match(_PAIR_HINT, out, folded):
        return out
    return _PAIR_RE.sub(lambda m: f"{m.group(1)}{m.group(2)}{m.group(3)}{MASK}", out)


def mask(value: Any, how: str) -> Any:
    if value in (None, ""):
        return value
    text = str(value)
    if how == "last4" and len(text) > 4 and isinstance(value, (str, int)):
        return MASK + text[-4:]
    return MASK


def redact(value: Any, extra_keys: dict[str, str] | None = None) -> Any:
    """``value`` (a JSON document) as people may see it: sensitive keys masked at any depth, card
    numbers and secrets masked inside every string. ``extra_keys``: a tool adapter's own rules
    (interventions.registry.redaction), key -> "last4" | "hide"."""
    return _walk(value, extra_keys or {})


def _walk(node: Any, extra: dict[str, str], depth: int = 0) -> Any:
    if depth > 64:  # core.limits bounds stored documents far below this
        return MASK
    if isinstance(node, dict):
        out = {}
        for k, v in node.items():
            how = (extra.get(k) if isinstance(k, str) else None) or sensitive_key(k)
            if how is None:
                out[k] = _walk(v, extra, depth + 1)
            else:  # a nested value under a secret key is hidden whole
                out[k] = _hide_all(v) if isinstance(v, (dict, list)) else mask(v, how)
        return out
    if isinstance(node, (list, tuple)):
        return [_walk(v, extra, depth + 1) for v in node]
    if isinstance(node, str):
        return redact_text(node)
    if isinstance(node, int) and not isinstance(node, bool) and node > 10**12:
        text = str(node)
        return MASK + text[-4:] if _CARD_RE.fullmatch(text) and luhn_valid(text) else node
    return node


def _hide_all(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _hide_all(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_hide_all(v) for v in node]
    return MASK if node not in (None, "") else node


class RedactingFilter(logging.Filter):
    """Masks card numbers and secrets in every log record's message (settings.LOGGING)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a broken format string: leave it to the handler to report
            return True
        masked = redact_text(message)
        if masked != message:
            record.msg, record.args = masked, None
        return True


_TEXT_TYPES = ("text/html", "text/plain", "text/csv", "text/event-stream")
_JSON_TYPES = ("application/json", "application/x-ndjson", "application/jsonl")


class RedactResponsesMiddleware:
    """The last word on every console page, dialog, fragment and export: card numbers and secrets in
    the rendered bytes are masked (value detection; the pages' data was masked by key before it was
    drawn, console_tags.value_table). JSON Lines exports are masked record by record, by key and by
    value. /api/ answers are masked by its renderer (api.redacting) and pass through untouched."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        if request.path.startswith(("/api/", "/static/")):
            return response
        kind = response.get("Content-Type", "").split(";")[0].strip()
        if kind in _JSON_TYPES:
            if response.streaming:
                response.streaming_content = _json_lines(response.streaming_content)
                # Masked lines have other lengths: a declared length would frame the stream wrongly.
                del response["Content-Length"]
            else:
                _set_body(response, b"".join(_json_lines([response.content])))
        elif kind in _TEXT_TYPES and not response.streaming:
            text = response.content.decode(response.charset or "utf-8", "replace")
            masked = redact_text(text)
            if masked != text:
                _set_body(response, masked.encode(response.charset or "utf-8"))
        return response


def _set_body(response, body: bytes) -> None:
    """The masked body, with its Content-Length (set by CommonMiddleware, which runs before this on
    the way out) made to match. A mask is seldom as long as what it hides ("••••" is 12 bytes), and a
    declared length a few bytes short leaves the rest of the body on a kept-alive connection, where
    the client reads it as the next answer's status line (seen from daphne as
    ``illegal status line: bytearray(b'tml>')``)."""
    if body == response.content:
        return
    response.content = body
    if response.has_header("Content-Length"):
        response["Content-Length"] = str(len(body))


def _json_lines(chunks):
    """Each JSON line of ``chunks`` re-encoded with core.redaction applied (a line that is not JSON
    is masked as text). Lines may straddle chunks."""
    import json

    pending = b""
    for chunk in chunks:
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            yield _json_line(line, json) + b"\n"
    if pending:
        yield _json_line(pending, json)


def _json_line(line: bytes, json) -> bytes:
    if not line.strip():
        return line
    try:
        doc = json.loads(line)
    except ValueError:
        return redact_text(line.decode("utf-8", "replace")).encode()
    masked = redact(doc)
    return line if masked == doc else json.dumps(masked, ensure_ascii=False).encode()


def stored_args(args: Any) -> Any:
    """What the ledger keeps of a declaration's args: as sent (reconciliation needs them), or masked
    when ``REDACTION_STORE_MASKED`` is on. Approvals pass through it too, so digests still match."""
    return redact(args) if getattr(settings, "REDACTION_STORE_MASKED", False) else args
