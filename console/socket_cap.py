"""At most WS_MAX_PER_SESSION live sockets per login session, across every ASGI process.

With Redis (REDIS_URL) each session's sockets are members of a sorted set scored by when each was
last seen; a socket refreshes its entry at every session check and removes it on disconnect, and
entries not refreshed for STALE_S (a process that died without saying goodbye) stop counting.
Adding and counting happen in one MULTI, so two sockets opening at once cannot both take the last
place. Without Redis (the embedded demo: one ASGI process) the same bookkeeping lives in memory.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
import weakref

from django.conf import settings

_local: dict[str, dict[str, float]] = {}
_clients: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def stale_s() -> float:
    return 3 * settings.WS_SESSION_CHECK_S + 10


def _key(session_key: str) -> str:
    # The session key is a credential: Redis only ever sees its digest.
    return "controlplane:ws:" + hashlib.sha256(session_key.encode()).hexdigest()[:32]


def _redis():
    if not settings.REDIS_URL:
        return None
    loop = asyncio.get_running_loop()
    client = _clients.get(loop)
    if client is None:
        import redis.asyncio as aioredis

        client = _clients[loop] = aioredis.Redis.from_url(settings.REDIS_URL)
    return client


async def admit(session_key: str, channel: str) -> bool:
    """Count this socket in; False (and not counted) when the session already has its maximum."""
    limit, now, key = settings.WS_MAX_PER_SESSION, time.time(), _key(session_key)
    client = _redis()
    if client is None:
        entries = _local.setdefault(key, {})
        for name, seen in list(entries.items()):
            if seen < now - stale_s():
                del entries[name]
        if len(entries) >= limit:
            return False
        entries[channel] = now
        return True
    async with client.pipeline(transaction=True) as pipe:
        pipe.zremrangebyscore(key, "-inf", now - stale_s())
        pipe.zadd(key, {channel: now})
        pipe.zcard(key)
        pipe.expire(key, int(stale_s()) + 1)
        _, _, count, _ = await pipe.execute()
    if count <= limit:
        return True
    await client.zrem(key, channel)
    return False


async def refresh(session_key: str, channel: str) -> None:
    key, now = _key(session_key), time.time()
    client = _redis()
    if client is None:
        _local.setdefault(key, {})[channel] = now
        return
    async with client.pipeline(transaction=True) as pipe:
        pipe.zadd(key, {channel: now}, xx=True)
        pipe.expire(key, int(stale_s()) + 1)
        await pipe.execute()


async def release(session_key: str, channel: str) -> None:
    key = _key(session_key)
    client = _redis()
    if client is None:
        _local.get(key, {}).pop(channel, None)
        return
    await client.zrem(key, channel)
