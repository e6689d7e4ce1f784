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
import logging
import os
import sys
import time

from daphne.cli import CommandLineInterface
from daphne.server import Server
from twisted.internet import defer

access_log = logging.getLogger("controlplane.access")
log = logging.getLogger("controlplane.serve")
PROBES = ("/healthz", "/readyz")


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

    def listen_success(self, port):
        self.ports.append(port)
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
        log.info(
            "draining: no new connections, %s requests in flight", gate.in_flight if gate else "?"
        )
        for port in self.ports:
            port.stopListening()
        drain.begin()
        finished = await gate.wait_idle(drain_timeout_s()) if gate else True
        log.info(
            "drained in %.1f s%s",
            time.monotonic() - started,
            ""
            if finished
            else f"; {gate.in_flight if gate else '?'} requests cut off at the bound",
        )


def _gate(application):
    """The DrainGate in front of the application (controlplane/asgi.py), if it is there."""
    from controlplane.drain import DrainGate

    app = getattr(application, "application", application)  # daphne wraps it in an ASGI3 adapter
    return app if isinstance(app, DrainGate) else None


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
