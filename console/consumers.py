"""Live console over Channels. A consumer joins groups and forwards rendered partials; nothing more.

Pushes are hints: the channel layer delivers at most once, so nothing here carries state. Every
message is the relevant partials re-rendered from the database, sent as htmx out-of-band swaps
(``hx-swap-oob``) that htmx-ext-ws applies; on every (re)connect the consumer sends a fresh render
at once, so a page that missed hints while disconnected is current again.

core.live.push_run_update sends {"type": "run.changed", "run_id"} to "runs" and "run.<id>" on every
committed transition. Bursts (a pause cascading over a tree) are coalesced into one render. A slow
resync re-renders anyway, for hints lost on the way (or sent by a process on another channel layer,
as Celery workers are under the embedded in-memory layer).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer

from core.live import RUNS_GROUP, run_group
from core.roles import may, roles_of

log = logging.getLogger(__name__)

# Close codes (4000-4999 are the application's): the handshake is refused before accept.
UNAUTHENTICATED, FORBIDDEN, NOT_FOUND = 4401, 4403, 4404
TREE_LIMIT = 200  # groups joined for one run page: the run and its descendants


class LiveConsumer(AsyncWebsocketConsumer):
    coalesce_s = 0.15
    resync_s = 30.0
    _task: asyncio.Task[None] | None

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=UNAUTHENTICATED)
            return
        if not await database_sync_to_async(lambda: may(roles_of(user), "view"))():
            await self.close(code=FORBIDDEN)
            return
        self.user = user
        self.joined = await self.groups_to_join()
        if self.joined is None:
            await self.close(code=NOT_FOUND)
            return
        for group in self.joined:
            await self.channel_layer.group_add(group, self.channel_name)
        self._dirty, self._task = False, None
        await self.accept()
        await self.push()  # (re)connect: re-render from the database
        self._resync = asyncio.create_task(self._resync_loop())

    async def disconnect(self, code: int) -> None:
        for group in getattr(self, "joined", None) or []:
            await self.channel_layer.group_discard(group, self.channel_name)
        for task in (getattr(self, "_task", None), getattr(self, "_resync", None)):
            if task is not None:
                task.cancel()

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        """The console sends nothing that matters; actions go through the HTTP views."""

    async def run_changed(self, event: dict[str, Any]) -> None:
        if event.get("run_id") is not None and not self.relevant(event["run_id"]):
            return
        self._dirty = True
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._flush())

    async def _flush(self) -> None:
        while self._dirty:
            await asyncio.sleep(self.coalesce_s)
            self._dirty = False
            await self.push()

    async def _resync_loop(self) -> None:
        while True:
            await asyncio.sleep(self.resync_s)
            await self.run_changed({"run_id": None})

    async def push(self) -> None:
        try:
            html = await database_sync_to_async(self.render)()
        except Exception:  # a failed render must not kill the socket; the next hint retries
            log.exception("live render failed for %s", self.scope.get("path"))
            return
        if html:
            await self.send(text_data=html)

    # -- per page --------------------------------------------------------------------------------

    async def groups_to_join(self) -> list[str] | None:
        raise NotImplementedError

    def relevant(self, run_id: str) -> bool:
        return True

    def render(self) -> str:
        raise NotImplementedError


class RunListConsumer(LiveConsumer):
    """/ws/runs/?state=…&agent=…&owner=… (the run list) or ?view=approvals (the approvals inbox)."""

    async def groups_to_join(self) -> list[str]:
        return [RUNS_GROUP]

    def render(self) -> str:
        from django.http import QueryDict

        query = self.scope.get("query_string", b"").decode("latin-1")
        if QueryDict(query).get("view") == "approvals":
            from console.interventions import render_inbox_push

            return render_inbox_push(self.user)
        from console.runs import render_list_push

        return render_list_push(self.user, query)


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
        from runs.selectors import visible_runs

        run = (
            visible_runs(actor_for_user(self.user, None, component="console"))
            .filter(pk=self.run_id)
            .first()
        )
        if run is None:
            return None
        return {self.run_id} | {str(child.pk) for child in descendants(run)[:TREE_LIMIT]}

    def relevant(self, run_id: str) -> bool:
        return run_id in self.run_ids

    def render(self) -> str:
        from console.runs import render_detail_push

        return render_detail_push(self.user, self.run_id)
