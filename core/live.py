"""Live hints to the console over the channel layer. Hints only: pages re-render from the database.

A service that writes a fact about a run calls :func:`announce` inside its transaction. Nothing is
sent then: the facts of one transaction are collected per run and, after COMMIT, handed to this
process's sender thread (:func:`send_hints` only merges them into a pending map under a lock). The
thread sends each run one small message ``{"type": "run.changed", "run_id", "facts": [[kind,
object_id], ...]}`` on its own group, and the "runs" group (the run list, the approvals inbox) one
``{"type": "runs.changed", "runs": [[run_id, facts], ...]}`` for the whole batch, coalescing the
hints of every transaction that committed while it was busy. A rolled-back decision announces nothing. So the
protocol's request pays a list append per fact and one dict merge per transaction, never a
channel-layer round trip (bench/live_push.py measured that at about half a protocol call's CPU).
The console's consumers turn the facts into per-fact fragments (console/consumers.py).
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import threading
import time
from typing import Any

from django.db import transaction

logger = logging.getLogger(__name__)

RUNS_GROUP = "runs"
# The "runs" group gets one {"type": "runs.changed", "runs": [[run_id, facts], ...]} per batch, in
# chunks of at most this many runs (a channel-layer message stays small).
RUNS_PER_MESSAGE = 200
# Past this many facts in one transaction (a cascade over a tree) a run's hint says "everything":
# facts=None, and the page re-renders whole instead of fact by fact.
MAX_FACTS = 50
# Runs with a hint waiting for the sender. Past this (the layer is down or stuck) new runs' hints
# are dropped: a lost hint only delays a page until its periodic resync.
MAX_PENDING_RUNS = 10_000
SEND_TIMEOUT_S = 5.0
# Once woken, the sender waits this long so that the hints of transactions committing just now join
# the same batch (one send per run instead of one per transaction); the console adds its own 0.15 s.
GATHER_S = 0.02
# A process with console sockets sends its sockets a heartbeat this often, through the same sender
# thread and channel layer as the hints (on the embedded bus, through the bus file too): a page that
# has not heard one for a few beats says it is not live (static/console/liveness.js).
# settings.LIVE_HEARTBEAT_S overrides it (0: no heartbeat, the in-process tests' default).
HEARTBEAT_S = 1.0
BEAT_GROUP = "live.beat"
# The "runs" group's share of the hints (every console process's list hub hears each of its
# messages) goes out at most this often, gathered over the interval; a run's own group still gets
# its hint at once. At protocol rates, one list message per batch cost the list hubs more than the
# pages they redraw (bench/console.py, 10 open list pages: the effects/s drop).
LIST_EVERY_S = 0.25


def run_group(run_id: Any) -> str:
    return f"run.{run_id}"


# A fleet operation's progress travels the same way, keyed apart from runs (a run id is a bare UUID):
# announce_fleet's hint goes to the operation's group only, as {"type": "fleet.changed"}.
FLEET_PREFIX = "fleet."


def fleet_group(operation_id: Any) -> str:
    return f"{FLEET_PREFIX}{operation_id}"


def announce_fleet(operation_id: Any) -> None:
    """A fleet operation's waves or targets changed: its progress page redraws after COMMIT."""
    announce(fleet_group(operation_id), "fleet")


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


def hints(message: dict[str, Any]) -> list[tuple[Any, Any]]:
    """The (run id, facts) pairs a channel-layer message carries: one for a run's own group
    ("run.changed"), the batch for the "runs" group ("runs.changed"); malformed items skipped."""
    kind = message.get("type")
    if kind == "run.changed":
        return [(message.get("run_id"), message.get("facts"))]
    if kind != "runs.changed":
        return []
    pairs = []
    for item in message.get("runs") or ():
        try:
            run_id, facts = item
        except (TypeError, ValueError):
            continue
        pairs.append((run_id, facts))
    return pairs


def note_facts(pending: dict[str, Any], run_id: str, facts: list | None) -> None:
    """Merge one hint into the pending facts: run id -> {kind: {object ids}}; None = everything."""
    if facts is None or (run_id in pending and pending[run_id] is None):
        pending[run_id] = None
        return
    kinds = pending.setdefault(run_id, {})
    for fact in facts:
        try:
            kind, object_id = fact
        except (TypeError, ValueError):
            continue
        kinds.setdefault(str(kind), set()).add(str(object_id or ""))


def _merge(into: Facts, run_id: str, listed: list[tuple[str, str]] | None) -> None:
    if run_id not in into:
        if len(into) >= MAX_PENDING_RUNS:
            logger.debug("live hint for run %s dropped: %d runs pending", run_id, len(into))
            return
        into[run_id] = []
    have = into[run_id]
    if have is None:
        return
    if listed is None:
        into[run_id] = None
        return
    for fact in listed:
        if fact in have:
            continue
        if len(have) >= MAX_FACTS:
            into[run_id] = None
            return
        have.append(fact)


