"""Whether this process is draining (shutting down gracefully), and who must hear when it starts.

A SIGTERM starts the drain (controlplane/serve.py): from then on the process takes no new call
(controlplane/drain.py answers them 503 "draining", which any client may resend, since nothing was
done), wakes its long-polls so that they answer now instead of holding a caller on a process about
to exit, and closes its WebSockets with 1012 ("service restart", which the console's socket
reconnects after). Long-polling code lives below the edges, so the flag lives in the kernel.
See docs/operations/drain.md.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

log = logging.getLogger(__name__)

_draining = False
_listeners: list[Callable[[], None]] = []


def is_draining() -> bool:
    return _draining


def on_drain(callback: Callable[[], None]) -> None:
    """Call ``callback`` (on the event loop's thread) when the drain starts; at once if it has."""
    _listeners.append(callback)
    if _draining:
        callback()


def begin() -> None:
    """Start draining (idempotent). Called on the event loop's thread."""
    global _draining
    if _draining:
        return
    _draining = True
    for callback in list(_listeners):
        try:
            callback()
        except Exception:  # one listener's failure must not keep the others from hearing
            log.exception("drain listener failed")


def reset_for_tests() -> None:
    global _draining
    _draining = False
    _listeners.clear()
