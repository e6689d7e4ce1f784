"""Live hints to the console over the channel layer. Hints only: pages re-render from the database."""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger(__name__)


def run_group(run_id: Any) -> str:
    return f"run.{run_id}"


RUNS_GROUP = "runs"


def push_run_update(run_id: Any) -> None:
    try:
        from asgiref.sync import async_to_sync
        from channels.layers import get_channel_layer

        layer = get_channel_layer()
        if layer is None:
            return
        message = {"type": "run.changed", "run_id": str(run_id)}
        async_to_sync(layer.group_send)(run_group(run_id), message)
        async_to_sync(layer.group_send)(RUNS_GROUP, message)
    except Exception:  # a lost hint is harmless; never fail a committed decision over it
        logger.debug("live push failed for run %s", run_id, exc_info=True)


def user_group(user_id: Any) -> str:
    """Every live socket of one user: told to re-check its session (logout, deactivation, roles)."""
    return f"user.{user_id}"


def push_session_check(user_id: Any) -> None:
    """Ask the user's open sockets to re-check their session now. A hint: each socket also re-checks
    on its own every WS_SESSION_CHECK_S seconds, so a lost message only delays the close."""
    try:
        from asgiref.sync import async_to_sync
        from channels.layers import get_channel_layer

        layer = get_channel_layer()
        if layer is not None:
            async_to_sync(layer.group_send)(user_group(user_id), {"type": "session.check"})
    except Exception:
        logger.debug("session check push failed for user %s", user_id, exc_info=True)
