"""The ASGI handler: Django's, except that a request for a *sync* view crosses into a thread once.

Django's stock ASGIHandler runs the middleware chain in async mode. Every built-in middleware is a
``MiddlewareMixin``, whose async mode runs ``process_request`` and ``process_response`` each through
``sync_to_async``: with our eight middleware and a sync view that is ~16 thread hops per request, each
copying the context and waking the event loop. Measured in-process on the worker protocol's calls,
that cost more CPU than the view's own queries.

Here a request whose view is a plain function runs the whole sync chain (the same ``MIDDLEWARE``,
loaded in sync mode) in one ``sync_to_async`` hop, exactly as a WSGI server would run it. A request
whose view is a coroutine (the long-polling heartbeat) keeps Django's async chain, so it waits
without holding a thread. Semantics are Django's either way: same middleware, same signals, same
per-request thread (``thread_sensitive`` inside ASGIHandler's ``ThreadSensitiveContext``), so
database connections, transactions and on-commit hooks stay on one thread per request.

Sync views also pass a per-process gate (``SYNC_VIEW_CONCURRENCY``, see ``_sync_slots``): requests
beyond it wait on the event loop rather than in threads fighting over the GIL.
"""

from __future__ import annotations

import asyncio
import weakref

from asgiref.sync import iscoroutinefunction, sync_to_async
from django.conf import settings
from django.core.handlers.asgi import ASGIHandler
from django.core.handlers.base import BaseHandler
from django.urls import Resolver404, get_resolver


class ControlPlaneASGIHandler(ASGIHandler):
    def __init__(self) -> None:
        super().__init__()  # the async chain, for coroutine views
        self._sync_handler = BaseHandler()
        self._sync_handler.load_middleware(is_async=False)
        # One gate per event loop (a server has one; tests make many, which must not pile up here).
        self._slots: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
            weakref.WeakKeyDictionary()
        )

    def _sync_slots(self) -> asyncio.Semaphore | None:
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
            slots = self._slots[loop] = asyncio.Semaphore(limit)
        return slots

    @staticmethod
    def view_is_async(path: str) -> bool:
        try:
            return iscoroutinefunction(get_resolver().resolve(path).func)
        except Resolver404:
            return False

    async def get_response_async(self, request):
        if self.view_is_async(request.path_info):
            return await super().get_response_async(request)
        run = sync_to_async(self._sync_handler.get_response, thread_sensitive=True)
        slots = self._sync_slots()
        if slots is None:
            return await run(request)
        async with slots:
            return await run(request)


def get_asgi_application() -> ControlPlaneASGIHandler:
    """django.core.asgi.get_asgi_application, with our handler."""
    import django

    django.setup(set_prefix=False)
    return ControlPlaneASGIHandler()
