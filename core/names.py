"""Tool and action names are identifiers: one canonical form, and nothing else gets in.

A grant, a policy, a freeze and the ledger compare names as text. If ``payments:CHARGE``,
``charge `` (a trailing space or tab), ``char\u200bge`` (a zero-width space) or ``chаrge`` (a Cyrillic
``а``) were accepted, each would be a different action to every rule and the same one to the tool
behind it: a wildcard grant would authorise it past an ``amount>200`` policy and a live freeze. So
the edge refuses every name that is not already canonical (docs/security/hardening.md, "Names"):

- the declared alphabet: lowercase ASCII letters, digits, ``_``, ``.`` and ``-``, starting with a
  letter or digit, at most 100 characters;
- for anything else the 422 says why and, when a canonical form exists (NFKC, casefolded, trimmed,
  zero-width and control characters removed) and is in the alphabet, what was probably meant.

Because refused names are never stored, every comparison downstream is on the canonical form.
"""

from __future__ import annotations

import re
import unicodedata

NAME_MAX = 100
NAME_RE = re.compile(r"[a-z0-9][a-z0-9_.\-]*")  # fullmatch: "$" would let a trailing \n in
_INVISIBLE = {"Cc", "Cf", "Zs", "Zl", "Zp"}  # controls, format (zero-width ...), spaces


def canonical_name(text: str) -> str:
    """NFKC, casefolded, with whitespace, control and zero-width characters removed."""
    folded = unicodedata.normalize("NFKC", text).casefold()
    return "".join(ch for ch in folded if unicodedata.category(ch) not in _INVISIBLE)


def name_problem(text: str) -> str | None:
    """Why ``text`` is not a canonical tool or action name, or None."""
    if not text:
        return "must not be empty"
    if len(text) > NAME_MAX:
        return f"must be at most {NAME_MAX} characters"
    if NAME_RE.fullmatch(text):
        return None
    for ch in text:
        category = unicodedata.category(ch)
        if category in _INVISIBLE:
            why = f"contains an invisible or space character U+{ord(ch):04X}"
            break
        if not ch.isascii():
            why = f"contains the non-ASCII character {ch!r} (U+{ord(ch):04X})"
            break
        if ch.isupper():
            why = "must be lowercase"
            break
    else:
        why = "may hold only a-z, 0-9, '_', '.' and '-', starting with a letter or digit"
    meant = canonical_name(text)
    if meant != text and NAME_RE.fullmatch(meant) and len(meant) <= NAME_MAX:
        why += f" (did you mean {meant!r}?)"
    return why


def scope_problem(scope: str) -> str | None:
    """Why ``scope`` is not ``tool:action`` or ``tool:*`` with canonical names, or None."""
    tool, sep, action = scope.partition(":")
    if not sep:
        return "must look like 'tool:action' or 'tool:*'"
    if why := name_problem(tool):
        return f"tool {why}"
    if action != "*" and (why := name_problem(action)):
        return f"action {why}"
    return None
