"""Finding runs: the one definition of "a filtered set of runs".

``RunFilter.from_query(params)`` reads a query string (console list, API, a fleet operation's
selection), validating every parameter (``BadFilter`` names the one that is wrong);
``RunFilter.queryset(actor)`` is the runs of that filter the actor may see; ``to_query()`` writes it
back, so a view can be shared as a URL. ``page_runs`` pages it by keyset (a cursor on the sort key
and the id): every page costs the same queries whatever its depth.

Parameters: ``q`` (search box: an id prefix, else goal text or agent name), ``id`` (id or prefix),
``agent`` (repeatable), ``touched`` (``tool`` or ``tool:action`` of an effect, repeatable), ``owner``
(assignee or decision authority; ``me``), ``state`` (repeatable or comma-separated), ``attention``
(1: the "needs attention" view), ``since`` / ``until`` (created) and ``updated_since`` /
``updated_until`` (``2h``, ``7d`` or ISO 8601), ``sort`` (``created``, ``updated``, ``state``,
``agent``; ``-`` for newest / descending first).
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from datetime import datetime, timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.db import connection
from django.db.models import Count, Exists, F, OuterRef, Q, QuerySet, Subquery, Sum
from django.db.models.fields.tuple_lookups import Tuple, TupleGreaterThan, TupleLessThan
from django.db.models.functions import Coalesce
from django.http import QueryDict
from django.utils import timezone

from core import pg
from core.actors import Actor
from core.filters import (
    BadFilter,
    check_text,
    decode_cursor,
    encode_cursor,
    looks_like_id_prefix,
    parse_id_prefix,
    parse_when,
    prefix_range,
)
from runs.models import Agent, Approval, Effect, Run, RunTally
from runs.selectors import visible_runs
from runs.states import State
from runs.team_scope import scoped, team_id_for, team_q

__all__ = [
    "BadFilter",
    "RunFilter",
    "RunPage",
    "StateCounts",
    "page_runs",
    "runs_by_prefix",
    "state_counts",
]

# The "needs attention" view: a run an operator must look at. States where the control plane handed
# the run to a person (or is recovering it); effects whose outcome nobody knows or that contradict a
# reconciliation; approvals waiting for a human; follow-up jobs past their due time (the sweep
# should have delivered them: something is stuck). A job that gave up moved its run to
# needs_attention (runs/states.py JOB_FAILED), which the states cover.
ATTENTION_STATES = (
    State.ORPHANED,
    State.RECOVERING,
    State.NEEDS_ATTENTION,
    State.COMPENSATION_FAILED,
)
LOOK_AT_EFFECTS = (Effect.UNKNOWN, Effect.DISCREPANCY)
# interventions.models_jobs.Job.OPEN (runs sits below interventions and may not import it)
OPEN_JOB_STATUSES = ("pending", "running")
STUCK_JOB_GRACE = timedelta(minutes=1)

# sort name -> the run fields of its key; the id always ends it, so the order is total.
SORTS: dict[str, tuple[str, ...]] = {
    "created": ("created_at",),
    "updated": ("updated_at",),
    "state": ("state", "created_at"),
    # Grouped by agent, in the order agents were registered: the index (agent, created_at, id)
    # serves it at any depth; ordering by the agent's name would sort every filtered run per page.
    "agent": ("agent_id", "created_at"),
}
DEFAULT_SORT = "-created"
TIME_PARAMS = {
    "since": ("created_at", "gte"),
    "until": ("created_at", "lte"),
    "updated_since": ("updated_at", "gte"),
    "updated_until": ("updated_at", "lte"),
}
MAX_VALUES = 20  # repeatable parameters: at most this many values each


@dataclass(frozen=True)
class RunFilter:
    q: str = ""
    id: str = ""  # hex digits of an id or of its prefix
    agents: tuple[str, ...] = ()
    touched: tuple[tuple[str, str], ...] = ()  # (tool, action); action "" or "*" = any
    owner: str = ""
    team: str = ""  # a team's slug (docs/operator/teams.md): the console's team switcher
    states: tuple[str, ...] = ()
    attention: bool = False
    recovered: bool = False  # runs that went through a recovery (orphaned, then recovered)
    since: str = ""  # kept as written ("2h" stays relative in a shared URL)
    until: str = ""
    updated_since: str = ""
    updated_until: str = ""
    sort: str = DEFAULT_SORT
    now: datetime | None = field(default=None, compare=False)  # what "2h" counts back from
    # Names looked up once per filter (its page, counts and chips each build a queryset): the
    # agent a search names, the owner's user ids.
    _ids: dict[tuple[str, str], list[int]] = field(default_factory=dict, compare=False, repr=False)

    # --- reading and writing a query string --------------------------------------------------------

    @classmethod
    def from_query(cls, params: QueryDict | dict[str, Any]) -> RunFilter:
        get = _getter(params)
        q = check_text("q", get.one("q"), max_len=200)
        raw_id = get.one("id")
        states = tuple(
            dict.fromkeys(
                _state(s.strip()) for v in get.many("state") for s in v.split(",") if s.strip()
            )
        )
        touched = tuple(dict.fromkeys(_touched(v) for v in get.many("touched") if v.strip()))
        agents = tuple(
            dict.fromkeys(
                check_text("agent", a, max_len=100) for a in get.many("agent") if a.strip()
            )
        )
        times = {}
        for name in TIME_PARAMS:
            raw = check_text(name, get.one(name), max_len=40)
            if raw:
                parse_when(name, raw)  # validated now; read again (relative to now) by queryset()
            times[name] = raw
        sort = get.one("sort").strip() or DEFAULT_SORT
        if sort.lstrip("-") not in SORTS:
            raise BadFilter("sort", f"one of {', '.join(SORTS)} (prefix - for descending)")
        attention = _flag(get, "attention")
        recovered = _flag(get, "recovered")
        return cls(
            q=q,
            id=parse_id_prefix("id", raw_id) if raw_id.strip() else "",
            agents=agents,
            touched=touched,
            owner=check_text("owner", get.one("owner"), max_len=150),
            team=check_text("team", get.one("team"), max_len=50),
            states=states,
            attention=attention,
            recovered=recovered,
            sort=sort,
            since=times["since"],
            until=times["until"],
            updated_since=times["updated_since"],
            updated_until=times["updated_until"],
        )

    def to_query(self, **extra: str) -> str:
        """The filter as a canonical query string (empty values left out)."""
        query = QueryDict(mutable=True)
        for key, values in self.params().items():
            query.setlist(key, values)
        for key, one in extra.items():
            if one:
                query[key] = one
        return query.urlencode()

    def params(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {
            "q": [self.q],
            "id": [self.id],
            "agent": list(self.agents),
            "touched": [f"{t}:{a}" if a else t for t, a in self.touched],
            "owner": [self.owner],
            "team": [self.team],
            "state": list(self.states),
            "attention": ["1" if self.attention else ""],
            "recovered": ["1" if self.recovered else ""],
            **{name: [getattr(self, name)] for name in TIME_PARAMS},
            "sort": [self.sort if self.sort != DEFAULT_SORT else ""],
        }
        return {k: [v for v in vs if v] for k, vs in out.items() if any(vs)}

    @property
    def is_empty(self) -> bool:
        return not self.params()

    def replace(self, **changes: Any) -> RunFilter:
        values = {f.name: getattr(self, f.name) for f in fields(self)} | changes
        return RunFilter(**values)

    # --- the runs ------------------------------------------------------------------------------------

    def queryset(
        self,
        actor: Actor,
        *,
        with_states: bool = True,
        counting: bool = False,
        within: QuerySet | None = None,
    ) -> QuerySet[Run]:
        """The visible runs this filter selects (unordered). ``with_states=False`` leaves the state
        chips out (for counting runs per state under the rest of the filter). ``counting``: the
        same runs in the shape for counting them all, where no sort index stops the walk early: the
        effects touched and "needs attention" as sets of run ids read from their indexes, instead
        of a test per run. ``within``: a (small) set of run ids the caller also filters by; the
        effects touched are then read for those runs only (the "needs attention" chip count)."""
        qs = visible_runs(actor)
        now = self.now or timezone.now()
        if self.q:
            qs = qs.filter(_search_q(self.q, qs, self._agent_ids))
        if self.id:
            low, high = prefix_range(self.id)
            qs = qs.filter(pk__gte=low, pk__lte=high)
        if self.agents:
            # By ids looked up first: a condition on the run's own column (the agent keyset index,
            # or a filter while another index is walked), not a join to the agents that PostgreSQL
            # applies only after reading every other agent's runs too.
            qs = qs.filter(agent_id__in=self._agents_named(self.agents))
        for tool, action in self.touched:
            effects = Effect.objects.filter(tool=tool)
            if action and action != "*":
                effects = effects.filter(action=action)
            if within is not None:  # probes of the (tool, action, run) index, one per run
                qs = qs.filter(pk__in=effects.filter(run_id__in=within).values("run_id"))
            elif counting:  # the (tool, action, run) index read once, in run order
                qs = qs.filter(pk__in=effects.values("run_id").distinct())
            else:  # tested per run while the sort index is walked, stopping at the page's end
                qs = qs.filter(Exists(effects.filter(run=OuterRef("pk"))))
        if self.owner:
            name = actor.name if self.owner == "me" and actor.kind == "user" else self.owner
            # By user ids looked up first, so both halves of the OR are conditions on the run's
            # two foreign-key indexes (a bitmap OR); a subquery there makes PostgreSQL test every
            # run against a hashed set instead.
            users = self._user_ids(name)
            qs = qs.filter(Q(assignee_id__in=users) | Q(decision_authority_id__in=users))
        if self.team:
            try:
                qs = qs.filter(team_q(frozenset({team_id_for(self.team) or 0})))
            except LookupError:
                qs = qs.none()  # no such team: no runs (as for an agent nobody registered)
        if with_states and self.states:
            qs = qs.filter(state__in=self.states)
        if self.attention:
            qs = qs.filter(pk__in=attention_ids(now)) if counting else qs.filter(attention_q(now))
        if self.recovered:
            # A recovery is a job of its own (interventions/recover.py): its rows name the run.
            qs = qs.filter(pk__in=Run.objects.filter(jobs__kind="recovery").values("pk"))
        for name, (column, op) in TIME_PARAMS.items():
            raw = getattr(self, name)
            if raw:
                qs = qs.filter(**{f"{column}__{op}": parse_when(name, raw, now=now)})
        return qs

    def _agent_ids(self, name: str) -> list[int]:
        key = ("agent", name)
        if key not in self._ids:
            self._ids[key] = list(Agent.objects.filter(name=name).values_list("pk", flat=True))
        return self._ids[key]

    def _agents_named(self, names: tuple[str, ...]) -> list[int]:
        key = ("agents", ",".join(names))
        if key not in self._ids:
            found = Agent.objects.filter(name__in=names).values_list("pk", flat=True)
            self._ids[key] = sorted(found)
        return self._ids[key]

    def _user_ids(self, username: str) -> list[int]:
        key = ("user", username)
        if key not in self._ids:
            users = get_user_model().objects.filter(username=username)
            self._ids[key] = list(users.values_list("pk", flat=True))
        return self._ids[key]

    @property
    def sort_key(self) -> tuple[str, ...]:
        return (*SORTS[self.sort.lstrip("-")], "id")

    @property
    def descending(self) -> bool:
        return self.sort.startswith("-")


def attention_q(now: datetime) -> Q:
    """Runs an operator must look at (see ATTENTION_STATES above), as a filter: each part is an
    uncorrelated set of run ids read through a small (partial) index, which PostgreSQL hashes once
    and checks while it walks the sort index, stopping at the page's last row."""
    stuck_before = now - STUCK_JOB_GRACE
    return (
        Q(state__in=ATTENTION_STATES)
        | Q(pk__in=Effect.objects.filter(status__in=LOOK_AT_EFFECTS).values("run_id"))
        | Q(pk__in=Approval.objects.filter(status=Approval.PENDING).values("run_id"))
        | Q(
            pk__in=Run.objects.filter(
                jobs__status__in=OPEN_JOB_STATUSES, jobs__due_at__lt=stuck_before
            ).values("pk")
        )
    )


