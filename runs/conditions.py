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

from core.roles import APPROVER, APPROVING_ROLES, SECURITY_RESPONDER

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
    """The condition or policy spec does not parse; the message says why. ``field``: the part of
    the JSON shape at fault (``steps[1].team``), when it is one."""

    def __init__(self, message: str, field: str = "") -> None:
        super().__init__(message)
        self.field = field


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


# Roles a multi-party step may name: the approving roles and the security responder (a second pair
# of eyes on what a payment or a data export exposes). A step may name a team instead
# (``2*team:payments``: two distinct members of team payments; runs.models.teams).
STEP_ROLES = (*APPROVING_ROLES, SECURITY_RESPONDER)
MAX_STEP_COUNT = 10
_TEAM = r"[A-Za-z0-9_-]{1,50}"  # a team's slug (runs.models.Team); whether it exists is asked later
_STEP = re.compile(
    rf"^(?:(?P<count>\d+)\*)?(?:team:(?P<team>{_TEAM})|(?P<role>[A-Za-z_][A-Za-z0-9_-]*))$"
)
_DURATION = re.compile(r"^(?P<n>\d+)(?P<unit>[smhd])$")


@dataclass(frozen=True)
class StepSpec:
    """One step of a multi-party approval: ``count`` distinct people holding ``role`` -- or, when
    ``team`` is set (``role`` then empty), members of that team --, decided within ``within_s`` of
    the step opening, required only when ``condition`` matches. Steps of the same ``stage`` are
    decided in any order; a stage opens when the one before is done."""

    stage: int
    role: str = ""
    count: int = 1
    within_s: int | None = None
    condition: str = ""
    # Not decided escalate_after_s after the step opens: re-sent to the channels serving escalate_to
    # (an on-call group or a role; notifications.jobs.escalate_due). The deadline is unchanged.
    escalate_after_s: int | None = None
    escalate_to: str = ""
    team: str = ""

    @property
    def target(self) -> str:
        """What the step names, as spelled: ``approver`` or ``team:payments``."""
        return f"team:{self.team}" if self.team else self.role

    def as_json(self) -> dict[str, Any]:
        # A team step keeps ``role`` (empty): a reader that only knows role steps finds the key,
        # and an empty role is satisfied by no one but an admin (fail closed).
        out: dict[str, Any] = {
            "stage": self.stage,
            "role": self.role,
            "count": self.count,
            "within_s": self.within_s,
            "condition": self.condition,
        }
        if self.team:
            out["team"] = self.team
        if self.escalate_after_s:
            out |= {"escalate_after_s": self.escalate_after_s, "escalate_to": self.escalate_to}
        return out

    @property
    def spec(self) -> str:
        words = [f"{self.count}*{self.target}" if self.count != 1 else self.target]
        if self.within_s:
            words.append(f"within {_duration_words(self.within_s)}")
        if self.escalate_after_s:
            words.append(
                f"escalate after {_duration_words(self.escalate_after_s)} to {self.escalate_to}"
            )
        if self.condition:
            words.append(f"if {self.condition}")
        return " ".join(words)


def _duration_words(seconds: int) -> str:
    for unit in "dhm":
        if seconds % _UNIT_S[unit] == 0:
            return f"{seconds // _UNIT_S[unit]}{unit}"
    return f"{seconds}s"


@dataclass(frozen=True)
class PolicySpec:
    tool: str
    action: str
    condition: str
    approver_role: str
    steps: tuple[StepSpec, ...] = ()  # empty: one approver of ``approver_role`` (the classic case)

    @property
    def multi_party(self) -> bool:
        return self.steps != () and self.steps != (StepSpec(0, self.approver_role),)


