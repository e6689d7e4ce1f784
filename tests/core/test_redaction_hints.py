"""core.redaction skips a pattern whose hint (a literal it cannot match without) is absent: the
console masks every page it renders, and the scans were a third of a list page's CPU. The hints
must never skip a text the pattern would mask: the same texts with and without them."""

from __future__ import annotations

import re

import pytest

from core import redaction

SAMPLES = [
    "my API_KEY=abcdef123",
    "Api-Key: 'zz9988776655'",
    "Authorization: Bearer abcdefghijklmnop1234",
    "BEARER abcdefghijklmnop1234",
    "x ghp_" + "a" * 24,
    "ghs_" + "B" * 30 + " and gho_" + "c" * 20,
    "AKIA" + "A" * 16,
    "xoxb-1234567890-abc",
    "AIza" + "x" * 35,
    "eyJhbGciOiJI.eyJzdWIiOiIx.SflKxwRJSMeK",
    "sk_live_abcdefghijk rk_test_12345678",
    "-----BEGIN RSA PRIVATE KEY-----\nabc\n-----END RSA PRIVATE KEY-----",
    # the non-ASCII letters Python's IGNORECASE matches to ASCII ones: ſ (s), K (k), İ ı (i)
    "pa\u017fsword: hunter22",
    "private-\u212aey=zzzzzz",
    "ap\u0131_key=abcdef12",
    "\u0130NVALID api\u212aey=abcdef12",
    "secret=hunter22 access_token: abcdefgh",
    "nothing here 4111 1111 1111 1111",
    "a page without any: keyboard, tokens ok, hotkey",
]


def _unhinted(text: str) -> str:
    out = redaction._CARD_RE.sub(redaction._card, text) if any(c.isdigit() for c in text) else text
    for _hint, rx in redaction._SECRET_RES:
        out = rx.sub(redaction.MASK, out)
    return redaction._PAIR_RE.sub(
        lambda m: f"{m.group(1)}{m.group(2)}{m.group(3)}{redaction.MASK}", out
    )


@pytest.mark.parametrize("text", SAMPLES)
def test_the_hints_skip_nothing_the_patterns_mask(text):
    assert redaction.redact_text(text) == _unhinted(text)


def test_every_case_blind_pattern_has_a_folded_hint():
    for hint, rx in redaction._SECRET_RES:
        assert (hint[0] is redaction.FOLDED) == bool(rx.flags & re.IGNORECASE)
    assert redaction._PAIR_HINT[0] is redaction.FOLDED
