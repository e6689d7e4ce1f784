"""The embedded (no REDIS_URL) Celery broker: kombu's SQLAlchemy transport on a SQLite file.

Only stdlib ``sqlite3`` here: settings import this module, and the supervisor tidies the file before it
starts the processes that use it.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path


def embedded_broker_wal(path: Path) -> None:
    """Put the broker file in WAL mode (persistent in the file; a no-op once set), so the worker's
    polling reads and the publishers' writes do not block each other."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with sqlite3.connect(path, timeout=30) as db:
            db.execute("PRAGMA journal_mode=WAL")
        db.close()
    except sqlite3.Error:
        pass  # a busy or read-only file: the transport works without WAL, only with more waiting


def prune_consumed(path: Path) -> int:
    """Delete messages the worker has already taken (kombu marks them invisible and never reads them
    again: an unacknowledged one is re-published as a new row when its channel closes). Returns how
    many rows went. Keeps a long demo's broker file small."""
    if not path.exists():
        return 0
    try:
        with sqlite3.connect(path, timeout=30) as db:
            tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            if "kombu_message" not in tables:
                return 0
            n = db.execute("DELETE FROM kombu_message WHERE visible = 0").rowcount
        db.close()
        return n
    except sqlite3.Error:
        return 0
