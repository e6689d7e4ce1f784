"""Approval-policy conditions and the ``--approval`` spelling: a tiny language, parsed, never eval'd.

A condition is ``FIELD OP LITERAL``: FIELD a dotted path into the declaration's args (``amount``,
``shipping.country``), OP one of ``> >= < <= == !=``, LITERAL a number, ``true``/``false``/``null``,
a quoted string or a bare word. An empty condition matches every call.

Fail closed: a policy exists to stop an action, so when the args do not let the comparison be made
(the field is missing, or is not a number where the literal is) the condition *matches* and the
action needs approval. A numeric string ("20000") is compared as the number it spells, so a worker
cannot slip past ``amount>200`` by quoting the amount.

A policy spec (``register_agent --approval``) is ``TOOL:ACTION [CONDITION] [ROLE]``, e.g.
``payments:charge amount>200 approver``; ROLE defaults to ``approver``.
"""

from __future__ import annotations

import json
import math
import operator
import re
from dataclasses import dataclass
from typing import Any

from core.roles import APPROVER, APPROVING_ROLES

OPERATORS = {
    ">=": operator.ge,
    "<=": operator.le,
    "==": operator.eq,
    "!=": operator.ne,
    ">": operator.gt,
    "<": operator.lt,
}
_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_CONDITION = re.compile(
    rf"^\s*(?P<field>{_NAME}(?:\.{_NAME})*)\s*(?P<op>>=|<=|==|!=|>|<)\s*(?P<literal>.+?)\s*$"
)
_NUMBER = re.compile(r"^-?\d+(\.\d+)?([eE][-+]?\d+)?$")
_MISSING = object()


class ConditionError(ValueError):
    """The condition or policy spec does not parse; the message says why."""


# ``sum(amount)>200 per 1h``: the field summed over the run's authorised calls of the same tool:action
# in the window, this call included -- five charges of 200 do not pass a 200 limit one by one.
_SUM = re.compile(
    rf"^\s*sum\(\s*(?P<field>{_NAME}(?:\.{_NAME})*)\s*\)\s*(?P<op>>=|>)\s*(?P<literal>-?\d+(\.\d+)?)"
    r"\s+per\s+(?P<n>\d+)\s*(?P<unit>[smhd])\s*$"
)
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


@dataclass(frozen=True)
class Condition:
    field: str
    op: str
    literal: Any
    window_s: int | None = None  # a sum over the run's calls in this window (``sum(...) per``)

    def matches(self, args: dict[str, Any], prior: float = 0.0) -> bool:
        """``prior``: for a windowed sum, what the run's earlier calls in the window add up to."""
        value = _lookup(args, self.field)
        if value is _MISSING:
            return True  # fail closed
        compare = OPERATORS[self.op]
        if self.window_s is not None:
            number = as_number(value)
            return True if number is None or number < 0 else compare(prior + number, self.literal)
        if isinstance(self.literal, float):
            number = as_number(value)
            if number is not None and number < 0 <= self.literal and self.op in (">", ">="):
                # A bound on a magnitude ("amount>200") never lets a negative slip under it: -500
                # is a refund dressed as a charge. Fail closed: the action needs approval.
                return True
            return True if number is None else compare(number, self.literal)
        if self.op in ("==", "!="):
            return compare(value, self.literal)
        if isinstance(value, str) and isinstance(self.literal, str):
            return compare(value, self.literal)
        return True  # an ordering between things that do not order: fail closed


def parse_condition(text: str) -> Condition | None:
    """None for an empty condition (always matches); ConditionError if it does not parse."""
    if not text or not text.strip():
        return None
    if windowed := _SUM.match(text):
        window = int(windowed["n"]) * _UNIT_S[windowed["unit"]]
        if not 0 < window <= 31 * 86400:
            raise ConditionError(f"the window of {text!r} must be between 1 s and 31 days")
        return Condition(windowed["field"], windowed["op"], float(windowed["literal"]), window)
    found = _CONDITION.match(text)
    if found is None:
        raise ConditionError(
            f"condition {text!r} must look like FIELD OP LITERAL, e.g. amount>200 "
            f"(OP one of {', '.join(OPERATORS)})"
        )
    return Condition(found["field"], found["op"], _literal(found["literal"]))


def _literal(raw: str) -> Any:
    if _NUMBER.match(raw):
        value = float(raw)
        if not math.isfinite(value):
            raise ConditionError(f"literal {raw!r} is not a finite number")
        return value
    if raw in ("true", "false", "null"):
        return json.loads(raw)
    if len(raw) >= 2 and raw[0] == raw[-1] and raw[0] in "\"'":
        return raw[1:-1]
    if re.fullmatch(r"[A-Za-z0-9_.:@-]+", raw):
        return raw
    raise ConditionError(f"literal {raw!r} must be a number, true/false/null, or a (quoted) string")


def _lookup(args: Any, path: str) -> Any:
    for part in path.split("."):
        if not isinstance(args, dict) or part not in args:
            return _MISSING
        args = args[part]
    return args


def as_number(value: Any) -> float | None:
    """A finite number from a number or a numeric string, else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value) if math.isfinite(float(value)) else None
    if isinstance(value, str) and _NUMBER.match(value.strip()):
        return float(value)
    return None


@dataclass(frozen=True)
class PolicySpec:
    tool: str
    action: str
    condition: str
    approver_role: str


def parse_policy_spec(text: str) -> PolicySpec:
    """``TOOL:ACTION [CONDITION] [ROLE]`` -> PolicySpec, or ConditionError naming the problem."""
    words = (text or "").split()
    if not words:
        raise ConditionError("an approval policy needs at least TOOL:ACTION")
    tool, sep, action = words[0].partition(":")
    word = r"[A-Za-z0-9_-]+"
    if not (sep and re.fullmatch(word, tool) and (action == "*" or re.fullmatch(word, action))):
        raise ConditionError(f"{words[0]!r} must look like tool:action or tool:*")
    rest, role = words[1:], APPROVER
    if rest and rest[-1] in APPROVING_ROLES:
        role = rest.pop()
    elif rest and re.fullmatch(_NAME, rest[-1]) and len(rest) > 1:
        raise ConditionError(f"approver role {rest[-1]!r} must be one of {list(APPROVING_ROLES)}")
    condition = " ".join(rest)
    parse_condition(condition)  # raises with the reason if it does not parse
    return PolicySpec(tool, action, condition, role)
