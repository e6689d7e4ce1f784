"""``GET /healthz`` and ``GET /readyz``: what a load balancer or an orchestrator asks a process.

``/healthz`` says the process is alive: its event loop answers. It touches nothing else, so a
database outage never gets a healthy process restarted.

``/readyz`` says the process can do its job now: PostgreSQL answers, every migration on disk is
applied, the channel layer's Redis and the Celery broker answer, and the process is not draining
(controlplane/drain.py). Any failure is a 503 whose JSON names the check, so traffic moves to another
replica within one probe interval and comes back as soon as the dependency does.

Both are answered here, in front of Django, not by a view: no middleware, session, audit event, host
check (a probe asks by IP, not by the public name in ALLOWED_HOSTS), request thread or metric. Every
check opens its own short connection with a timeout of ``READY_CHECK_TIMEOUT_S``: the request pool
would make a probe wait its 10 s checkout timeout while PostgreSQL is down. A failed database check
is remembered for the request pool (core/pg/reach.py): its waiting checkouts are refused at once,
not after 10 s, for ``DB_DOWN_MEMORY_S`` after the last failed probe. Operators: see
docs/operations/health.md.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

from django.conf import settings

from core import drain
from core.pg import reach

PATHS = frozenset({"/healthz", "/readyz"})
CHECK_TIMEOUT_S = float(os.environ.get("READY_CHECK_TIMEOUT_S", "2"))
_STARTED = time.time()
_leaf_migrations: set[tuple[str, str]] | None = None


def expected_migrations() -> set[tuple[str, str]]:
    """The newest migration of each app on disk (read once: the code does not change under us)."""
    global _leaf_migrations
    if _leaf_migrations is None:
        from django.db.migrations.loader import MigrationLoader

        _leaf_migrations = set(MigrationLoader(None, ignore_no_migrations=True).graph.leaf_nodes())
    return _leaf_migrations


async def _postgres() -> dict[str, Any]:
    db = settings.DATABASES["default"]
    if not settings.IS_POSTGRES:
        return await _sqlite()
    import psycopg

    params: dict[str, Any] = {
        "dbname": db["NAME"],
        "user": db.get("USER") or None,
        "password": db.get("PASSWORD") or None,
        "host": db.get("HOST") or None,
        "port": db.get("PORT") or None,
    }
    expected = expected_migrations()
    conn = await psycopg.AsyncConnection.connect(
        connect_timeout=max(int(CHECK_TIMEOUT_S), 1),
        autocommit=True,
        **{k: v for k, v in params.items() if v},
    )
    reach.note_reached()  # (a failure, a timeout included, is noted by readiness())
    async with conn:
        cur = await conn.execute(
            "SELECT app, name FROM django_migrations WHERE app = ANY(%s)",
            [sorted({app for app, _ in expected})],
        )
        applied = {(app, name) for app, name in await cur.fetchall()}
    return _migrations_result(expected - applied)


async def _sqlite() -> dict[str, Any]:
    from asgiref.sync import sync_to_async
    from django.db import connection
    from django.db.migrations.recorder import MigrationRecorder

    def read() -> set[tuple[str, str]]:
        try:
            return set(MigrationRecorder(connection).applied_migrations())
        finally:
            connection.close()

    return _migrations_result(expected_migrations() - await sync_to_async(read)())


def _migrations_result(missing: set[tuple[str, str]]) -> dict[str, Any]:
    if missing:
        names = ", ".join(f"{app}.{name}" for app, name in sorted(missing))
        return {"ok": False, "error": f"migrations not applied: {names}"}
    return {"ok": True}


async def _redis(url: str) -> dict[str, Any]:
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(
        url, socket_connect_timeout=CHECK_TIMEOUT_S, socket_timeout=CHECK_TIMEOUT_S
    )
    try:
        await client.ping()
    finally:
        await client.aclose()
    return {"ok": True}


def _embedded() -> Callable[[], Awaitable[dict[str, Any]]]:
    async def check() -> dict[str, Any]:
        return {"ok": True, "embedded": True}

    return check


def _checks() -> dict[str, Callable[[], Awaitable[dict[str, Any]]]]:
    checks: dict[str, Callable[[], Awaitable[dict[str, Any]]]] = {"database": _postgres}
    layer: dict[str, Any] = settings.CHANNEL_LAYERS["default"]
    if layer["BACKEND"] == "channels_redis.core.RedisChannelLayer":
        host = layer["CONFIG"]["hosts"][0]
        url = host["address"] if isinstance(host, dict) else host
        checks["channel_layer"] = lambda: _redis(url)
    else:
        checks["channel_layer"] = _embedded()
    broker = settings.CELERY_BROKER_URL
    if broker.startswith(("redis://", "rediss://")):
        checks["broker"] = lambda: _redis(broker)
    else:
        checks["broker"] = _embedded()
    return checks


async def _run(check: Callable[[], Awaitable[dict[str, Any]]]) -> dict[str, Any]:
    started = time.monotonic()
    try:
        result = await asyncio.wait_for(check(), timeout=CHECK_TIMEOUT_S + 0.5)
    except TimeoutError:
        result = {"ok": False, "error": f"no answer within {CHECK_TIMEOUT_S:g} s"}
    except Exception as exc:  # any failure of a dependency is "not ready", named, never a 500
        result = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:300]}
    result["ms"] = round((time.monotonic() - started) * 1000, 1)
    return result


async def readiness() -> tuple[int, dict[str, Any]]:
    checks = _checks()
    results = await asyncio.gather(*(_run(c) for c in checks.values()))
    body: dict[str, Any] = {"checks": dict(zip(checks, results, strict=True))}
    database = body["checks"]["database"]
    if not database["ok"] and not database.get("error", "").startswith("migrations not applied"):
        # the request pool's waiting checkouts refuse at once meanwhile (core/pg/reach.py): each
        # probe (HAProxy's, every 0.5-1 s) renews that memory while the database stays away
        reach.note_refused(database.get("error", "no answer"))
    if drain.is_draining():
        body["checks"]["draining"] = {"ok": False, "error": "this process is shutting down"}
    ready = all(r["ok"] for r in body["checks"].values())
    body["status"] = "ready" if ready else "unavailable"
    return (200 if ready else 503), body


async def _respond(send, status: int, body: dict[str, Any], head: bool) -> None:
    payload = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"cache-control", b"no-store"),
                (b"content-length", str(len(payload)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": b"" if head else payload})


class HealthEndpoints:
    """ASGI middleware: answers the two probe paths itself, passes everything else on."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] not in PATHS:
            return await self.app(scope, receive, send)
        head = scope["method"] == "HEAD"
        if scope["method"] not in ("GET", "HEAD"):
            return await _respond(send, 405, {"error": "method_not_allowed"}, head)
        if scope["path"] == "/healthz":
            alive = {"status": "alive", "pid": os.getpid(), "uptime_s": int(time.time() - _STARTED)}
            return await _respond(send, 200, alive, head)
        status, body = await readiness()
        return await _respond(send, status, body, head)
