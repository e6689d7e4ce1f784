"""Live console over Channels. A consumer joins groups and forwards rendered partials; nothing more.

Pushes are hints: the channel layer delivers at most once, so nothing here carries state that the
database does not. core.live sends {"type": "run.changed", "run_id", "facts": [[kind, object_id], ...]}
to "runs" and "run.<id>" after every commit that wrote a fact about a run (facts None: too many to
name, redraw everything). A consumer collects the facts for ``coalesce_s`` (a burst, a cascade over a
tree, a busy run: one push) and sends only the fragments they changed, as htmx out-of-band swaps
(``hx-swap-oob``) that htmx-ext-ws applies: on the run page the header, the changed sections, each
changed effect row and the new timeline entries (console/run_page.py); on the run list the changed
rows and the counts, from one render per view shared by the process's list sockets
(console/list_live.py); on a fleet operation's page its progress. On every (re)connect the consumer
sends a full render at once, so a page that missed hints
while disconnected is current again; a slow periodic refresh covers hints lost on the way. Every
socket also hears the server's heartbeat (``live_beat``), so the page knows it is live.

A socket lives no longer than its login: the session and the user (active, password unchanged, still
allowed to view) are re-checked before every push and every WS_SESSION_CHECK_S seconds, and at once
when a logout or an admin change sends "session.check" to the user's group; a failed check closes the
socket with 4401 (or 4403 when only the role was lost). At most WS_MAX_PER_SESSION sockets per
session (console/socket_cap.py); one more is refused with 4429.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings

from console import socket_cap
from console.common import off_view_thread
from core.auth import teams_of
from core.live import (  # note_facts: imported from here by tests
    BEAT_GROUP,
    RUNS_GROUP,
    bind_loop,
    fleet_group,
    hints,
    note_facts,
    run_group,
    user_group,
)
from core.roles import may, roles_of

log = logging.getLogger(__name__)


# Close codes (4000-4999 are the application's): at connect the handshake is refused before accept
# (the client sees HTTP 403); later, a socket whose login ended is closed with 4401/4403.
UNAUTHENTICATED, FORBIDDEN, NOT_FOUND, TOO_MANY = 4401, 4403, 4404, 4429
BEAT_FRAME = "<!-- live -->"
TREE_LIMIT = 200  # groups joined for one run page: the run and its descendants


class LiveConsumer(AsyncWebsocketConsumer):
    coalesce_s = 0.15
    gather_s = 0.01  # a quiet page still waits this long: the rest of one commit's hints join it
    resync_s = 30.0
    _task: asyncio.Task[None] | None

    async def connect(self) -> None:
        self.closed, self.admitted = False, False
        user = self.scope.get("user")
        session = self.scope.get("session")
        self.session_key: str = getattr(session, "session_key", None) or ""
        if user is None or not user.is_authenticated or not self.session_key:
            await self.close(code=UNAUTHENTICATED)
            return
        self.roles: frozenset[str] = await database_sync_to_async(roles_of)(user)
        self.teams: frozenset[int] = await database_sync_to_async(teams_of)(user)
        if not may(self.roles, "view"):
            await self.close(code=FORBIDDEN)
            return
        self.user = user
        self.joined = await self.groups_to_join()
        if self.joined is None:
            await self.close(code=NOT_FOUND)
            return
        if not await self._admit():
            await self.close(code=TOO_MANY)
            return
        self.joined += [user_group(user.pk), BEAT_GROUP]
        bind_loop(asyncio.get_running_loop())  # an in-memory layer's hints are sent on this loop
        for group in self.joined:
            await self.channel_layer.group_add(group, self.channel_name)
        self._pending: dict[str, Any] = {}  # run id -> {kind: {object ids}}, or None: everything
        self._refresh, self._task, self._last_push = False, None, 0.0
        self._rendering = asyncio.Lock()
        await self.accept()
        await self.push(resync=True)  # (re)connect: everything, fresh from the database
        self._resync = asyncio.create_task(self._resync_loop())
        self._watch = asyncio.create_task(self._session_loop())

    async def disconnect(self, code: int) -> None:
        self.closed = True
        for group in getattr(self, "joined", None) or []:
            await self.channel_layer.group_discard(group, self.channel_name)
        for name in ("_task", "_resync", "_watch"):
            task = getattr(self, name, None)
            if task is not None and task is not asyncio.current_task():
                task.cancel()
        if getattr(self, "admitted", False):
            try:
                await socket_cap.release(self.session_key, self.channel_name)
            except Exception:  # the entry goes stale and stops counting on its own
                log.warning("could not release the socket slot", exc_info=True)

    async def _admit(self) -> bool:
        try:
            self.admitted = await socket_cap.admit(self.session_key, self.channel_name)
        except Exception:  # Redis down: the console stays usable; the cap is back with Redis
            log.warning("socket cap unavailable; admitting", exc_info=True)
            return True
        return self.admitted

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        """The console sends nothing that matters; actions go through the HTTP views."""

    async def run_changed(self, event: dict[str, Any]) -> None:
        self._take(event)

    async def live_beat(self, event: dict[str, Any]) -> None:
        """The server's heartbeat (core.live): an HTML comment, which htmx swaps nowhere; the page
        counts it as heard (static/console/liveness.js) and says "not live" when beats stop."""
        if not self.closed:
            await self.send(text_data=BEAT_FRAME)

    async def runs_changed(self, event: dict[str, Any]) -> None:
        """The "runs" group's batch: many runs' hints in one message (core.live)."""
        self._take(event)

    def _take(self, event: dict[str, Any]) -> None:
        noted = False
        for run_id, facts in hints(event):
            noted = self._note(run_id, facts) or noted
        if noted:
            self._wake()

    def _note(self, run_id: Any, facts: Any) -> bool:
        if run_id is None:
            self._refresh = True
        elif not self.relevant(run_id):
            return False
        else:
            note_facts(self._pending, str(run_id), facts)
        return True

    def _wake(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._flush())

    async def _flush(self) -> None:
        """Leading edge at once (a quiet page shows a fact as soon as it is rendered), then at most
        one push per ``coalesce_s`` while facts keep coming: a busy run costs one render per window
        however many facts it commits."""
        loop = asyncio.get_running_loop()
        while self._pending or self._refresh:
            wait = self._last_push + self.coalesce_s - loop.time()
            await asyncio.sleep(max(wait, self.gather_s))
            pending, refresh = self._pending, self._refresh
            self._pending, self._refresh = {}, False
            await self.push(pending=pending, refresh=refresh)
            self._last_push = loop.time()

    async def _resync_loop(self) -> None:
        while True:
            await asyncio.sleep(self.resync_s)
            await self.run_changed({"run_id": None})

    # -- the login behind the socket -------------------------------------------------------------

    async def session_check(self, event: dict[str, Any]) -> None:
        """A logout or an admin change for this user: re-check now rather than at the next tick."""
        await self.still_allowed()

    async def _session_loop(self) -> None:
        while not self.closed:
            await asyncio.sleep(settings.WS_SESSION_CHECK_S)
            if await self.still_allowed() and self.admitted:
                try:
                    await socket_cap.refresh(self.session_key, self.channel_name)
                except Exception:
                    log.warning("could not refresh the socket slot", exc_info=True)

    async def still_allowed(self) -> bool:
        """Re-read the session and the user from the database; close the socket if either is gone."""
        if self.closed:
            return False
        try:
            code, user, roles = await off_view_thread(session_verdict)(
                self.session_key, self.user.pk
            )
        except Exception:  # a database hiccup is not a logout; the next check decides
            log.exception("session check failed for %s", self.scope.get("path"))
            return True
        if code is None:
            # renders see the roles as they are now, not as they were at connect
            self.user, self.roles = user, roles
            self.teams = await off_view_thread(teams_of)(user)
            return True
        if not self.closed:
            self.closed = True
            await self.close(code=code)
        return False

    async def push(
        self,
        *,
        resync: bool = False,
        refresh: bool = False,
        pending: dict[str, Any] | None = None,
    ) -> None:
        if not await self.still_allowed():
            return
        async with self._rendering:  # one render at a time: the page's push state is not shared
            try:
                if resync:
                    html = await off_view_thread(self.render)()
                else:
                    html = await off_view_thread(self.render_facts)(pending or {}, refresh)
            except Exception:  # a failed render must not kill the socket; the next hint retries
                log.exception("live render failed for %s", self.scope.get("path"))
                return
        for frame in [html] if isinstance(html, str) else html:
            if frame and not self.closed:
                await self.send(text_data=frame)

    # -- per page --------------------------------------------------------------------------------

    async def groups_to_join(self) -> list[str] | None:
        raise NotImplementedError

    def relevant(self, run_id: str) -> bool:
        return True

    def render(self) -> str:
        """Everything the page shows that can change (a (re)connect)."""
        raise NotImplementedError

    def render_facts(self, pending: dict[str, Any], refresh: bool) -> str | list[str]:
        """What these facts changed (``refresh``: the periodic catch-up), as one frame or several.
        By default, everything."""
        return self.render()


def session_verdict(session_key: str, user_id: int) -> tuple[int | None, Any, frozenset[str]]:
    """(None, user, roles) while the session still logs this user in and the user may view; else
    the close code.

    django.contrib.auth.get_user does what an HTTP request would: the session must exist and not be
    expired, name this user, carry the hash of their current password, and the user must be active.
    """
    from importlib import import_module
    from types import SimpleNamespace

    from django.contrib.auth import get_user

    store = import_module(settings.SESSION_ENGINE).SessionStore(session_key)
    user = get_user(SimpleNamespace(session=store))  # type: ignore[arg-type]  # get_user reads only .session
    if not user.is_authenticated or user.pk != user_id:
        return UNAUTHENTICATED, None, frozenset()
    roles = roles_of(user)
    if not may(roles, "view"):
        return FORBIDDEN, None, frozenset()
    return None, user, roles


class NotFoundConsumer(AsyncWebsocketConsumer):
    """Any socket path without a route: a clean close (4404), not an error in the ASGI router."""

    async def connect(self) -> None:
        await self.accept()
        await self.close(code=NOT_FOUND)


class RunListConsumer(LiveConsumer):
    """/ws/runs/?state=…&agent=…&owner=… (the run list), ?view=approvals (the approvals inbox) or
    ?view=workers (the Workers page).

    The list's hints come through its process's ListHub (console/list_live.py): one render per
    view and window for all the sockets showing it, then row-level patches per socket. Those shared
    pushes skip the per-push session read; the check every WS_SESSION_CHECK_S and the immediate
    "session.check" of a logout or an admin change close the socket and refresh its roles (part of
    the view's key, so a socket only receives what its roles render)."""

    page: Any = None  # console.list_live.ListPage once the first whole render is sent
    view: Any = None  # console.list_live.View: the socket's filter and page

    def _query(self) -> str:
        return self.scope.get("query_string", b"").decode("latin-1")

    def _page(self) -> str:
        """ "approvals" (the inbox), "workers" (the Workers page), or "" (the run list)."""
        from django.http import QueryDict

        view = QueryDict(self._query()).get("view")
        return view if view in ("approvals", "workers") else ""

    def _inbox(self) -> bool:
        return self._page() == "approvals"

    async def groups_to_join(self) -> list[str]:
        if self._page():
            return [RUNS_GROUP]
        from console.list_live import View

        self.view = View.parse(self._query())
        return []  # the hub joins "runs" once for every list socket of this process

    async def connect(self) -> None:
        await super().connect()
        if getattr(self, "view", None) is not None and hasattr(self, "_resync"):  # accepted
            from console.list_live import hub_for

            self.hub = hub_for(self.channel_layer)
            await self.hub.subscribe(self)

    async def disconnect(self, code: int) -> None:
        hub = getattr(self, "hub", None)
        if hub is not None:
            await hub.unsubscribe(self)
        await super().disconnect(code)

    def view_key(self) -> tuple:
        from console.list_live import view_key

        assert self.view is not None  # only list sockets with a view subscribe to the hub
        return view_key(self.view, self.user, self.roles, self.teams)

    def render(self) -> str:
        if self._inbox():
            from console.interventions import render_inbox_push

            return render_inbox_push(self.user)
        if self._page() == "workers":
            from console.workers import render_workers_push

            return render_workers_push(self.user)
        from console.list_live import ListHub, full_render

        if self.view is None:
            return ""
        html, self.page = full_render(self.user, self.view, self.view_key(), ListHub.full_ttl_s)
        return html

    def render_facts(self, pending: dict[str, Any], refresh: bool) -> str:
        """The list: reached only by the periodic resync (its hints go through the hub): whole.
        The inbox: redrawn when an approval or a state changed. The Workers page: when a run was
        claimed, a lease ended or a state changed (a busy run's effects cost it nothing)."""
        kinds = {k for facts in pending.values() if facts is not None for k in facts}
        everything = refresh or any(facts is None for facts in pending.values())
        if not self._page() or everything:
            return self.render()
        if self._inbox() and any(k.startswith("approval_") or k == "state_changed" for k in kinds):
            return self.render()
        if self._page() == "workers":
            from console.workers import WORKER_FACTS

            return self.render() if WORKER_FACTS & kinds else ""
        return ""

    async def apply_list_update(self, update: Any) -> None:
        """The hub's shared update, cut to what this page shows (string work only)."""
        if self.closed or self.page is None:
            return
        async with self._rendering:
            frames = self.page.frames(update)
        if frames is None:  # patched past twice its size: redraw it whole
            await self.push(resync=True)
            return
        for frame in frames:
            if not self.closed:
                await self.send(text_data=frame)


class RunConsumer(LiveConsumer):
    """/ws/runs/<id>/: the run page. Joins the run's group and its descendants' (the tree section)."""

    async def groups_to_join(self) -> list[str] | None:
        self.run_id = str(self.scope["url_route"]["kwargs"]["run_id"])
        self.run_ids = await database_sync_to_async(self._tree_ids)()
        if self.run_ids is None:
            return None
        return [run_group(run_id) for run_id in self.run_ids]

    def _tree_ids(self) -> set[str] | None:
        from core.auth import actor_for_user
        from interventions.base import descendants
        from runs.selectors import visible_run

        run = visible_run(actor_for_user(self.user, None, component="console"), self.run_id)
        if run is None:
            return None
        return {self.run_id} | {str(child.pk) for child in descendants(run)[:TREE_LIMIT]}

    def relevant(self, run_id: str) -> bool:
        return run_id in self.run_ids

    async def run_changed(self, event: dict[str, Any]) -> None:
        """A child created under this tree (``child_created`` on its parent): follow it from now on,
        so its facts redraw the tree as those of the children known at connect do."""
        for run_id, facts in hints(event):
            if str(run_id) not in self.run_ids:
                continue
            for fact in facts or ():
                kind, child = (list(fact) + ["", ""])[:2]
                child = str(child or "")
                if kind != "child_created" or not child or child in self.run_ids:
                    continue
                if len(self.run_ids) >= TREE_LIMIT:
                    break
                self.run_ids.add(child)
                if self.joined is not None:  # left as it was at connect: the groups to leave
                    self.joined.append(run_group(child))
                await self.channel_layer.group_add(run_group(child), self.channel_name)
        self._take(event)

    def render(self) -> str:
        from console.run_page import RunPagePush

        query = self.scope.get("query_string", b"").decode("latin-1")
        self.page = RunPagePush(self.user, self.run_id, query)
        return self.page.resync()

    def render_facts(self, pending: dict[str, Any], refresh: bool) -> str | list[str]:
        """Only what the facts changed: the sections they touch, each changed effect row, the new
        timeline entries; a child's facts redraw the tree. Too many facts to name: everything."""
        own = pending.get(self.run_id, {})
        if own is None:
            return self.render()
        tree_changed = any(run_id != self.run_id for run_id in pending)
        if refresh:  # the periodic catch-up: every section, without resetting what the page opened
            from console.run_page import REFRESH_FACTS

            own = {**{kind: {""} for kind in REFRESH_FACTS}, **own}
            tree_changed = True
        self.page.user = self.user  # the roles as they are now (re-read by the session check)
        return self.page.facts(own, tree_changed)


class FleetConsumer(LiveConsumer):
    """/ws/fleet/<id>/: a fleet operation's progress page. core.live.announce_fleet's hint (a wave
    closed, a target decided or failed, a halt) redraws the progress section; the page's 1 s poll
    runs only while this socket is not open."""

    async def groups_to_join(self) -> list[str] | None:
        from interventions.selectors import operation_exists

        self.operation_id = str(self.scope["url_route"]["kwargs"]["operation_id"])
        from core.auth import actor_for_user

        def exists_for_user() -> bool:  # another team's operation: as absent
            actor = actor_for_user(self.user, None, component="console")
            return operation_exists(self.operation_id, actor)

        exists = await database_sync_to_async(exists_for_user)()
        return [fleet_group(self.operation_id)] if exists else None

    async def fleet_changed(self, event: dict[str, Any]) -> None:
        self._note(None, None)  # no run: redraw the progress section whole
        self._wake()

    def render(self) -> str:
        from console.fleet import render_progress_push

        return render_progress_push(self.user, self.roles, self.operation_id)
