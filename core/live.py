"""Live hints to the console over the channel layer. Hints only: pages re-render from the database.

A service that writes a fact about a run calls :func:`announce` inside its transaction. Nothing is
sent then: the facts of one transaction are collected per run and, after COMMIT, each run gets one
small message ``{"type": "run.changed", "run_id", "facts": [[kind, object_id], ...]}`` on its own
group and on the "runs" group. A rolled-back decision announces nothing. The console's consumers
turn the facts into per-fact fragments (console/consumers.py); nothing is rendered here, so the
protocol's hot path pays one list append per fact and one channel-layer send per transaction.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import transaction

logger = logging.getLogger(__name__)

RUNS_GROUP = "runs"
# Past this many facts in one transaction (a cascade over a tree) a run's hint says "everything":
# facts=None, and the page re-renders whole instead of fact by fact.
MAX_FACTS = 50


def run_group(run_id: Any) -> str:
    return f"run.{run_id}"


Facts = dict[str, list[tuple[str, str]] | None]


def announce(run_id: Any, kind: str, object_id: Any = None) -> None:
    """A fact about a run (``kind``: a history kind, "lease", "job", "intervention", "run"), sent
    after the current transaction commits; at once outside one."""
    conn = transaction.get_connection()
    fact = (kind, "" if object_id is None else str(object_id))
    if not conn.in_atomic_block:
        send_hints({str(run_id): [fact]})
        return
    pending = getattr(conn, "_live_pending", None)
    # The callback list is the truth: after a rollback our callback is gone and a fresh one is due.
    # Facts join a pending hint only at the same savepoint depth, so a savepoint that rolls back
    # takes its own facts with it (and each decision of a test's wrapping transaction gets its own).
    sids = set(conn.savepoint_ids)
    if pending is None or not any(
        cb is pending[1] and ids == sids for ids, cb, _ in conn.run_on_commit
    ):
        facts: Facts = {}

        def send_live_hints() -> None:
            send_hints(facts)

        pending = (facts, send_live_hints)
        conn._live_pending = pending
        transaction.on_commit(send_live_hints)
    facts = pending[0]
    key = str(run_id)
    listed = facts.setdefault(key, [])
    if listed is None:
        return
    if len(listed) >= MAX_FACTS:
        facts[key] = None
    elif fact not in listed:
        listed.append(fact)


def send_hints(facts: Facts) -> None:
    """One message per run, to the run's group and the list's. Never raises."""
    if not facts:
        return
    try:
        from asgiref.sync import async_to_sync
        from channels.layers import get_channel_layer

        layer = get_channel_layer()
        if layer is None:
            return

        async def send_all() -> None:
            for run_id, listed in facts.items():
                message = {
                    "type": "run.changed",
                    "run_id": run_id,
                    "facts": None if listed is None else [list(f) for f in listed],
                }
                await layer.group_send(run_group(run_id), message)
                await layer.group_send(RUNS_GROUP, message)

        async_to_sync(send_all)()
    except Exception:  # a lost hint is harmless; never fail a committed decision over it
        logger.debug("live push failed for runs %s", list(facts), exc_info=True)


def push_run_update(run_id: Any) -> None:
    """Something about the run changed (no particular fact): announce it."""
    announce(run_id, "run")


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