def parse_policy_spec(text: str) -> PolicySpec:
    """``TOOL:ACTION [CONDITION] [STEP ((then|and) STEP)*]`` -> PolicySpec, or ConditionError naming
    the problem. A STEP is ``[N*]ROLE`` or ``[N*]team:TEAM``, then ``[within DURATION] [if
    CONDITION]``; ``then`` starts the next stage (in order), ``and`` adds a step to the same stage
    (any order). The classic spelling
    ``tool:action [condition] [role]`` is the one-step, one-approver case."""
    words = (text or "").split()
    if not words:
        raise ConditionError("an approval policy needs at least TOOL:ACTION")
    tool, sep, action = words[0].partition(":")
    word = r"[A-Za-z0-9_-]+"
    if not (sep and re.fullmatch(word, tool) and (action == "*" or re.fullmatch(word, action))):
        raise ConditionError(f"{words[0]!r} must look like tool:action or tool:*")
    segments: list[tuple[str, list[str]]] = [("", [])]
    for w in words[1:]:
        if w in ("then", "and"):
            segments.append((w, []))
        else:
            segments[-1][1].append(w)
    first = segments[0][1]
    at = next((i for i, w in enumerate(first) if _is_step_word(w)), None)
    if at is None:
        if len(segments) > 1:
            raise ConditionError(f"{text!r}: name a role before {segments[1][0]!r}")
        if first and re.fullmatch(_NAME, first[-1]) and len(first) > 1:
            raise ConditionError(
                f"approver role {first[-1]!r} must be one of {list(APPROVING_ROLES)}"
            )
        condition = " ".join(first)
        parse_condition(condition)
        return PolicySpec(tool, action, condition, APPROVER)
    condition = " ".join(first[:at])
    parse_condition(condition)  # raises with the reason if it does not parse
    steps: list[StepSpec] = []
    stage = 0
    for i, (joiner, seg) in enumerate(segments):
        if i == 0:
            seg = first[at:]
        elif joiner == "then":
            stage += 1
        if not seg:
            raise ConditionError(f"{text!r}: a step is missing after {joiner!r}")
        steps.append(_parse_step(stage, seg))
    one = steps[0]
    if (
        len(steps) == 1
        and one.count == 1
        and not (one.within_s or one.condition or one.escalate_to or one.team)
    ):
        return PolicySpec(tool, action, condition, steps[0].role)
    return PolicySpec(tool, action, condition, strongest_role(steps), tuple(steps))


def strongest_role(steps: Any) -> str:
    """The policy's ``approver_role``: its strongest role step's. Team steps name no role; a policy
    of team steps only keeps ``approver``, the weakest (the deciders' rights still come from their
    roles: only those who may approve at all decide a team step)."""
    roles = [s.role for s in steps if s.role]
    return max(roles, key=STEP_ROLES.index) if roles else APPROVER


def _is_step_word(w: str) -> bool:
    found = _STEP.match(w)
    return bool(found and (found["count"] or found["team"] or found["role"] in STEP_ROLES))