def attention_ids(now: datetime) -> QuerySet:
    """The same runs as one union of those index reads: for counting them, where no sort index
    can stop early (``attention_q`` would test every run)."""
    return Run.objects.filter(state__in=ATTENTION_STATES).values("pk").union(_trouble_ids(now))


def _trouble_ids(now: datetime) -> QuerySet:
    """The runs needing attention for what they hold, whatever their state: effects, approvals,
    stuck jobs (small sets, each read through its own partial index)."""
    stuck_before = now - STUCK_JOB_GRACE
    return (
        Effect.objects.filter(status__in=LOOK_AT_EFFECTS)
        .values("run_id")
        .union(
            Approval.objects.filter(status=Approval.PENDING).values("run_id"),
            Run.objects.filter(
                jobs__status__in=OPEN_JOB_STATUSES, jobs__due_at__lt=stuck_before
            ).values("pk"),
        )
    )


def _search_q(text: str, runs: QuerySet[Run], agent_ids: Callable[[str], list[int]]) -> Q:
    """The search box. 4+ hex digits are read as an id prefix (ids are what operators paste); when no
    visible run has such an id, as text like any other search: the goal's words or an agent's name."""
    if looks_like_id_prefix(text):
        low, high = prefix_range(text.strip().lower().replace("-", ""))
        by_id = Q(pk__gte=low, pk__lte=high)
        if runs.filter(by_id).exists():
            return by_id
    # The goal's text through the trigram index on UPPER(goal) (migration 0013: pg_trgm), which is
    # what ``icontains`` compares. The agent is looked up first and matched by id: an OR across a
    # join (or a subquery) is no index condition, and PostgreSQL would then test every run's goal.
    by_goal = Q(goal__icontains=text)
    agents = agent_ids(text.strip())
    return by_goal | Q(agent_id__in=agents) if agents else by_goal


