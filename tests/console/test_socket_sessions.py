"""The live console's sockets live no longer than their login: logout, deactivation and a lost role
close them; the Origin must be this very site (scheme, host and port); unknown paths close cleanly;
sockets per session are capped. (The same against a real daphne: tests/e2e/test_socket_daphne.py.)"""

from __future__ import annotations

import time

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import Group, User
from django.test import Client, override_settings

from console.origin import origin_allowed

IN_MEMORY_LAYER = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("postgres_only"),
]


def _browser(username: str) -> Client:
    client = Client()
    assert client.login(username=username, password=f"pw-{username}")
    return client


def _headers(client: Client, origin: str = "http://testserver") -> list[tuple[bytes, bytes]]:
    return [
        (b"origin", origin.encode()),
        (b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode()),
        (b"host", b"testserver"),
    ]


def _socket(path: str, headers) -> WebsocketCommunicator:
    from controlplane.asgi import application

    return WebsocketCommunicator(application, path, headers=headers)


async def _closed_with(socket: WebsocketCommunicator, within: float) -> int | None:
    """Skip pushed pages until the server closes; the close code (None: still open after `within`).
    (receive_output's own timeout would cancel the application, so wait with receive_nothing.)"""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if await socket.receive_nothing(timeout=0.1, interval=0.01):
            continue
        message = await socket.receive_output(timeout=1)
        if message["type"] == "websocket.close":
            return message.get("code")
    return None


def _scope(origin: str | None, host: str = "testserver", scheme: str = "ws", **extra):
    headers = [(b"host", host.encode())]
    if origin is not None:
        headers.append((b"origin", origin.encode()))
    for name, value in extra.items():
        headers.append((name.replace("_", "-").encode(), value.encode()))
    return {"type": "websocket", "scheme": scheme, "headers": headers, "client": ["10.0.0.5", 555]}


@override_settings(ALLOWED_HOSTS=["console.example", "testserver"], TRUSTED_PROXIES=["10.0.0.0/8"])
def test_it_accepts_only_the_sites_own_scheme_host_and_port():
    assert origin_allowed(_scope("http://console.example:8000", host="console.example:8000"))
    assert origin_allowed(_scope("https://console.example", host="console.example", scheme="wss"))
    assert origin_allowed(_scope("http://console.example:80", host="console.example"))
    # Same host, another port or scheme: another origin (AllowedHostsOriginValidator let these in).
    assert not origin_allowed(_scope("http://console.example:9999", host="console.example:8000"))
    assert not origin_allowed(
        _scope("http://console.example", host="console.example", scheme="wss")
    )
    assert not origin_allowed(_scope("https://console.example:8000", host="console.example:8000"))
    assert not origin_allowed(_scope("http://evil.example", host="console.example"))
    assert not origin_allowed(_scope(None, host="console.example"))
    assert not origin_allowed(_scope("null", host="console.example"))
    # A Host outside ALLOWED_HOSTS is no origin of ours, even if the Origin echoes it.
    assert not origin_allowed(_scope("http://evil.example", host="evil.example"))
    # TLS ended at a trusted proxy: its X-Forwarded-Proto says the page was https.
    proxied = _scope("https://console.example", host="console.example", x_forwarded_proto="https")
    assert origin_allowed(proxied)
    with override_settings(TRUSTED_PROXIES=[]):
        assert not origin_allowed(proxied)


@override_settings(ALLOWED_HOSTS=["testserver"], CSRF_TRUSTED_ORIGINS=["https://ops.example:8443"])
def test_it_accepts_an_exact_csrf_trusted_origin():
    assert origin_allowed(_scope("https://ops.example:8443"))
    assert not origin_allowed(_scope("https://ops.example"))


@override_settings(CHANNEL_LAYERS=IN_MEMORY_LAYER)
def test_it_closes_unknown_socket_paths_cleanly():
    async def go():
        socket = _socket(
            "/ws/nowhere/", [(b"origin", b"http://testserver"), (b"host", b"testserver")]
        )
        connected, _ = await socket.connect(timeout=5)
        assert connected
        assert await _closed_with(socket, 3) == 4404
        await socket.wait()

    async_to_sync(go)()


@override_settings(CHANNEL_LAYERS=IN_MEMORY_LAYER, WS_SESSION_CHECK_S=600)
def test_it_closes_the_socket_at_logout_without_waiting_for_the_tick(cast):
    otto = _browser("otto")

    async def go():
        socket = _socket("/ws/runs/", _headers(otto))
        assert (await socket.connect(timeout=5))[0]
        await socket.receive_from(timeout=5)  # the fresh render on connect
        response = await database_sync_to_async(otto.post)("/accounts/logout/")
        assert response.status_code == 302
        assert await _closed_with(socket, 3) == 4401

    async_to_sync(go)()