def _parse_step(stage: int, seg: list[str]) -> StepSpec:
    found = _STEP.match(seg[0])
    if found is None or not (found["team"] or found["role"] in STEP_ROLES):
        raise ConditionError(
            f"step {seg[0]!r} must look like [N*]ROLE or [N*]team:TEAM, ROLE one of "
            f"{list(STEP_ROLES)}"
        )
    count = int(found["count"] or 1)
    if not 1 <= count <= MAX_STEP_COUNT:
        raise ConditionError(f"step {seg[0]!r}: N must be between 1 and {MAX_STEP_COUNT}")
    rest, within_s, condition = seg[1:], None, ""
    if rest and rest[0] == "within":
        duration = _DURATION.match(rest[1]) if len(rest) > 1 else None
        if duration is None:
            raise ConditionError(f"step {seg[0]!r}: 'within' needs a duration such as 30m or 2h")
        within_s = int(duration["n"]) * _UNIT_S[duration["unit"]]
        if not 0 < within_s <= 31 * 86400:
            raise ConditionError(f"step {seg[0]!r}: within must be between 1 s and 31 days")
        rest = rest[2:]
    escalate_after_s, escalate_to = None, ""
    if rest and rest[0] == "escalate":
        # escalate after DURATION to NAME
        duration = _DURATION.match(rest[2]) if len(rest) > 2 and rest[1] == "after" else None
        if duration is None or len(rest) < 5 or rest[3] != "to":
            raise ConditionError(
                f"step {seg[0]!r}: spell it 'escalate after 15m to oncall' (a duration, a channel "
                "role or on-call group)"
            )
        escalate_after_s = int(duration["n"]) * _UNIT_S[duration["unit"]]
        if not 0 < escalate_after_s <= 31 * 86400:
            raise ConditionError(f"step {seg[0]!r}: escalate after must be between 1 s and 31 days")
        escalate_to = rest[4]
        # a channel role or on-call group, or ``team:payments`` (the channels of a team's people)
        if not re.fullmatch(r"(?:team:)?[A-Za-z0-9_.-]{1,100}", escalate_to):
            raise ConditionError(f"step {seg[0]!r}: escalate to {escalate_to!r} is not a name")
        rest = rest[5:]
    if rest and rest[0] == "if":
        condition = " ".join(rest[1:])
        parsed = parse_condition(condition)
        if parsed is None:
            raise ConditionError(f"step {seg[0]!r}: 'if' needs a condition such as amount>10000")
        if parsed.window_s is not None:
            raise ConditionError(f"step {seg[0]!r}: a step's condition cannot be a windowed sum")
        rest = []
    if rest:
        raise ConditionError(
            f"step {seg[0]!r}: unexpected {' '.join(rest)!r} (expected 'within DURATION', "
            "'escalate after DURATION to NAME' or 'if CONDITION')"
        )
    return StepSpec(
        stage,
        found["role"] or "",
        count,
        within_s,
        condition,
        escalate_after_s,
        escalate_to,
        found["team"] or "",
    )


def parse_steps_json(raw: Any) -> tuple[StepSpec, ...]:
    """The JSON API shape: ``[{"role": "approver", "count": 2, "stage": 0, "within_s": 3600,
    "condition": "amount>10000"}]``; a step names a ``role`` or a ``team`` (``{"team": "payments",
    "count": 2}``), never both."""
    if not isinstance(raw, list) or not raw:
        raise ConditionError("steps must be a non-empty list of {role, count, stage, ...}")
    steps = []
    for i, item in enumerate(raw):
        if not isinstance(item, dict):
            raise ConditionError(f"steps[{i}] must be an object")
        team, role = item.get("team"), item.get("role")
        if team not in (None, "") and role not in (None, ""):
            raise ConditionError(
                f"steps[{i}]: a step names a role or a team, not both (role {role!r}, team {team!r})",
                field=f"steps[{i}].team",
            )
        if team not in (None, ""):
            if not isinstance(team, str) or not re.fullmatch(_TEAM, team):
                raise ConditionError(
                    f"steps[{i}].team must be a team's name (letters, digits, _ or -)",
                    field=f"steps[{i}].team",
                )
            words = [f"{item.get('count', 1)}*team:{team}"]
        else:
            words = [f"{item.get('count', 1)}*{role}"]
        if item.get("within_s"):
            words += ["within", f"{item['within_s']}s"]
        if item.get("escalate_after_s") or item.get("escalate_to"):
            words += ["escalate", "after", f"{item.get('escalate_after_s')}s", "to"]
            words += [str(item.get("escalate_to") or "")]
        if item.get("condition"):
            words += ["if", str(item["condition"])]
        try:
            stage = int(item.get("stage", 0))
        except (TypeError, ValueError):
            raise ConditionError(f"steps[{i}].stage must be an integer") from None
        try:
            steps.append(_parse_step(stage, words))
        except ConditionError as err:
            raise ConditionError(f"steps[{i}]: {err}") from None
    stages = sorted({s.stage for s in steps})
    if stages != list(range(len(stages))):
        raise ConditionError("steps[].stage must number the stages 0, 1, 2 … without gaps")
    return tuple(sorted(steps, key=lambda s: s.stage))