def _flag(get: _getter, name: str) -> bool:
    raw = get.one(name).strip().lower()
    if raw not in ("", "0", "1", "true", "false", "yes", "no", "on", "off"):
        raise BadFilter(name, "1 or 0")
    return raw in ("1", "true", "yes", "on")


def _state(value: str) -> str:
    if value not in State._value2member_map_:
        raise BadFilter("state", f"{value[:40]!r} is not a run state")
    return value


def _touched(raw: str) -> tuple[str, str]:
    text = check_text("touched", raw, max_len=201)
    tool, _, action = text.partition(":")
    if not tool or len(tool) > 100 or len(action) > 100:
        raise BadFilter("touched", "tool or tool:action, e.g. payments:charge")
    return tool, action


class _getter:
    """One or many values of a parameter, from a QueryDict or a plain dict (fleet operations)."""

    def __init__(self, params: QueryDict | dict[str, Any]):
        self.params = params

    def many(self, name: str) -> list[str]:
        values: list[Any]
        if isinstance(self.params, QueryDict):
            values = self.params.getlist(name)
        else:
            raw = self.params.get(name)
            values = (
                [] if raw in (None, "") else list(raw) if isinstance(raw, (list, tuple)) else [raw]
            )
        if len(values) > MAX_VALUES:
            raise BadFilter(name, f"at most {MAX_VALUES} values")
        for value in values:
            if not isinstance(value, str):
                raise BadFilter(name, "must be text")
        return values

    def one(self, name: str) -> str:
        values = self.many(name)
        if len(values) > 1:
            raise BadFilter(name, "give it once")
        return values[0] if values else ""


