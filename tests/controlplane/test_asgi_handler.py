"""controlplane.handler: sync views run the sync middleware chain in one thread hop; coroutine views
(the long-polling heartbeat) keep Django's async chain. Exercised through the real ASGI application."""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync
from channels.testing import HttpCommunicator
from django.core.handlers.base import BaseHandler

from controlplane.asgi import django_asgi_app
from controlplane.handler import ControlPlaneASGIHandler

pytestmark = pytest.mark.django_db(transaction=True)


def _get(path: str, method: str = "GET", body: bytes = b"", headers=None):
    comm = HttpCommunicator(
        django_asgi_app,
        method,
        path,
        body=body,
        headers=[(b"host", b"localhost"), *(headers or [])],
    )
    return async_to_sync(comm.get_response)(timeout=10)


def test_routing_by_view_kind():
    lease = "00000000-0000-0000-0000-000000000001"
    assert ControlPlaneASGIHandler.view_is_async(f"/api/v1/leases/{lease}/heartbeat") is True
    assert ControlPlaneASGIHandler.view_is_async(f"/api/v1/runs/{lease}/effects") is False
    assert ControlPlaneASGIHandler.view_is_async("/accounts/login/") is False
    assert ControlPlaneASGIHandler.view_is_async("/no/such/page/") is False


def test_sync_view_runs_the_whole_middleware_chain_without_the_async_chain(monkeypatch):
    async def refuse(self, request):
        raise AssertionError("a sync view went through the async middleware chain")

    monkeypatch.setattr(BaseHandler, "get_response_async", refuse)
    page = _get("/accounts/login/")
    assert page["status"] == 200
    headers = {k.lower(): v for k, v in page["headers"]}
    assert headers[b"x-frame-options"] == b"DENY"  # XFrameOptionsMiddleware
    assert b"csrftoken" in headers.get(b"set-cookie", b"")  # CsrfViewMiddleware
    # CSRF still refuses a cookie-less form post.
    post = _get(
        "/accounts/login/",
        "POST",
        b"username=a&password=b",
        [(b"content-type", b"application/x-www-form-urlencoded")],
    )
    assert post["status"] == 403


def test_async_view_still_served_by_the_async_chain(monkeypatch):
    calls = []
    original = BaseHandler.get_response_async

    async def spy(self, request):
        calls.append(request.path)
        return await original(self, request)

    monkeypatch.setattr(BaseHandler, "get_response_async", spy)
    lease = "00000000-0000-0000-0000-000000000001"
    resp = _get(
        f"/api/v1/leases/{lease}/heartbeat",
        "POST",
        b'{"fencing_token": 1}',
        [(b"content-type", b"application/json")],
    )
    assert calls == [f"/api/v1/leases/{lease}/heartbeat"]
    # No bearer token and no session: a 401 from the view's own auth, as on the sync chain.
    assert resp["status"] == 401 and b"unauthenticated" in resp["body"], resp["body"]


@pytest.mark.parametrize("limit, expected_peak", [(2, 2), (0, 6)])
def test_sync_views_run_at_most_sync_view_concurrency_at_once(
    settings, monkeypatch, limit, expected_peak
):
    import asyncio
    import threading
    import time

    settings.SYNC_VIEW_CONCURRENCY = limit
    handler = django_asgi_app
    real = handler._sync_handler.get_response
    lock, running, peak = threading.Lock(), [0], [0]

    def slow(request):
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        try:
            time.sleep(0.3)
            return real(request)
        finally:
            with lock:
                running[0] -= 1

    monkeypatch.setattr(handler._sync_handler, "get_response", slow)

    async def six():
        comms = [
            HttpCommunicator(handler, "GET", "/accounts/login/", headers=[(b"host", b"localhost")])
            for _ in range(6)
        ]
        return await asyncio.gather(*(c.get_response(timeout=10) for c in comms))

    responses = async_to_sync(six)()
    assert [r["status"] for r in responses] == [200] * 6
    assert peak[0] == expected_peak


def test_sync_requests_reuse_the_request_threads_and_signal_once_each(settings):
    """No thread per request (Django's ThreadSensitiveContext starts and joins one per request): the
    request threads are reused; request_started and request_finished still fire once per request,
    and request_finished (connections back to the pool) before the response leaves."""
    import threading

    from django.core import signals

    settings.SYNC_VIEW_CONCURRENCY = 2
    threads, started, finished = set(), [], []

    def on_started(**kwargs):
        threads.add(threading.get_ident())
        started.append(kwargs.get("scope", {}).get("path"))

    def on_finished(**kwargs):
        assert threading.get_ident() in threads  # on the thread that served the view
        finished.append(1)

    signals.request_started.connect(on_started)
    signals.request_finished.connect(on_finished)
    try:
        for _ in range(5):
            assert _get("/accounts/login/")["status"] == 200
    finally:
        signals.request_started.disconnect(on_started)
        signals.request_finished.disconnect(on_finished)
    assert started == ["/accounts/login/"] * 5 and len(finished) == 5
    assert len(threads) == 1  # one request at a time: the same thread each time
    assert threading.main_thread().ident not in threads


def _stream_view(request):
    from django.http import StreamingHttpResponse

    return StreamingHttpResponse(iter([b"a" * 10, b"b" * 10]), content_type="text/plain")


urlpatterns = [__import__("django.urls").urls.path("stream/", _stream_view)]


@pytest.mark.urls(__name__)
def test_a_streaming_response_is_sent_whole_and_closed_after():
    from django.core import signals

    finished = []

    def on_finished(**kwargs):
        finished.append(1)

    sent = []

    async def call():
        messages = iter([{"type": "http.request", "body": b""}])

        async def receive():
            return next(messages, {"type": "http.disconnect"})

        async def send(message):
            sent.append((message, len(finished)))

        scope = {"type": "http", "method": "GET", "path": "/stream/", "query_string": b""}
        await django_asgi_app(scope | {"headers": [(b"host", b"localhost")]}, receive, send)

    signals.request_finished.connect(on_finished)
    try:
        async_to_sync(call)()
    finally:
        signals.request_finished.disconnect(on_finished)
    assert sent[0][0]["status"] == 200
    assert b"".join(m.get("body", b"") for m, _ in sent[1:]) == b"a" * 10 + b"b" * 10
    # closed (request_finished) once, after the last byte went out, as under Django's handler
    assert [n for _, n in sent] == [0] * len(sent) and finished == [1]


def test_a_sync_request_resolves_its_url_once(monkeypatch):
    """The match made to choose the chain is the one the view gets; no second resolve."""
    from django.urls import get_resolver
    from django.urls.resolvers import URLResolver

    root, calls = get_resolver(), []
    real = URLResolver.resolve

    def spy(self, path):
        if self is root:
            calls.append(path)
        return real(self, path)

    monkeypatch.setattr(URLResolver, "resolve", spy)
    assert _get("/accounts/login/")["status"] == 200
    assert calls == ["/accounts/login/"]
