"""The API process: daphne, with a graceful drain on SIGTERM and an access log that follows LOG_FORMAT.

    python -m controlplane.serve -b 0.0.0.0 -p 8000 controlplane.asgi:application

takes every option of the ``daphne`` command. What differs (docs/operations/drain.md):

* SIGTERM (or SIGINT) drains before the process exits: it stops listening, so new connections go to
  another replica; refuses new requests on open connections with a resendable 503; wakes the
  long-polls, which answer at once with a reconnect header; closes WebSockets with 1012; waits for
  the requests in flight to be answered, at most ``DRAIN_TIMEOUT_S`` (default 20 s, below Docker's
  and Kubernetes' 30 s grace); only then does daphne cancel what is left and exit.
* The access log is written through ``logging`` (logger ``controlplane.access``), so under
  ``LOG_FORMAT=json`` it is JSON like every other line; the probes (/healthz, /readyz) are not
  logged, or a load balancer's checks would be most of the log.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import struct
import sys
import termios
import threading
import time
import weakref

from daphne.cli import CommandLineInterface
from daphne.server import Server
from twisted.internet import defer

access_log = logging.getLogger("controlplane.access")
log = logging.getLogger("controlplane.serve")
PROBES = ("/healthz", "/readyz")
WS_SERVICE_RESTART = 1012
HARD_EXIT_AFTER_S = 2.0
FRESH_S = 1.0  # how long the drain leaves a just-accepted connection open for its first request


def drain_timeout_s() -> float:
    return float(os.environ.get("DRAIN_TIMEOUT_S", "20"))


def access_line(protocol: str, action: str, details: dict) -> None:
    """daphne's action logger: one log record per finished request or socket event."""
    if details.get("path") in PROBES:
        return
    client = details.get("client") or "-"
    if protocol == "http" and action == "complete":
        access_log.info(
            '%s "%s %s" %s %s',
            client,
            details["method"],
            details["path"],
            details["status"],
            details.get("size") or "-",
            extra={
                "client": client,
                "method": details["method"],
                "path": details["path"],
                "status": details["status"],
                "size": details.get("size"),
                "duration_ms": round((details.get("time_taken") or 0) * 1000, 1),
            },
        )
    elif protocol == "websocket":
        access_log.info(
            '%s "WS%s %s"',
            client,
            action.upper(),
            details.get("path"),
            extra={"client": client, "websocket": action, "path": details.get("path")},
        )