# --- pages ---------------------------------------------------------------------------------------


@dataclass
class RunPage:
    runs: list[Run]
    next_cursor: str | None  # the page after this one (older, in the default order)
    prev_cursor: str | None  # the page before it (None on the first page)


def page_runs(
    actor: Actor, flt: RunFilter, *, after: str = "", before: str = "", limit: int = 50
) -> RunPage:
    """One page of the filter, by keyset: ``after`` / ``before`` are cursors from an earlier page.
    Each run carries ``n_unresolved`` (its unresolved effects), counted for the page's rows only."""
    key = flt.sort_key
    backwards = bool(before)
    param, raw_cursor = ("before", before) if backwards else ("after", after)
    values = None
    if raw_cursor:
        cursor = decode_cursor(param, raw_cursor, size=len(key))
        values = [_cursor_value(name, raw, param) for name, raw in zip(key, cursor, strict=True)]
    descending = flt.descending != backwards  # walking back = the other way, then flipped
    qs = flt.queryset(actor)
    if values is not None:
        qs = qs.filter(_after_q(key, values, descending))
    order = [f"-{k}" if descending else k for k in key]
    # The list never shows a run's input, versions or retry policy: leave the JSON in the table.
    qs = qs.defer("input", "versions", "retry_policy")
    rows = list(with_unresolved(qs).order_by(*order)[: limit + 1])
    more = len(rows) > limit
    rows = rows[:limit]
    if backwards:
        rows.reverse()
    first, last = (rows[0], rows[-1]) if rows else (None, None)
    has_next = more if not backwards else True
    has_prev = (more if backwards else bool(after)) and first is not None
    return RunPage(
        runs=rows,
        next_cursor=encode_cursor(_key_of(last, key)) if has_next and last else None,
        prev_cursor=encode_cursor(_key_of(first, key)) if has_prev and first else None,
    )


