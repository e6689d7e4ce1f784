"""The ASGI handler: Django's, except that a request for a *sync* view crosses into a thread once.

Django's stock ASGIHandler runs the middleware chain in async mode. Every built-in middleware is a
``MiddlewareMixin``, whose async mode runs ``process_request`` and ``process_response`` each through
``sync_to_async``: with our eight middleware and a sync view that is ~16 thread hops per request, each
copying the context and waking the event loop. Measured in-process on the worker protocol's calls,
that cost more CPU than the view's own queries. Around the view Django adds three more hops per
request (the ``request_started`` signal, the view, ``response.close()``), each into a thread that
``ThreadSensitiveContext`` starts for that one request and joins at its end.

Here a request whose view is a plain function is served the way a WSGI server serves it: one hop
into one of this process's long-lived request threads, which sends ``request_started``, builds the
request, runs the whole sync chain (the same ``MIDDLEWARE``, loaded in sync mode) and, for an
ordinary (non-streaming) response, closes it (``request_finished``: the database connection goes
back to the pool) before the event loop sends the bytes. A streaming response is closed after it
was sent, by a second hop into the same thread. Everything a request does in sync code happens on
one thread, so database connections, transactions and on-commit hooks behave as under WSGI. A
request whose view is a coroutine (the long-polling heartbeat) keeps Django's async path untouched,
so it waits without holding a thread.

Sync views also pass a per-process gate (``SYNC_VIEW_CONCURRENCY``, see ``_sync_slots``): requests
beyond it wait on the event loop rather than in threads fighting over the GIL. Each admitted request
borrows one request thread for its whole life; there are as many as the gate admits. While the
database is known down, no request waits in the gate: it is refused "did nothing" (controlplane/gate.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing

from asgiref.sync import ThreadSensitiveContext, iscoroutinefunction, sync_to_async
from django.conf import settings
from django.core import signals
from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.core.handlers.base import BaseHandler
from django.http import FileResponse
from django.urls import Resolver404, get_resolver, set_script_prefix

from controlplane.gate import DatabaseDown, SyncGate, refuse

_MATCH = "controlplane.resolver_match"  # scope key: (path_info, ResolverMatch) found by __call__
SLOW_GATE_S = 1.0  # a wait for the sync-view gate this long is logged: saturated, or stuck
log = logging.getLogger(__name__)


class _SyncChain(BaseHandler):
    """The sync middleware chain. It takes the URL match that ``__call__`` made to choose the chain
    instead of resolving the same path a second time (unless a middleware set ``request.urlconf``)."""

    def resolve_request(self, request):
        found = getattr(request, "scope", {}).get(_MATCH)
        if found is None or hasattr(request, "urlconf") or found[0] != request.path_info:
            return super().resolve_request(request)
        request.resolver_match = found[1]
        return found[1]


class ControlPlaneASGIHandler(ASGIHandler):
    def __init__(self) -> None:
        super().__init__()  # the async chain, for coroutine views
        self._sync_handler = _SyncChain()
        self._sync_handler.load_middleware(is_async=False)
        # One gate per event loop (a server has one; tests make many, which must not pile up here).
        self._slots: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, SyncGate] = (
            weakref.WeakKeyDictionary()
        )
        # Idle request threads (single-thread executors), reused across requests and event loops.
        self._idle: list[ThreadPoolExecutor] = []

    def _sync_slots(self) -> SyncGate | None:
        """At most SYNC_VIEW_CONCURRENCY sync views run at once in this process; more wait on the event
        loop, holding no thread. Without a bound, a saturated server runs one thread per request and
        they fight over the GIL: a woken long-poll heartbeat (whose own database work goes straight to
        a thread, not through this gate) then waits for the GIL at every round trip, and a pause took
        ~430 ms to reach its worker under 16 busy protocol workers."""
        limit = settings.SYNC_VIEW_CONCURRENCY
        if limit <= 0:
            return None
        loop = asyncio.get_running_loop()
        slots = self._slots.get(loop)
        if slots is None:
            slots = self._slots[loop] = SyncGate(limit, loop)
        return slots

    @staticmethod
    def view_is_async(path: str) -> bool:
        try:
            return iscoroutinefunction(get_resolver().resolve(path).func)
        except Resolver404:
            return False

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            path = _path_info(scope)
            try:
                match = get_resolver().resolve(path)
            except Resolver404:
                match = None
            if match is None or not iscoroutinefunction(match.func):
                scope = {**scope, _MATCH: (path, match)} if match is not None else scope
                # The context stays, so that anything thread-sensitive a streaming response does while
                # it is sent gets a thread of this request, as under Django's handler.
                async with ThreadSensitiveContext():
                    await self._handle_sync(scope, receive, send)
                return
        await super().__call__(scope, receive, send)

    async def get_response_async(self, request):
        # Only coroutine views come here (see __call__); a sync view reached another way (a test
        # calling the handler's async path) still runs the sync chain in one hop.
        if self.view_is_async(request.path_info):
            return await super().get_response_async(request)
        return await sync_to_async(self._sync_handler.get_response, thread_sensitive=True)(request)

    async def _handle_sync(self, scope, receive, send) -> None:
        try:
            body_file = await self.read_body(receive)
        except RequestAborted:
            return
        with closing(body_file):
            slots = self._sync_slots()
            if slots is None:
                await self._serve_in_thread(scope, body_file, send)
                return
            queued = time.monotonic()
            try:
                await slots.enter()
            except DatabaseDown as down:
                # the same line as api/app.py's, so a log search finds both refusals
                log.warning(
                    "database unavailable on %s %s (refused at the sync-view gate after %.1f s, "
                    "nothing applied: 503): %s",
                    scope.get("method"),
                    scope.get("path"),
                    time.monotonic() - queued,
                    down,
                )
                await refuse(send, str(down))
                return
            try:
                if (waited := time.monotonic() - queued) >= SLOW_GATE_S:
                    log.warning(
                        "%s %s waited %.1f s for a sync-view slot (SYNC_VIEW_CONCURRENCY)",
                        scope.get("method"),
                        scope.get("path"),
                        waited,
                    )
                await self._serve_in_thread(scope, body_file, send)
            finally:
                slots.leave()

    async def _serve_in_thread(self, scope, body_file, send) -> None:
        thread = self._idle.pop() if self._idle else ThreadPoolExecutor(1, "request")
        try:
            hop = sync_to_async(self._serve, thread_sensitive=False, executor=thread)
            response = await hop(scope, body_file)
            try:
                await self.send_response(response, send)
            finally:
                if response.streaming:
                    await sync_to_async(response.close, thread_sensitive=False, executor=thread)()
        finally:
            self._idle.append(thread)

    def _serve(self, scope, body_file):
        """On a request thread: what Django's ASGIHandler.handle does around the view, in sync."""
        set_script_prefix(get_script_prefix(scope))
        signals.request_started.send(sender=self.__class__, scope=scope)
        request, response = self.create_request(scope, body_file)
        if request is not None:
            response = self._sync_handler.get_response(request)
            response._handler_class = self.__class__
            if isinstance(response, FileResponse):
                response.block_size = self.chunk_size
        if not response.streaming:
            response.close()  # request_finished: connections go back before the bytes are sent
        return response


def _path_info(scope) -> str:
    """The path the URL resolver sees, as ``ASGIRequest`` computes it."""
    path = scope["path"]
    script_name = get_script_prefix(scope).rstrip("/")
    if script_name and (path.startswith(script_name + "/") or path == script_name):
        return path[len(script_name) :]
    return path


def get_asgi_application() -> ControlPlaneASGIHandler:
    """django.core.asgi.get_asgi_application, with our handler."""
    import django

    django.setup(set_prefix=False)
    return ControlPlaneASGIHandler()
