"""Real processes for the deploy tests: a private Redis, the API under controlplane.serve, HAProxy,
and a TCP forwarder that stands for the network path to PostgreSQL (closing it is PostgreSQL
becoming unreachable for the processes behind it, every open connection included)."""

from __future__ import annotations

import shutil
import socket
import sys
import threading
from pathlib import Path

import httpx

from tests.live import Procs, free_port, wait_for


def start_redis(procs: Procs, name: str = "redis", port: int | None = None) -> int:
    """A Redis of the test's own (never the shared 6379/6380): stopping it is a real outage."""
    port = port or free_port()
    _, log = procs.start(
        name,
        [
            shutil.which("redis-server") or "redis-server",
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(procs.tmp),
        ],
        {},
    )
    wait_for(f"{name} to accept connections", lambda: _answers(port), 10, logs=(log,))
    return port


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def start_api(
    procs: Procs,
    env: dict[str, str],
    name: str = "api",
    port: int | None = None,
    cwd: Path | None = None,
) -> tuple[str, Path]:
    """``python -m controlplane.serve`` (daphne with the drain), ready when /healthz answers;
    ``cwd``: the tree of another release (tests/deploy/test_upgrade.py)."""
    port = port or free_port()
    _, log = procs.start(
        name,
        [
            sys.executable,
            "-m",
            "controlplane.serve",
            "-b",
            "127.0.0.1",
            "-p",
            str(port),
            "controlplane.asgi:application",
        ],
        env,
        **({"cwd": cwd} if cwd else {}),
    )
    base = f"http://127.0.0.1:{port}"
    wait_alive(base, name, log, 30)
    return base, log


def wait_alive(base: str, name: str, log: Path, within: float) -> None:
    """Until ``base``/healthz answers 200 (through a proxy: some replica behind it is up)."""

    def up() -> bool:
        try:
            return httpx.get(f"{base}/healthz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    wait_for(f"{name} to serve", up, within, logs=(log,))


class Forwarder:
    """A TCP forwarder on 127.0.0.1:<port> to ``target``. ``cut()`` closes the listener and every
    forwarded connection; ``heal()`` listens again on the same port; ``frozen = True`` drops every
    byte it reads, both ways (a black hole as the ends see it: no answer, no reset)."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target, self.port = target, free_port()
        self.frozen = False
        self._lock = threading.Lock()
        self._conns: list[socket.socket] = []
        self._listener: socket.socket | None = None
        self.heal()

    def heal(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def cut(self) -> None:
        with self._lock:
            listener, self._listener = self._listener, None
            conns, self._conns = self._conns, []
        if listener is not None:
            try:
                listener.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            listener.close()
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            conn.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            # a timeout for the connect only: left on, a connection PostgreSQL was silent on for
            # 5 s (an idle pooled one, or any while frozen) was cut here, which no network does
            upstream.settimeout(None)
            with self._lock:
                if self._listener is not listener:
                    client.close()
                    upstream.close()
                    return
                self._conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=_pipe, args=(a, b, self), daemon=True).start()


def _pipe(src: socket.socket, dst: socket.socket, via: Forwarder | None = None) -> None:
    try:
        while data := src.recv(65536):
            if via is not None and via.frozen:
                continue
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


HAPROXY_CONFIG = """\
global
    maxconn 2000
    # one line per request in the proxy's own log (the test's tmp dir): which replica, how it ended
    log stdout format raw local0
defaults
    mode http
    log global
    option httplog
    timeout connect 2s
    timeout client 90s
    timeout server 90s
    # A replica that refuses a connection, closes one unanswered, or answers 503 (draining: it did
    # nothing) has the request sent again, to the other replica (docs/operations/drain.md).
    retries 3
    option redispatch 1
    retry-on conn-failure empty-response 503
    # One request per connection to a replica (the client's side stays keep-alive): a draining
    # replica closes its idle connections, and a request HAProxy sent on one at that moment would be
    # cut off unanswered, which HAProxy passes on by closing the client's connection, and a client
    # may not resend a POST it cannot know was not done (issue 22's rolling restart failures).
    option http-server-close
frontend api
    bind 127.0.0.1:{port}
    default_backend replicas
backend replicas
    balance roundrobin
    option httpchk GET /readyz
    http-check expect status 200
    # a loaded replica's /readyz can take a second: a short check timeout would flap both out
    timeout check 5s
    default-server inter 1s fall 2 rise 1
{servers}
"""


def start_haproxy(procs: Procs, replicas: list[int], name: str = "haproxy") -> tuple[str, Path]:
    """HAProxy (Debian's) on 127.0.0.1 in front of the replicas' ports, health-checking /readyz."""
    binary = shutil.which("haproxy")
    if binary is None:
        import pytest

        pytest.skip("haproxy is not installed (apt-get install haproxy)")
    port = free_port()
    servers = "\n".join(f"    server r{i} 127.0.0.1:{p} check" for i, p in enumerate(replicas))
    config = procs.tmp / f"{name}.cfg"
    config.write_text(HAPROXY_CONFIG.format(port=port, servers=servers))
    _, log = procs.start(name, [binary, "-db", "-f", str(config)], {})
    base = f"http://127.0.0.1:{port}"
    wait_alive(base, name, log, 15)
    return base, log