def with_unresolved(qs: QuerySet[Run]) -> QuerySet[Run]:
    """Each run's count of unresolved effects, as a per-row subquery: PostgreSQL evaluates it for
    the rows a LIMIT keeps, not for the whole filtered set (a JOIN + GROUP BY would count them all)."""
    counts = (
        Effect.objects.filter(Effect.unresolved_q(), run=OuterRef("pk"))
        .order_by()
        .values("run")
        .annotate(n=Count("*"))
        .values("n")
    )
    return qs.annotate(n_unresolved=Coalesce(Subquery(counts), 0))


def _after_q(key: tuple[str, ...], values: list[Any], descending: bool) -> Q:
    """Rows strictly past ``values`` in the order of ``key``: the row comparison
    ``(a, b, id) < (va, vb, vid)``, which PostgreSQL reads as one range of the keyset index
    (``run_agent_keyset`` for (agent, created_at, id)) and starts at the cursor. Written out as
    ``a < va OR (a = va AND b < vb) …`` only the leading column bounded the index scan: the
    agent sort's deep page read the 100,000 runs of the cursor's agent before it at 1,000,000 runs
    (115 ms; bench/console.py). Django's tuple lookups (its composite primary keys' own) write it."""
    lookup = TupleLessThan if descending else TupleGreaterThan
    return Q(lookup(Tuple(*(F(k) for k in key)), tuple(values)))


def _key_of(run: Run, key: tuple[str, ...]) -> list[Any]:
    out: list[Any] = []
    for name in key:
        value: Any = getattr(run, name)
        out.append(value.isoformat() if isinstance(value, datetime) else str(value))
    return out


def _cursor_value(name: str, raw: Any, param: str) -> Any:
    if not isinstance(raw, str):
        raise BadFilter(param, "not a cursor from this list")
    try:
        if name.endswith("_at"):
            return datetime.fromisoformat(raw)
        if name == "id":
            return uuid.UUID(raw)
        if name == "agent_id":
            return int(raw)
    except ValueError:
        raise BadFilter(param, "not a cursor from this list") from None
    return raw


# --- counts and prefixes --------------------------------------------------------------------------


# A filter the tally cannot answer counts at most this many runs. At 1,000,000 runs an exact
# GROUP BY over a filtered set reads every matching run's row (an owner's 50,000 runs: 200 ms, most
# of it heap reads); the first COUNT_CAP matches cost a few ms at any size (bench/console.py).
COUNT_CAP = 2_000


@dataclass
class StateCounts:
    by_state: dict[str, int]
    complete: bool  # False: counted over the first COUNT_CAP matching runs only (lower bounds)

    @property
    def total(self) -> int:
        return sum(self.by_state.values())


def state_counts(actor: Actor, flt: RunFilter) -> StateCounts:
    """Runs per state under the filter without its state chips (what each chip would show).

    With no filter but agents (the list as it opens), the sum of RunTally, which the database
    keeps per agent and state as runs change (PostgreSQL): exact at any size. Any other filter
    counts the states of its first COUNT_CAP matches: exact below that, lower bounds above it
    (``complete`` False; the list says "2000+"), so no list render reads more than COUNT_CAP runs
    to count them."""
    if pg.enabled(connection) and flt.replace(agents=(), states=(), sort="").is_empty:
        return StateCounts(_tally(actor, flt.agents), complete=True)
    if flt.attention and not flt.touched:
        # The runs in an attention state and the few in others that hold trouble, as two reads
        # (attention_count's), not one hashed set of every run in trouble tested against the runs.
        parts = _attention_parts(actor, flt.replace(states=()), flt.now or timezone.now())
        states = _first_of_both([qs.values_list("state", flat=True) for qs in parts], COUNT_CAP)
    else:
        qs = flt.queryset(actor, with_states=False, counting=True).select_related(None).order_by()
        # One read of at most COUNT_CAP rows, their states counted here (a GROUP BY over them
        # would join them back to every run).
        states = list(qs.values_list("state", flat=True)[:COUNT_CAP])
    counts = dict(Counter(states))
    return StateCounts(counts, complete=len(states) < COUNT_CAP)