class _Sender:
    """One daemon thread per process with its own event loop (so a Redis layer keeps its
    connections), fed by a pending map that coalesces hints per run while a send is under way."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)
        self.pending: Facts = {}
        self.busy = False
        self.thread: threading.Thread | None = None
        self.beats = 0.0  # seconds between heartbeats; 0 until this process has console sockets
        self.beat_at = 0.0
        self.listed: Facts = {}  # the list group's share, waiting for its window (LIST_EVERY_S)
        self.listed_at = 0.0

    def start(self) -> None:  # under self.lock
        if self.thread is None:
            self.thread = threading.Thread(target=self.run, name="live-hints", daemon=True)
            self.thread.start()

    def put(self, facts: Facts) -> None:
        with self.lock:
            for run_id, listed in facts.items():
                _merge(self.pending, run_id, listed)
            self.start()
            self.changed.notify_all()

    def beat(self) -> None:
        """From now on this process heartbeats its sockets (called as a socket connects)."""
        if self.beats:
            return
        from django.conf import settings

        every = float(getattr(settings, "LIVE_HEARTBEAT_S", HEARTBEAT_S))
        with self.lock:
            if every > 0 and not self.beats:
                # The first beat one interval from now: the connect's full render is a sign of life.
                self.beats, self.beat_at = every, time.monotonic()
                self.start()
                self.changed.notify_all()

    def _beat_in(self) -> float | None:
        return None if not self.beats else self.beat_at + self.beats - time.monotonic()

    def _list_in(self) -> float | None:
        return None if not self.listed else self.listed_at + LIST_EVERY_S - time.monotonic()

    def _due(self) -> float | None:
        """Seconds until the next timed send (heartbeat, the list's window); None: none due."""
        due = [d for d in (self._beat_in(), self._list_in()) if d is not None]
        return min(due) if due else None

    def run(self) -> None:
        loop = asyncio.new_event_loop()
        while True:
            with self.lock:
                self.busy = False
                self.changed.notify_all()
                while not self.pending and not ((due := self._due()) is not None and due <= 0):
                    self.changed.wait(due)
                self.busy = True
            if self.pending:
                time.sleep(GATHER_S)
            with self.lock:
                batch, self.pending = self.pending, {}
                beat = (due := self._beat_in()) is not None and due <= 0
                if beat:
                    self.beat_at = time.monotonic()
                for run_id, listed in batch.items():
                    if not run_id.startswith(FLEET_PREFIX):
                        _merge(self.listed, run_id, listed)
                to_list: Facts = {}
                if self.listed and time.monotonic() - self.listed_at >= LIST_EVERY_S:
                    to_list, self.listed = self.listed, {}
                    self.listed_at = time.monotonic()
            deliver(batch, loop, beat=beat, listed=to_list)

    def flush(self, timeout: float) -> bool:
        with self.lock:
            return self.changed.wait_for(
                lambda: not self.pending and not self.listed and not self.busy, timeout
            )


_sender = _Sender()


def _after_fork() -> None:  # a forked child (Celery prefork) has no sender thread: start afresh
    global _sender
    _sender = _Sender()


os.register_at_fork(after_in_child=_after_fork)
# A command or worker that exits right after a decision still gets its hints out (briefly: a stuck
# layer must not hold an exit up).
atexit.register(lambda: _sender.flush(1.0))


def send_hints(facts: Facts) -> None:
    """Queue one hint per run for the sender thread; returns at once. Never raises."""
    if facts:
        _sender.put(facts)


def flush(timeout: float = SEND_TIMEOUT_S) -> bool:
    """Wait until every queued hint has been sent (tests, benchmarks, a command about to exit)."""
    return _sender.flush(timeout)


_consumer_loop: asyncio.AbstractEventLoop | None = None


def bind_loop(loop: asyncio.AbstractEventLoop) -> None:
    """The event loop this process's console sockets live on (called as a socket connects). An
    in-memory layer is not thread-safe, so its hints are sent on that loop; a process without a
    socket has nobody to tell."""
    global _consumer_loop
    _consumer_loop = loop
    _sender.beat()


def _layer() -> Any:
    from channels.layers import get_channel_layer

    return get_channel_layer()


def deliver(
    facts: Facts,
    loop: asyncio.AbstractEventLoop | None = None,
    beat: bool = False,
    listed: Facts | None = None,
) -> None:
    """Send one message per run to the run's group, the list's share in one batch, and the
    heartbeat if ``beat``: on ``loop`` (the sender's), or inline as before the sender existed
    (``loop`` None). The list's share is ``listed`` (the sender's window) or, when None, ``facts``
    themselves. Never raises."""
    if listed is None:
        listed = {k: v for k, v in facts.items() if not k.startswith(FLEET_PREFIX)}
    if not facts and not beat and not listed:
        return
    try:
        from channels.layers import InMemoryChannelLayer

        layer = _layer()
        if layer is None:
            return

        async def send_all() -> None:
            if beat:
                await layer.group_send(BEAT_GROUP, {"type": "live.beat", "at": time.time()})
            for run_id, known in facts.items():
                if run_id.startswith(FLEET_PREFIX):
                    await layer.group_send(run_id, {"type": "fleet.changed"})
                    continue
                wire = None if known is None else [list(f) for f in known]
                await layer.group_send(
                    run_group(run_id), {"type": "run.changed", "run_id": run_id, "facts": wire}
                )
            listed_runs = [
                [run_id, None if known is None else [list(f) for f in known]]
                for run_id, known in listed.items()
            ]
            # The list's group gets the whole batch in one message, not one per run: every list
            # hub (one per console process) receives each message, and at protocol rates one per
            # run cost the console processes more than the rows they redraw.
            for at in range(0, len(listed_runs), RUNS_PER_MESSAGE):
                chunk = listed_runs[at : at + RUNS_PER_MESSAGE]
                await layer.group_send(RUNS_GROUP, {"type": "runs.changed", "runs": chunk})

        if loop is None:
            from asgiref.sync import async_to_sync

            async_to_sync(send_all)()
        elif isinstance(layer, InMemoryChannelLayer) and not getattr(layer, "thread_safe", False):
            home = _consumer_loop
            if home is not None and not home.is_closed():
                future = asyncio.run_coroutine_threadsafe(send_all(), home)
                future.result(SEND_TIMEOUT_S)
        else:
            loop.run_until_complete(asyncio.wait_for(send_all(), SEND_TIMEOUT_S))
    except Exception:  # a lost hint is harmless; never fail a committed decision over it
        logger.debug("live push failed for runs %s", list(facts), exc_info=True)


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