class DrainingServer(Server):
    def __init__(self, application, *args, **kwargs) -> None:
        if kwargs.get("action_logger") is not None:
            kwargs["action_logger"] = access_line
        super().__init__(application, *args, **kwargs)
        self.ports: list = []
        self.channels: weakref.WeakSet = weakref.WeakSet()
        self.accepted_at: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._tracking = False

    def listen_success(self, port):
        self.ports.append(port)
        if not self._tracking:
            # Remember every HTTP connection, so the drain can close the idle keep-alive ones.
            self._tracking = True
            build = self.http_factory.buildProtocol

            def build_and_track(addr):
                channel = build(addr)
                self.channels.add(channel)
                self.accepted_at[channel] = time.monotonic()
                return channel

            self.http_factory.buildProtocol = build_and_track
        return super().listen_success(port)

    def kill_all_applications(self):
        """daphne's "before shutdown" step: drain first, then cancel what is still running."""
        d = defer.Deferred.fromFuture(asyncio.ensure_future(self.drain()))
        d.addErrback(lambda failure: log.error("drain failed: %s", failure.getErrorMessage()))
        d.addBoth(lambda _: super(DrainingServer, self).kill_all_applications())
        return d

    async def drain(self) -> None:
        from core import drain

        gate = _gate(self.application)
        started = time.monotonic()
        bound = drain_timeout_s()
        log.info(
            "draining: no new connections, %s requests in flight", gate.in_flight if gate else "?"
        )
        # The flag first: whatever is read from now on is refused with a resendable 503.
        drain.begin()
        for port in self.ports:
            # Closing a listening socket resets every connection still in its accept queue, and a
            # proxy has already sent a request on those: it sees the request cut off unanswered
            # (HAProxy's SH, a 502), which nobody may resend. So take them all first; they are
            # answered 503 "draining" like any request that comes now. The queue fills while the
            # event loop is busy (a replica's cold start under load: issue 22's rolling restart).
            _accept_queued(port)
            port.stopListening()
        self.close_websockets()
        finished = await gate.wait_idle(bound) if gate else True
        # Close the connections once each is quiet: no request on it being read or answered, and
        # nothing unread in its socket (a request a proxy sent just before the drain began, which
        # the loop reads next and answers 503; closing on unread bytes would reset it instead).
        # A request a proxy sends on an idle keep-alive connection as it closes meets a closed
        # connection, which the proxy retries elsewhere, not a half-written answer.
        open_ = await self.close_quiet_connections(started + bound)
        log.info(
            "drained in %.1f s%s",
            time.monotonic() - started,
            ""
            if finished and not open_
            else f"; {gate.in_flight if gate else '?'} requests cut off at the bound "
            f"({open_} connections still busy)",
        )
        if not finished:
            # daphne cancels what is left, but a request blocked in a thread (waiting on a row
            # lock, say) cannot be cancelled, and the interpreter joins those threads at exit: the
            # bound would not hold. Its transaction rolls back when its connection closes.
            threading.Timer(HARD_EXIT_AFTER_S, _hard_exit).start()
        await asyncio.sleep(0.2)

    async def close_quiet_connections(self, deadline: float) -> int:
        """Close every HTTP connection as soon as it is quiet, until ``deadline``; how many were
        still busy then (daphne cuts those)."""
        while True:
            busy = 0
            for channel in list(self.channels):
                # twisted's HTTP factory hands out a wrapper around the real channel
                inner = getattr(channel, "_channel", channel)
                transport = getattr(inner, "transport", None)
                if transport is None or getattr(transport, "disconnected", True):
                    continue
                fresh = time.monotonic() - self.accepted_at.get(channel, 0.0) < FRESH_S
                if getattr(inner, "requests", None) or _unread_bytes(transport) or fresh:
                    # A connection accepted a moment ago may not have its request in yet: a proxy
                    # sends it right after the handshake, and closing first cuts it off unanswered
                    # (HAProxy's SD--, seen once in 15 rolling restarts). It is given FRESH_S.
                    busy += 1
                else:
                    transport.loseConnection()
            if not busy or time.monotonic() >= deadline:
                return busy
            await asyncio.sleep(0.05)

    def close_websockets(self) -> None:
        """1012, service restart: the console's socket (htmx ws) reconnects after it, through the
        proxy, to a replica that stays. Sent as a frame: autobahn's sendClose, which the ASGI
        websocket.close goes through, refuses codes below 3000 other than 1000."""
        from daphne.ws_protocol import WebSocketProtocol

        for protocol in list(self.connections):
            if isinstance(protocol, WebSocketProtocol) and protocol.state == protocol.STATE_OPEN:
                protocol.sendCloseFrame(code=WS_SERVICE_RESTART, isReply=False)


def _gate(application):
    """The DrainGate in front of the application (controlplane/asgi.py), if it is there."""
    from controlplane.drain import DrainGate

    app = getattr(application, "application", application)  # daphne wraps it in an ASGI3 adapter
    return app if isinstance(app, DrainGate) else None


def _accept_queued(port) -> None:
    """Accept every connection waiting in ``port``'s listen queue (twisted's accept loop, told to
    go on until the queue is empty rather than stop at its adaptive batch size)."""
    port.numberAccepts = max(getattr(port, "numberAccepts", 1), 100_000)
    try:
        port.doRead()
    except Exception:  # the drain goes on; these connections are what it could not save
        log.exception("accepting the queued connections failed")


def _unread_bytes(transport) -> int:
    """Bytes the kernel holds for this connection that nobody has read yet."""
    try:
        return struct.unpack("i", fcntl.ioctl(transport.fileno(), termios.FIONREAD, b"\0" * 4))[0]
    except (OSError, ValueError):
        return 0


def _hard_exit() -> None:
    log.warning(
        "requests still running %.0f s after the drain bound: exiting now", HARD_EXIT_AFTER_S
    )
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)


class DrainingCommandLine(CommandLineInterface):
    server_class = DrainingServer


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    args = sys.argv[1:]
    if "--access-log" not in args:
        args = ["--access-log", "-", *args]  # an action logger is wanted; ours replaces daphne's
    DrainingCommandLine().run(args)


if __name__ == "__main__":
    main()