def _tally(actor: Actor, agents: tuple[str, ...]) -> dict[str, int]:
    """Runs per state from RunTally: a sum over a few rows per agent and state (plus the changes
    since its last compaction), whatever the number of runs. The agents are the filter's, within
    what the actor sees (a worker token sees its own agents' runs only)."""
    names: set[str] | None = set(agents) if agents else None
    if actor.is_worker and actor.agents:
        names = set(actor.agents) if names is None else names & set(actor.agents)
    rows = RunTally.objects.all()
    if names is not None:
        rows = rows.filter(agent_id__in=Agent.objects.filter(name__in=names).values("pk"))
    if actor.team_scoped:
        # By the agents of the actor's teams: the tally is per agent. Approximate where a run's
        # team is not its agent's now (a child under another team's parent; an agent moved since):
        # docs/operator/teams.md. The list itself filters by the run's own team.
        rows = rows.filter(agent_id__in=scoped(Agent.objects.all(), actor).values("pk"))
    sums = rows.order_by().values_list("state").annotate(n=Sum("n"))
    return {state: n for state, n in sums if n}


def runs_by_prefix(actor: Actor, prefix: str, *, limit: int = 20) -> list[Run]:
    """The visible runs whose id starts with ``prefix`` (at least 4 hex digits), up to ``limit``."""
    digits = parse_id_prefix("id", prefix, min_len=4)
    low, high = prefix_range(digits)
    return list(visible_runs(actor).filter(pk__gte=low, pk__lte=high).order_by("pk")[:limit])


def attention_count(actor: Actor, flt: RunFilter, now: datetime, cap: int) -> int:
    """How many of the runs ``flt`` matches (ignoring its state chips) need attention, counted up
    to ``cap`` + 1: the chip says "cap+" past that, and the count stays cheap at any depth.

    Two reads in one statement, each stopping at cap + 1: the runs in an attention state (the
    state keyset index, the rest of the filter checked per row) and the few runs in other states
    that hold trouble (effects, approvals, stuck jobs: small partial indexes). One set of every
    run in trouble, hashed and joined, cost 20-50 ms a render at 1,000,000 runs just to build."""
    parts = _attention_parts(actor, flt.replace(states=()), now)
    return len(_first_of_both([qs.values_list("pk", flat=True) for qs in parts], cap + 1))


def _first_of_both(parts: list[QuerySet], cap: int) -> list[Any]:
    """The first ``cap`` rows of two disjoint reads, each stopping at ``cap``: one UNION ALL
    statement on PostgreSQL; two reads where a LIMIT inside a UNION is not allowed (SQLite, the
    embedded demo)."""
    first = [qs[:cap] for qs in parts]
    if connection.features.supports_slicing_ordering_in_compound:
        return list(first[0].union(first[1], all=True).order_by()[:cap])
    return (list(first[0]) + list(first[1]))[:cap]


def _attention_parts(actor: Actor, flt: RunFilter, now: datetime) -> tuple[QuerySet, QuerySet]:
    """The runs of ``flt`` needing attention (whatever its ``attention``), in two disjoint sets:
    those in an attention state, and those in other states holding trouble."""
    rest = flt.replace(attention=False)
    trouble = _trouble_ids(now)
    in_states = rest.queryset(actor).filter(state__in=ATTENTION_STATES)
    holding = rest.queryset(actor, within=trouble).filter(pk__in=trouble)
    holding = holding.exclude(state__in=ATTENTION_STATES)
    return in_states.select_related(None).order_by(), holding.select_related(None).order_by()


def matching_rows(actor: Actor, flt: RunFilter, ids: list[str]) -> list[Run]:
    """Those of ``ids`` that ``flt`` matches, as list rows (a live list patches them in place)."""
    return list(
        with_unresolved(flt.queryset(actor).filter(pk__in=ids)).defer(
            "input", "versions", "retry_policy"
        )
    )
