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
