"""The demo world's durable state: one SQLite file, one lock, one transaction per call.

Every call runs under ``World.lock`` inside one ``BEGIN IMMEDIATE`` transaction, so the
idempotency check, the business mutation and the stored result commit together or not at all -- a
crash can never leave a charge without its key record, which is exactly the guarantee reconciliation
relies on. Injected sleeps (slow/timeout faults) happen *outside* the lock in the HTTP layer, so a
hung request never blocks the rest of the world.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from typing import Any

from .operations import OPERATIONS, BadRequest, Failure, _num, fingerprint

SYSTEMS = ("inventory", "shipping", "payments", "notifications")
SEED_ITEMS = [
    ("sku-1", 12.50, 100),
    ("sku-2", 30.00, 20),
    ("sku-3", 7.25, 5),
    ("sku-4", 99.99, 1),
    ("sku-5", 3.10, 0),
]
FAULT_KINDS = ("timeout", "reject", "slow", "down")
VOID_ACTION = "void_key"  # the idempotency row of a voided key (never a real action name)

SCHEMA = """
CREATE TABLE IF NOT EXISTS items (sku TEXT PRIMARY KEY, price REAL NOT NULL, stock INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS reservations (id TEXT PRIMARY KEY, idempotency_key TEXT, sku TEXT, qty INTEGER,
  unit_price REAL, order_id TEXT, status TEXT, created_at REAL, undo_key TEXT, undone_at REAL);
CREATE TABLE IF NOT EXISTS labels (id TEXT PRIMARY KEY, idempotency_key TEXT, order_id TEXT, address TEXT,
  status TEXT, created_at REAL, undo_key TEXT, undone_at REAL);
CREATE TABLE IF NOT EXISTS charges (id TEXT PRIMARY KEY, idempotency_key TEXT, order_id TEXT, amount REAL,
  currency TEXT, card_last4 TEXT, status TEXT, refund_id TEXT, created_at REAL, undo_key TEXT, undone_at REAL);
CREATE TABLE IF NOT EXISTS notifications (id TEXT PRIMARY KEY, idempotency_key TEXT, to_addr TEXT, message TEXT,
  status TEXT, created_at REAL, send_at REAL, sent_at REAL, undo_key TEXT, undone_at REAL);
CREATE TABLE IF NOT EXISTS idempotency (system TEXT, key TEXT, action TEXT, fingerprint TEXT, status_code INTEGER,
  committed INTEGER, result TEXT, created_at REAL, PRIMARY KEY (system, key));
CREATE TABLE IF NOT EXISTS requests (id INTEGER PRIMARY KEY AUTOINCREMENT, at REAL, system TEXT, action TEXT,
  method TEXT, path TEXT, idempotency_key TEXT, body TEXT, status INTEGER, committed INTEGER, replayed INTEGER,
  fault TEXT);
CREATE TABLE IF NOT EXISTS faults (id INTEGER PRIMARY KEY AUTOINCREMENT, system TEXT, action TEXT, kind TEXT,
  remaining INTEGER, delay_ms INTEGER, status INTEGER, error TEXT, drop_conn INTEGER, created_at REAL);
"""
TABLES = (
    "items",
    "reservations",
    "labels",
    "charges",
    "notifications",
    "idempotency",
    "requests",
    "faults",
)


class World:
    def __init__(self, path: str, send_delay_s: float = 2.0):
        self.lock = threading.RLock()
        self.send_delay_s = send_delay_s
        # One shared connection guarded by the lock: simpler than per-thread connections and the
        # world is tiny; WAL keeps commits cheap and durable across a process kill.
        self.conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self.conn.row_factory = sqlite3.Row
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=NORMAL")
        self.conn.executescript(SCHEMA)
        with self.lock, self._tx():
            if self.conn.execute("SELECT COUNT(*) FROM items").fetchone()[0] == 0:
                self._seed()

    # -- plumbing -------------------------------------------------------------------------------
    def _tx(self):
        conn = self.conn

        class _Tx:  # explicit BEGIN IMMEDIATE: sqlite3's implicit transactions skip SELECT-only work
            def __enter__(self_inner):
                conn.execute("BEGIN IMMEDIATE")

            def __exit__(self_inner, exc_type, *_):
                conn.execute("COMMIT" if exc_type is None else "ROLLBACK")
                return False

        return _Tx()

    def _seed(self) -> None:
        self.conn.executemany("INSERT INTO items VALUES (?, ?, ?)", SEED_ITEMS)

    def _tick(self) -> None:
        # Notifications go out lazily: whatever is due is marked sent before any call looks at it.
        now = time.time()
        self.conn.execute(
            "UPDATE notifications SET status='sent', sent_at=send_at WHERE status='queued' AND send_at<=?",
            (now,),
        )

    def reset(self) -> None:
        with self.lock, self._tx():
            for table in TABLES:
                self.conn.execute(f"DELETE FROM {table}")
            self._seed()

    def close(self) -> None:
        with self.lock:
            self.conn.close()

    # -- mutations ------------------------------------------------------------------------------
    def mutate(
        self, system: str, action: str, body: dict[str, Any], key: str
    ) -> tuple[int, dict, bool, bool]:
        """Run one idempotent mutation. Returns (status, response body, committed_now, replayed)."""
        op = OPERATIONS.get((system, action))
        if op is None:
            return (
                404,
                {"error": "not_found", "detail": f"no action {system}/{action}"},
                False,
                False,
            )
        fp = fingerprint(action, body)
        with self.lock, self._tx():
            self._tick()
            row = self.conn.execute(
                "SELECT * FROM idempotency WHERE system=? AND key=?", (system, key)
            ).fetchone()
            if row is not None and row["action"] == VOID_ACTION:
                detail = f"key {key!r} was voided in {system}: nothing will ever commit under it"
                return 409, {"error": "key_voided", "detail": detail}, False, False
            if row is not None:
                if row["fingerprint"] != fp:
                    return (
                        422,
                        {
                            "error": "idempotency_key_reused",
                            "detail": f"key {key!r} was already used in {system} for a different request "
                            f"(original action {row['action']!r})",
                        },
                        False,
                        False,
                    )
                result = json.loads(row["result"])
                # A replayed success is a plain 200; a replayed refusal keeps its status so the caller
                # sees the same business error it saw the first time.
                status = 200 if row["committed"] else row["status_code"]
                return status, {**result, "replayed": True}, False, True
            try:
                status, result = op(self, body, key)
            except BadRequest as exc:
                return 400, {"error": "invalid_request", "detail": str(exc)}, False, False
            except Failure as exc:
                status, result = exc.status, exc.body
            committed = status < 300
            result = {**result, "idempotency_key": key}
            self.conn.execute(
                "INSERT INTO idempotency VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (system, key, action, fp, status, int(committed), json.dumps(result), time.time()),
            )
            return status, {**result, "replayed": False}, committed, False

    def void_key(self, system: str, key: str) -> dict[str, Any]:
        """Make ``key`` unusable for good unless something already happened under it: a tombstone in
        the idempotency table, written under the same lock as every mutation, so a call racing the
        void either committed first (and the answer says so) or is refused with ``key_voided``."""
        with self.lock, self._tx():
            row = self.conn.execute(
                "SELECT * FROM idempotency WHERE system=? AND key=?", (system, key)
            ).fetchone()
            if row is None:
                tombstone = {"error": "key_voided", "idempotency_key": key}
                self.conn.execute(
                    "INSERT INTO idempotency VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (system, key, VOID_ACTION, "", 409, 0, json.dumps(tombstone), time.time()),
                )
                return {"system": system, "key": key, "voided": True, "already": False}
            if row["action"] == VOID_ACTION:
                return {"system": system, "key": key, "voided": True, "already": True}
        return {"voided": False, **(self.by_key(system, key) or {})}

    def by_key(self, system: str, key: str) -> dict[str, Any] | None:
        with self.lock:
            row = self.conn.execute(
                "SELECT * FROM idempotency WHERE system=? AND key=?", (system, key)
            ).fetchone()
        if row is None:
            return None
        return {
            "system": system,
            "key": key,
            "action": row["action"],
            "committed": bool(row["committed"]),
            "status_code": row["status_code"],
            "result": json.loads(row["result"]),
            "at": row["created_at"],
        }

    # -- reads ----------------------------------------------------------------------------------
    def get(self, table: str, ident: str) -> dict[str, Any] | None:
        with self.lock, self._tx():
            self._tick()
            column = "sku" if table == "items" else "id"
            row = self.conn.execute(f"SELECT * FROM {table} WHERE {column}=?", (ident,)).fetchone()
        if row is None:
            return None
        out = dict(row)
        if table == "labels":
            out["address"] = json.loads(out["address"])
        return out

    def items(self) -> list[dict[str, Any]]:
        with self.lock:
            return [dict(r) for r in self.conn.execute("SELECT * FROM items ORDER BY sku")]

    # -- admin ----------------------------------------------------------------------------------
    def set_item(
        self, sku: str, price: float | None, stock: int | None, create: bool
    ) -> dict[str, Any] | None:
        with self.lock, self._tx():
            exists = self.conn.execute("SELECT 1 FROM items WHERE sku=?", (sku,)).fetchone()
            if not exists:
                if not create:
                    return None
                self.conn.execute(
                    "INSERT INTO items VALUES (?, ?, ?)", (sku, price or 0.0, stock or 0)
                )
            if price is not None:
                self.conn.execute("UPDATE items SET price=? WHERE sku=?", (price, sku))
            if stock is not None:
                self.conn.execute("UPDATE items SET stock=? WHERE sku=?", (stock, sku))
            return dict(self.conn.execute("SELECT * FROM items WHERE sku=?", (sku,)).fetchone())

    def add_fault(self, spec: dict[str, Any]) -> dict[str, Any]:
        system, kind = spec.get("system"), spec.get("kind")
        if system not in SYSTEMS:
            raise BadRequest(f"'system' must be one of {', '.join(SYSTEMS)}")
        if kind not in FAULT_KINDS:
            raise BadRequest(f"'kind' must be one of {', '.join(FAULT_KINDS)}")
        action = spec.get("action")
        count = spec.get("count")
        if count is not None and (
            not isinstance(count, int) or isinstance(count, bool) or count < 1
        ):
            raise BadRequest("'count' must be a positive integer or null (persistent)")
        delay_ms = _num(
            spec, "delay_ms", integer=True, default=10000 if kind == "timeout" else 1000
        )
        status = _num(spec, "status", integer=True, default=402 if system == "payments" else 422)
        if kind == "reject" and not 400 <= status <= 499:
            raise BadRequest("'status' of a reject must be a 4xx code")
        error = spec.get("error") or ("card_declined" if system == "payments" else "rejected")
        with self.lock, self._tx():
            cur = self.conn.execute(
                "INSERT INTO faults (system, action, kind, remaining, delay_ms, status, error, drop_conn, created_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    system,
                    action,
                    kind,
                    count,
                    delay_ms,
                    status,
                    error,
                    int(bool(spec.get("drop"))),
                    time.time(),
                ),
            )
            return self._fault_dict(
                self.conn.execute("SELECT * FROM faults WHERE id=?", (cur.lastrowid,)).fetchone()
            )

    @staticmethod
    def _fault_dict(row: sqlite3.Row) -> dict[str, Any]:
        out = dict(row)
        out["drop"] = bool(out.pop("drop_conn"))
        out["persistent"] = out["remaining"] is None
        return out

    def faults(self) -> list[dict[str, Any]]:
        with self.lock:
            return [
                self._fault_dict(r) for r in self.conn.execute("SELECT * FROM faults ORDER BY id")
            ]

    def clear_faults(self, system: str | None = None) -> int:
        with self.lock, self._tx():
            if system:
                return self.conn.execute("DELETE FROM faults WHERE system=?", (system,)).rowcount
            return self.conn.execute("DELETE FROM faults").rowcount

    def take_fault(self, system: str, action: str) -> dict[str, Any] | None:
        """The oldest fault matching this call, consuming one use of a counted fault."""
        with self.lock, self._tx():
            row = self.conn.execute(
                "SELECT * FROM faults WHERE system=? AND (action IS NULL OR action=?) ORDER BY id LIMIT 1",
                (system, action),
            ).fetchone()
            if row is None:
                return None
            if row["remaining"] is not None:
                if row["remaining"] <= 1:
                    self.conn.execute("DELETE FROM faults WHERE id=?", (row["id"],))
                else:
                    self.conn.execute(
                        "UPDATE faults SET remaining=remaining-1 WHERE id=?", (row["id"],)
                    )
            return self._fault_dict(row)

    def record(
        self,
        method: str,
        path: str,
        system: str,
        action: str,
        key: str | None,
        body: Any,
        status: int,
        committed: bool = False,
        replayed: bool = False,
        fault: str | None = None,
    ) -> None:
        with self.lock, self._tx():
            self.conn.execute(
                "INSERT INTO requests (at, system, action, method, path, idempotency_key, body, status, committed,"
                " replayed, fault) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    time.time(),
                    system,
                    action,
                    method,
                    path,
                    key,
                    json.dumps(body),
                    status,
                    int(committed),
                    int(replayed),
                    fault,
                ),
            )

    def requests(self, filters: dict[str, str | None], limit: int) -> list[dict[str, Any]]:
        where, params = [], []
        for column in ("system", "action", "idempotency_key"):
            if filters.get(column):
                where.append(f"{column}=?")
                params.append(filters[column])
        sql = (
            "SELECT * FROM requests"
            + (" WHERE " + " AND ".join(where) if where else "")
            + " ORDER BY id LIMIT ?"
        )
        with self.lock:
            rows = self.conn.execute(sql, (*params, limit)).fetchall()
        out = []
        for r in rows:
            d = dict(r)
            d["body"], d["committed"], d["replayed"] = (
                json.loads(d["body"]),
                bool(d["committed"]),
                bool(d["replayed"]),
            )
            out.append(d)
        return out

    def counts(self) -> dict[str, Any]:
        """Ground truth for tests: rows actually created, grouped so double effects are visible."""
        q = self.conn.execute

        def per(table: str, states: tuple[str, ...]) -> dict[str, Any]:
            out: dict[str, Any] = {"total": q(f"SELECT COUNT(*) FROM {table}").fetchone()[0]}
            for state in states:
                out[state] = q(f"SELECT COUNT(*) FROM {table} WHERE status=?", (state,)).fetchone()[
                    0
                ]
            out["by_key"] = dict(
                q(f"SELECT idempotency_key, COUNT(*) FROM {table} GROUP BY idempotency_key")
            )
            out["undo_by_key"] = dict(
                q(
                    f"SELECT undo_key, COUNT(*) FROM {table} WHERE undo_key IS NOT NULL GROUP BY undo_key"
                )
            )
            return out

        with self.lock, self._tx():
            self._tick()
            charges = per("charges", ("succeeded", "refunded"))
            charges["amount_charged"] = q(
                "SELECT COALESCE(SUM(amount), 0) FROM charges"
            ).fetchone()[0]
            charges["amount_refunded"] = q(
                "SELECT COALESCE(SUM(amount), 0) FROM charges WHERE status='refunded'"
            ).fetchone()[0]
            actions = {
                f"{s}:{a}": {"total": t, "committed": c or 0, "replayed": r or 0}
                for s, a, t, c, r in q(
                    "SELECT system, action, COUNT(*), SUM(committed), SUM(replayed) FROM "
                    "requests GROUP BY system, action"
                )
            }
            return {
                "charges": charges,
                "reservations": per("reservations", ("active", "released")),
                "labels": per("labels", ("active", "voided")),
                "notifications": per("notifications", ("queued", "sent", "cancelled")),
                "requests": {
                    "total": sum(v["total"] for v in actions.values()),
                    "by_action": actions,
                },
            }
