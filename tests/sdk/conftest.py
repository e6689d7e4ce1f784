"""A fake control plane for SDK tests: an httpx.MockTransport handler that records every request.

No database, no Django: the SDK only speaks HTTP. Routes answer docs/concepts/worker-protocol.md payloads by default;
a test overrides one with ``server.on(method, path, *responses)`` where each response is a
``(status, json)`` tuple, an exception instance to raise (transport failure), or a callable taking the
recorded request. Queued responses are consumed in order; the last one then repeats.
"""

from __future__ import annotations

import itertools
import json
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from controlplane_sdk import Client, Worker

RUN = "r1"
LEASE = "l1"
TOKEN = 7


@dataclass
class Req:
    method: str
    path: str  # without the /api/v1 prefix
    body: Any
    params: dict[str, str]
    headers: httpx.Headers = field(repr=False)


Response = tuple[int, Any] | BaseException | Callable[[Req], Any]


class FakeServer:
    def __init__(self) -> None:
        self.requests: list[Req] = []
        self._routes: dict[tuple[str, str], list[Response]] = {}
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._seq = itertools.count(1)
        self.ttl_s: float = 30
        self.checkpoint: dict[str, Any] | None = None

    def on(self, method: str, path: str, *responses: Response) -> None:
        self._routes[(method, path)] = list(responses)

    def calls(self, method: str, path: str) -> list[Req]:
        with self._lock:
            return [r for r in self.requests if r.method == method and r.path == path]

    def bodies(self, method: str, path: str) -> list[Any]:
        return [r.body for r in self.calls(method, path)]

    def paths(self) -> list[str]:
        with self._lock:
            return [f"{r.method} {r.path}" for r in self.requests]

    def handler(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path.removeprefix("/api/v1")
        body = json.loads(request.content) if request.content else None
        req = Req(request.method, path, body, dict(request.url.params), request.headers)
        with self._lock:
            self.requests.append(req)
            queue = self._routes.get((request.method, path))
            resp: Response | None = None
            if queue:
                resp = queue.pop(0) if len(queue) > 1 else queue[0]
        if resp is None:
            resp = self.default
        if isinstance(resp, BaseException):
            raise resp
        if callable(resp):
            resp = resp(req)
        status, payload = resp
        if isinstance(payload, str):
            return httpx.Response(status, text=payload)
        return httpx.Response(status, json=payload)

    def default(self, req: Req) -> tuple[int, Any]:
        m, p, b = req.method, req.path, req.body or {}
        if m == "POST" and re.fullmatch(r"/runs/[^/]+/claim", p):
            return 200, {
                "attempt": {"id": "a1", "number": 1},
                "lease": {
                    "id": LEASE,
                    "fencing_token": TOKEN,
                    "expires_at": "2030-01-01T00:00:00Z",
                    "ttl_s": self.ttl_s,
                },
                "checkpoint": self.checkpoint,
                "directive": "continue",
            }
        if m == "POST" and re.fullmatch(r"/leases/[^/]+/heartbeat", p):
            return 200, {
                "directive": "continue",
                "reason": "",
                "expires_at": "2030-01-01T00:00:00Z",
            }
        if m == "POST" and re.fullmatch(r"/runs/[^/]+/effects", p):
            return 201, {
                "id": f"e{next(self._ids)}",
                "decision": "authorized",
                "status": "in_flight",
                "idempotency_key": b.get("idempotency_key"),
            }
        if m == "POST" and (mo := re.fullmatch(r"/effects/([^/]+)/outcome", p)):
            return 200, {
                "id": mo.group(1),
                "status": b.get("status"),
                "late": False,
                "stale_lease": False,
            }
        if m == "POST" and re.fullmatch(r"/runs/[^/]+/checkpoints", p):
            return 201, {"seq": next(self._seq), "step": b.get("step")}
        if m == "POST" and re.fullmatch(r"/runs/[^/]+/events", p):
            return 201, {"appended": len(b.get("events", []))}
        if m == "POST" and re.fullmatch(r"/runs/[^/]+/approvals", p):
            return 201, {"id": "ap1", "status": "pending"}
        if m == "POST" and (mo := re.fullmatch(r"/runs/([^/]+)/finish", p)):
            return 200, {"id": mo.group(1), "state": b.get("outcome")}
        if m == "POST" and re.fullmatch(r"/leases/[^/]+/release", p):
            return 200, {"id": LEASE, "released": True}
        if m == "POST" and p == "/runs":
            return 201, {"id": RUN, "state": "queued"}
        if m == "GET" and p == "/runs":
            return 200, []
        if m == "GET" and (mo := re.fullmatch(r"/runs/([^/]+)", p)):
            return 200, {"id": mo.group(1), "state": "running", "approvals": []}
        if m == "GET" and re.fullmatch(r"/runs/[^/]+/effects", p):
            return 200, []
        return 404, {"error": "not_found", "detail": f"{m} {p}"}


@pytest.fixture
def server() -> FakeServer:
    return FakeServer()


@pytest.fixture
def client(server: FakeServer):
    c = Client(
        "http://cp.test",
        "tok-123",
        timeout=2.0,
        retries=3,
        backoff=0,
        transport=httpx.MockTransport(server.handler),
        sleep=lambda s: None,
    )
    yield c
    c.close()


@pytest.fixture
def worker(client: Client) -> Worker:
    # a long interval keeps the background thread quiet unless a test wants it
    return Worker(client, "worker-7", "purchasing", versions={"code": "1.0"}, heartbeat_interval=60)


@pytest.fixture
def ctx(worker: Worker):
    c = worker.claim(RUN)
    yield c
    c.close()


@pytest.fixture
def no_sdk_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    """A control-plane call sent to a thread (``asyncio.to_thread`` of an SDK function) fails the
    test: the async paths await the native client on the loop. (A framework's own thread hops, such
    as an agent framework running a sync tool function, pass.)"""
    import asyncio

    original = asyncio.to_thread

    def guarded(func, /, *args, **kwargs):
        if str(getattr(func, "__module__", "") or "").startswith("controlplane_sdk"):
            raise AssertionError(
                f"asyncio.to_thread({func.__qualname__}): an SDK call left the loop"
            )
        return original(func, *args, **kwargs)

    monkeypatch.setattr(asyncio, "to_thread", guarded)