@override_settings(CHANNEL_LAYERS=IN_MEMORY_LAYER, WS_SESSION_CHECK_S=1)
def test_it_closes_the_socket_of_a_user_deactivated_behind_its_back(cast):
    """No hint at all (a raw UPDATE): the periodic check still ends the stream within seconds."""
    otto = _browser("otto")

    async def go():
        socket = _socket("/ws/runs/", _headers(otto))
        assert (await socket.connect(timeout=5))[0]
        await socket.receive_from(timeout=5)
        assert await _closed_with(socket, 0.5) is None  # still streaming while active
        await database_sync_to_async(User.objects.filter(username="otto").update)(is_active=False)
        assert await _closed_with(socket, 4) == 4401

    async_to_sync(go)()


@override_settings(CHANNEL_LAYERS=IN_MEMORY_LAYER, WS_SESSION_CHECK_S=1)
def test_it_closes_with_4403_when_the_user_loses_every_role(cast):
    otto = _browser("otto")

    def strip_roles():
        User.objects.get(username="otto").groups.clear()

    async def go():
        socket = _socket("/ws/runs/", _headers(otto))
        assert (await socket.connect(timeout=5))[0]
        await socket.receive_from(timeout=5)
        await database_sync_to_async(strip_roles)()
        assert await _closed_with(socket, 4) == 4403

    async_to_sync(go)()


@override_settings(CHANNEL_LAYERS=IN_MEMORY_LAYER, WS_MAX_PER_SESSION=2)
def test_it_caps_sockets_per_session_and_frees_a_place_on_disconnect(cast):
    otto, vera = _browser("otto"), _browser("vera")

    async def go():
        first, second = _socket("/ws/runs/", _headers(otto)), _socket("/ws/runs/", _headers(otto))
        assert (await first.connect(timeout=5))[0] and (await second.connect(timeout=5))[0]
        assert await _socket("/ws/runs/", _headers(otto)).connect(timeout=5) == (False, 4429)
        other_session = _socket("/ws/runs/", _headers(vera))  # the cap is per session, not global
        assert (await other_session.connect(timeout=5))[0]
        await first.disconnect()
        again = _socket("/ws/runs/", _headers(otto))
        assert (await again.connect(timeout=5))[0]
        for socket in (second, other_session, again):
            await socket.disconnect()

    async_to_sync(go)()


@override_settings(CHANNEL_LAYERS=IN_MEMORY_LAYER, WS_SESSION_CHECK_S=600)
def test_an_admin_deactivation_closes_the_users_sockets_at_once(cast):
    """Through the audited admin: its commit wakes the user's sockets (no waiting for the tick)."""
    root = User.objects.create_superuser("root", password="pw-root")
    admin = Client()
    admin.force_login(root)
    otto = _browser("otto")
    operator = Group.objects.get(name="operator")

    async def go():
        socket = _socket("/ws/runs/", _headers(otto))
        assert (await socket.connect(timeout=5))[0]
        await socket.receive_from(timeout=5)
        user = cast["otto"][0]
        data = {
            "username": "otto",
            "is_staff": "",
            "groups": [operator.pk],
            "date_joined_0": "2026-01-01",
            "date_joined_1": "00:00:00",
        }  # is_active left out: unchecked
        response = await database_sync_to_async(admin.post)(
            f"/admin/auth/user/{user.pk}/change/", data
        )
        assert response.status_code == 302, response.content[:2000]
        assert await _closed_with(socket, 3) == 4401

    async_to_sync(go)()


@override_settings(WS_MAX_PER_SESSION=2, WS_SESSION_CHECK_S=5)
def test_a_place_held_by_a_process_that_died_stops_counting(settings):
    """A daphne killed mid-connection never releases its sockets' places: unrefreshed ones go stale."""
    from console import socket_cap

    if not settings.REDIS_URL:
        pytest.skip("the shared count lives in Redis (REDIS_URL)")
    session = f"session-{time.time_ns()}"

    async def go():
        import redis.asyncio as aioredis

        assert await socket_cap.admit(session, "dead-process.1")
        assert await socket_cap.admit(session, "live.1")
        assert not await socket_cap.admit(session, "live.2")
        client = aioredis.Redis.from_url(settings.REDIS_URL)
        stale_at = time.time() - socket_cap.stale_s() - 1
        await client.zadd(socket_cap._key(session), {"dead-process.1": stale_at})
        await client.aclose()
        assert await socket_cap.admit(session, "live.2")
        for channel in ("live.1", "live.2"):
            await socket_cap.release(session, channel)

    async_to_sync(go)()
