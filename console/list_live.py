"""The live run list: one render per process for every open list page showing the same view.

A list socket does not join the "runs" group itself: it subscribes to its process's ``ListHub``, which
joins the group once, collects the hints for ``coalesce_s`` (a burst is one push) and, per distinct
view — the page's filter, sort and cursor (its query string) and its user's roles — reads one
``ListUpdate`` from the database: the rows of the runs the hints name that still match the filter,
their sort keys, the named runs that no longer do, and, when runs were created or changed
state (at most every ``counts_every_s``), the per-state counts as an out-of-band fragment. Each
socket then takes from that update what its own page needs, with string work only (``ListPage``):

- a row it shows, whose place in the sort did not change, is redrawn in place;
- a row whose run left the filter is deleted; a run that joined it (new, or moved into a state
  chip), or whose sort key changed (sorted by last change, by state), is put where the sort puts it
  among the page's rows (``beforebegin`` the next row, or appended to a page that has no next) —
  unless that place is on another page: then it is left there, and a run new to a deeper page's
  view is announced as "N new runs — show the newest".

So ten pages showing the same view cost one render per window, not ten. Whole-page renders remain
for a (re)connect and the periodic resync (shared for ``full_ttl_s`` by sockets of one view that
connect together), and a page patched past twice its size is redrawn whole.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from django.core.exceptions import BadRequest
from django.http import QueryDict
from django.template.loader import render_to_string
from django.utils import timezone
from django.utils.html import format_html

from console.common import off_view_thread
from core.auth import actor_for_user
from core.filters import BadFilter
from core.live import RUNS_GROUP, hints, note_facts
from runs.search import RunFilter, matching_rows

log = logging.getLogger(__name__)

# Facts that change which runs a state or attention filter selects, and the counts per state.
JOIN_KINDS = frozenset({"run_created", "state_changed"})
ROW_KEEPS = 2  # a page patched past ROW_KEEPS x its size is redrawn whole


@dataclass(frozen=True)
class View:
    """What a list socket shows, from its URL's query string; None for a bad one (the page itself
    answered a 400)."""

    query: str
    flt: RunFilter
    after: str
    before: str

    @classmethod
    def parse(cls, query: str) -> View | None:
        from console.run_list import _filter_or_400

        try:
            flt, after, before = _filter_or_400(QueryDict(query))
        except BadRequest:
            return None
        return cls(query=query, flt=flt, after=after, before=before)

    @property
    def first_page(self) -> bool:
        return not (self.after or self.before)


def view_key(
    view: View, user: Any, roles: frozenset[str], teams: frozenset[int] = frozenset()
) -> tuple:
    """Sockets with equal keys see the same thing: same query, same roles, same teams (another
    team's runs do not exist for them: docs/operator/teams.md) and — where the filter names the
    user ("owner=me") — the same user."""
    who = user.pk if view.flt.owner == "me" else None
    return (view.query, tuple(sorted(roles)), tuple(sorted(teams)), who)


@dataclass
class ListUpdate:
    rows: dict[str, str]  # run id -> its row (no swap attribute), for named runs that match
    keys: dict[str, tuple]  # run id -> its sort key (sort_key_of)
    order: list[str]  # those ids, in the view's order
    gone: set[str]  # named runs that no longer match the filter
    joined: set[str]  # matching runs that may be new to the view (created, or moved into it)
    counts: str  # the run-counts fragment (out of band), or ""


def _named(pending: dict[str, Any]) -> dict[str, Any]:
    """The hints' run ids, spelled as the rows spell them (a hint may carry any UUID spelling)."""
    named: dict[str, Any] = {}
    for run_id, facts in pending.items():
        try:
            named[str(uuid.UUID(run_id))] = facts
        except ValueError:
            continue
    return named


def list_update(user, view: View, pending: dict[str, Any], with_counts: bool) -> ListUpdate:
    """One read for every socket of a view: the named runs that match (one query) and the counts."""
    from console.run_list import counts_context, run_rows

    actor = actor_for_user(user, None, component="console")
    flt = view.flt
    kinds = _named(pending)
    ids = list(kinds)
    runs = matching_rows(actor, flt, ids) if ids else []
    now = timezone.now()
    rows: dict[str, str] = {}
    keys: dict[str, tuple] = {}
    runs = list(runs)
    for run, row in zip(runs, run_rows(runs, flt, now), strict=True):
        rows[row["id"]] = render_to_string("console/run_list.html#run-row", {"r": row}).strip()
        keys[row["id"]] = sort_key_of(run, flt)
    created = {r for r in rows if kinds[r] is None or "run_created" in kinds[r]}
    moved_in = flt.states or flt.attention
    joined = {
        r
        for r in rows
        if r in created or (moved_in and (kinds[r] is None or JOIN_KINDS & kinds[r].keys()))
    }
    counts = ""
    if with_counts:
        try:
            counts = render_to_string(
                "console/run_list.html#run-counts",
                counts_context(actor, flt) | {"counts_oob": True},
            )
        except BadFilter:
            counts = ""
    return ListUpdate(
        rows=rows,
        keys=keys,
        order=sorted(rows, key=lambda r: keys[r], reverse=flt.descending),
        gone=set(ids) - rows.keys(),
        joined=joined,
        counts=counts,
    )


def counts_due(pending: dict[str, Any]) -> bool:
    """Whether these facts may change the per-state counts (a run created, a state changed)."""
    return any(
        facts is None or JOIN_KINDS & facts.keys() or any(k.startswith("approval_") for k in facts)
        for facts in pending.values()
    )


def _oob(row: str, run_id: str) -> str:
    return row.replace(
        f'<tr id="run-row-{run_id}"', f'<tr id="run-row-{run_id}" hx-swap-oob="true"', 1
    )


@dataclass
class ListPage:
    """What one socket's page shows now: its rows in order with their sort keys (from its last
    whole render, then patched) and the runs announced as new. Patching is string work on a shared
    ListUpdate."""

    view: View
    shown: list[str]
    keys: dict[str, tuple]
    limit: int
    more: bool  # a page follows this one: rows past the last one belong there
    joined: set[str] = field(default_factory=set)

    def _place(self, rows: list[str], key: tuple) -> int | None:
        """Where a row with ``key`` goes among ``rows`` in the page's order; None: on another page."""
        desc = self.view.flt.descending
        at = next(
            (i for i, r in enumerate(rows) if (key > self.keys[r] if desc else key < self.keys[r])),
            len(rows),
        )
        if at == 0 and rows and not self.view.first_page:
            return None  # before this page's first row: an earlier page's
        if at == len(rows) and self.more:
            return None  # past its last row: a later page's
        return at

    def frames(self, up: ListUpdate) -> list[str] | None:
        """The frames that bring this page up to date; None: redraw it whole instead."""
        rows = [r for r in self.shown if r not in up.gone]
        delete = [r for r in self.shown if r in up.gone]
        replace, placed = [], set()
        for run_id in up.order:
            key = up.keys[run_id]
            if run_id in rows and self.keys.get(run_id) == key:
                replace.append(run_id)  # same place: redrawn where it is
                continue
            if run_id in rows:  # its place changed (sorted by last change, by state)
                rows.remove(run_id)
                delete.append(run_id)
            at = self._place(rows, key)
            if at is None:
                if run_id in up.joined and not self.view.first_page:
                    self.joined.add(run_id)
                continue
            rows.insert(at, run_id)
            self.keys[run_id] = key
            placed.add(run_id)
        self.shown, self.keys = rows, {r: self.keys[r] for r in rows}
        if len(rows) > ROW_KEEPS * self.limit:
            return None
        frames = []
        patch = "".join(f'<tr id="run-row-{r}" hx-swap-oob="delete"></tr>' for r in delete)
        patch += "".join(_oob(up.rows[r], r) for r in replace)
        if placed:
            patch += '<tr id="run-rows-empty" hx-swap-oob="delete"></tr>'
        if patch:  # rows travel in frames that start with a table element (or a parser drops them)
            frames.append(patch)
        if placed:  # last first, so that each insert's anchor is already there
            inserts = []
            for i in range(len(rows) - 1, -1, -1):
                if rows[i] in placed:
                    where = (
                        f"beforebegin:#run-row-{rows[i + 1]}"
                        if i + 1 < len(rows)
                        else ("beforeend:#run-rows")
                    )
                    inserts.append(f'<tbody hx-swap-oob="{where}">{up.rows[rows[i]]}</tbody>')
            frames.append("".join(inserts))
        if up.counts:
            frames.append(up.counts)
        if self.joined & up.joined:
            frames.append(self.banner())
        return frames

    def banner(self) -> str:
        n = len(self.joined)
        link = "?" + self.view.flt.to_query()
        return format_html(
            '<p id="run-new" class="live" hx-swap-oob="true"><strong>{} new run{} in this view'
            '</strong> — <a href="{}" hx-get="{}" hx-target="#run-live" hx-swap="outerHTML"'
            ' hx-push-url="true">show the newest</a></p>',
            n,
            "" if n == 1 else "s",
            link,
            link,
        )


def sort_key_of(run: Any, flt: RunFilter) -> tuple:
    """A run's place in the filter's order (the keyset's columns, the id last)."""
    return tuple(getattr(run, name) for name in flt.sort_key)


# --- whole renders, shared briefly ----------------------------------------------------------------

_full_cache: dict[tuple, tuple[float, str, dict[str, Any]]] = {}
_full_lock = threading.Lock()


def full_render(user, view: View, key: tuple, ttl_s: float) -> tuple[str, ListPage | None]:
    """The whole table (out of band) and the page it shows; sockets of one view that ask within
    ``ttl_s`` of each other (a reconnect wave) share one render."""
    from console.run_list import list_context

    now = time.monotonic()
    with _full_lock:
        hit = _full_cache.get(key)
    if hit is None or now - hit[0] >= ttl_s:
        actor = actor_for_user(user, None, component="console")
        try:
            ctx = list_context(actor, view.flt, after=view.after, before=view.before)
        except BadFilter:
            return "", None
        table: str = render_to_string("console/run_list.html#run-table", ctx | {"oob": True})
        ids = [r["id"] for r in ctx["runs"]]
        page = {
            "keys": dict(zip(ids, ctx["row_keys"], strict=True)),
            "shown": ids,
            "limit": ctx["limit"],
            "more": ctx["next_query"] is not None,
        }
        hit = (now, table, page)
        with _full_lock:
            for stale in [k for k, v in _full_cache.items() if now - v[0] >= ttl_s]:
                del _full_cache[stale]
            _full_cache[key] = hit
    _, table, page = hit
    return table, ListPage(
        view, list(page["shown"]), dict(page["keys"]), page["limit"], page["more"]
    )


# --- the hub --------------------------------------------------------------------------------------


class ListHub:
    """One per event loop (process): the "runs" group's messages for every list socket."""

    coalesce_s = 0.5
    gather_s = 0.02
    counts_every_s = 1.0
    full_ttl_s = 1.0

    def __init__(self, layer: Any, loop: asyncio.AbstractEventLoop) -> None:
        self.layer, self.loop = layer, loop
        self.sockets: set[Any] = set()
        self.pending: dict[str, Any] = {}
        self.owed_counts: set[tuple] = set()
        self.counts_at: dict[tuple, float] = {}
        self.last_push = 0.0
        self.renders = 0  # list_update calls: what the sockets of this process cost (tests, bench)
        self.channel: str | None = None
        self._listen: asyncio.Task[None] | None = None
        self._flush: asyncio.Task[None] | None = None
        self._joining = asyncio.Lock()

    async def subscribe(self, consumer: Any) -> None:
        async with self._joining:  # two first sockets at once: one channel, one listener
            self.sockets.add(consumer)
            if self._listen is None or self._listen.done():
                self.channel = await self.layer.new_channel()
                await self.layer.group_add(RUNS_GROUP, self.channel)
                self._listen = asyncio.create_task(self.listen(self.channel))

    async def unsubscribe(self, consumer: Any) -> None:
        async with self._joining:
            self.sockets.discard(consumer)
            if self.sockets or self._listen is None:
                return
            task, channel, self._listen = self._listen, self.channel, None
            task.cancel()
            if channel:
                try:
                    await self.layer.group_discard(RUNS_GROUP, channel)
                except Exception:
                    log.debug("could not leave the runs group", exc_info=True)

    async def listen(self, channel: str) -> None:
        while True:
            try:
                message = await self.layer.receive(channel)
            except asyncio.CancelledError:
                raise
            except Exception:  # the layer is down: the sockets' periodic resync still runs
                log.warning("list hub could not receive; retrying", exc_info=True)
                await asyncio.sleep(1.0)
                continue
            noted = False
            for run_id, facts in hints(message):
                if run_id is not None:
                    note_facts(self.pending, str(run_id), facts)
                    noted = True
            if not noted:
                continue
            if self._flush is None or self._flush.done():
                self._flush = asyncio.create_task(self.flush())

    async def flush(self) -> None:
        """Leading edge after ``gather_s``, then at most one push per ``coalesce_s``."""
        loop = asyncio.get_running_loop()
        while self.pending or self.owed_counts:
            await asyncio.sleep(max(self.last_push + self.coalesce_s - loop.time(), self.gather_s))
            pending, self.pending = self.pending, {}
            try:
                await self.push(pending)
            except Exception:
                log.exception("list push failed")
            self.last_push = loop.time()

    async def push(self, pending: dict[str, Any]) -> None:
        views: dict[tuple, list[Any]] = {}
        for sock in list(self.sockets):
            if sock.page is not None and not sock.closed:
                views.setdefault(sock.view_key(), []).append(sock)
        now = time.monotonic()
        due = counts_due(pending)
        for key, socks in views.items():
            with_counts = False
            if due or key in self.owed_counts:
                if now - self.counts_at.get(key, 0.0) >= self.counts_every_s:
                    with_counts, self.counts_at[key] = True, now
                    self.owed_counts.discard(key)
                else:
                    self.owed_counts.add(key)
            if not pending and not with_counts:
                continue
            first = socks[0]
            update = await off_view_thread(list_update)(
                first.user, first.page.view, pending, with_counts
            )
            self.renders += 1
            for sock in socks:
                await sock.apply_list_update(update)
        self.owed_counts &= views.keys()


_hubs: dict[int, ListHub] = {}


def hub_for(layer: Any) -> ListHub:
    """This event loop's hub (each test's loop, each server process's one loop)."""
    loop = asyncio.get_running_loop()
    for stale in [k for k, h in _hubs.items() if h.loop.is_closed()]:
        del _hubs[stale]
    hub = _hubs.get(id(loop))
    if hub is None or hub.layer is not layer or hub.loop is not loop:
        hub = _hubs[id(loop)] = ListHub(layer, loop)
    return hub
