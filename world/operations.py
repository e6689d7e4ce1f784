"""The business rules of the four systems, one function per (system, action).

Each runs inside the caller's transaction (see ``store.World.mutate``) and returns (status, result)
or raises: ``BadRequest`` for malformed input (400, the key is not consumed) and ``Failure`` for a
business refusal (402/404/409, stored under the key so a replay gets the same answer -- the way real
payment APIs behave, and what lets reconciliation report ``failed`` rather than ``not_found``).
Every result carries a generic ``id`` (the object created or acted on) next to the named field.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import time
import uuid
from collections.abc import Callable
from typing import Any, Literal, Protocol, overload


class Books(Protocol):
    """What a business rule works on: the open connection of ``store.World`` (inside its ``mutate``
    transaction) and how long a send takes. A protocol, so this module needs nothing from store.py."""

    conn: sqlite3.Connection
    send_delay_s: float


CHARGE_LIMIT = 5000.0  # payments refuses larger amounts with 402 amount_over_limit
DECLINED_CARD = "4000000000000002"  # like Stripe's test card: always 402 card_declined


class BadRequest(Exception):
    """Malformed input: answered 400 and *not* stored under the key, so a corrected call can reuse it."""


class Failure(Exception):
    """A business refusal (402/404/409): stored under the key, so a replay gets the same answer."""

    def __init__(self, status: int, error: str, detail: str, **extra: Any):
        super().__init__(detail)
        self.status, self.body = status, {"error": error, "detail": detail, **extra}


def _new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:12]}"


def fingerprint(action: str, body: dict[str, Any]) -> str:
    canonical = json.dumps({"action": action, "body": body}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


@overload
def _str(
    body: dict[str, Any], name: str, required: Literal[True] = True, default: str | None = None
) -> str: ...
@overload
def _str(
    body: dict[str, Any], name: str, required: bool, default: str | None = None
) -> str | None: ...
def _str(
    body: dict[str, Any], name: str, required: bool = True, default: str | None = None
) -> str | None:
    value = body.get(name, default)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value.strip():
        raise BadRequest(f"'{name}' must be a non-empty string")
    return value


def _num(body: dict[str, Any], name: str, integer: bool = False, default: Any = None) -> Any:
    value = body.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int if integer else (int, float)):
        raise BadRequest(f"'{name}' must be {'an integer' if integer else 'a number'}")
    return value


# -- business operations: (world, body, key) -> (status, result); raise Failure / BadRequest --------
def _reserve(w: Books, body: dict, key: str) -> tuple[int, dict]:
    sku, qty = _str(body, "sku"), _num(body, "qty", integer=True, default=1)
    if qty < 1:
        raise BadRequest("'qty' must be >= 1")
    item = w.conn.execute("SELECT * FROM items WHERE sku=?", (sku,)).fetchone()
    if item is None:
        raise Failure(404, "unknown_sku", f"no item {sku}")
    if item["stock"] < qty:
        raise Failure(
            409,
            "insufficient_stock",
            f"{sku} has {item['stock']} in stock, {qty} requested",
            stock=item["stock"],
        )
    rid = _new_id("res")
    w.conn.execute("UPDATE items SET stock=stock-? WHERE sku=?", (qty, sku))
    w.conn.execute(
        "INSERT INTO reservations (id, idempotency_key, sku, qty, unit_price, order_id, status, created_at)"
        " VALUES (?, ?, ?, ?, ?, ?, 'active', ?)",
        (rid, key, sku, qty, item["price"], body.get("order"), time.time()),
    )
    return 201, {
        "id": rid,
        "reservation_id": rid,
        "sku": sku,
        "qty": qty,
        "unit_price": item["price"],
        "order": body.get("order"),
        "status": "active",
    }


def _undo(
    w: Books,
    body: dict,
    key: str,
    *,
    table: str,
    field: str,
    noun: str,
    live: str,
    done: str,
    on_undo: Callable[[sqlite3.Row], dict] | None = None,
) -> tuple[int, dict]:
    """Shared shape of release/void/refund/cancel: undoing twice is a no-op answered 200."""
    ident = _str(body, field)
    row = w.conn.execute(f"SELECT * FROM {table} WHERE id=?", (ident,)).fetchone()
    if row is None:
        raise Failure(404, f"unknown_{noun}", f"no {noun} {ident}")
    extra: dict[str, Any] = {}
    if row["status"] == done:
        extra = {f"already_{done}": True, "undo_key": row["undo_key"]}
        if table == "charges":
            extra["refund_id"] = row["refund_id"]
    elif row["status"] != live:
        raise Failure(
            409,
            f"already_{row['status']}",
            f"{noun} {ident} is {row['status']}; it cannot be {done}",
            current=row["status"],
        )
    else:
        extra = {f"already_{done}": False, **(on_undo(row) if on_undo else {})}
        w.conn.execute(
            f"UPDATE {table} SET status=?, undo_key=?, undone_at=? WHERE id=?",
            (done, key, time.time(), ident),
        )
    return 200, {"id": extra.get("refund_id", ident), field: ident, "status": done, **extra}


def _release(w: Books, body: dict, key: str) -> tuple[int, dict]:
    def give_back(row: sqlite3.Row) -> dict:
        w.conn.execute("UPDATE items SET stock=stock+? WHERE sku=?", (row["qty"], row["sku"]))
        return {"sku": row["sku"], "qty": row["qty"]}

    return _undo(
        w,
        body,
        key,
        table="reservations",
        field="reservation_id",
        noun="reservation",
        live="active",
        done="released",
        on_undo=give_back,
    )


def _create_label(w: Books, body: dict, key: str) -> tuple[int, dict]:
    order, address = _str(body, "order"), body.get("address")
    if not address or not isinstance(address, (str, dict)):
        raise BadRequest("'address' must be a non-empty string or object")
    lid = _new_id("lbl")
    w.conn.execute(
        "INSERT INTO labels (id, idempotency_key, order_id, address, status, created_at) "
        "VALUES (?, ?, ?, ?, 'active', ?)",
        (lid, key, order, json.dumps(address), time.time()),
    )
    return 201, {
        "id": lid,
        "label_id": lid,
        "order": order,
        "address": address,
        "status": "active",
        "tracking": f"TRK{lid[4:].upper()}",
    }


def _void_label(w: Books, body: dict, key: str) -> tuple[int, dict]:
    return _undo(
        w, body, key, table="labels", field="label_id", noun="label", live="active", done="voided"
    )


def _charge(w: Books, body: dict, key: str) -> tuple[int, dict]:
    amount = _num(body, "amount")
    card = _str(body, "card", default="4242424242424242")
    currency = _str(body, "currency", default="EUR")
    if amount <= 0:
        raise BadRequest("'amount' must be > 0")
    if amount > CHARGE_LIMIT:
        raise Failure(402, "amount_over_limit", f"amount {amount} exceeds the limit {CHARGE_LIMIT}")
    if card.replace(" ", "") == DECLINED_CARD:
        raise Failure(402, "card_declined", "the card was declined")
    cid = _new_id("ch")
    w.conn.execute(
        "INSERT INTO charges (id, idempotency_key, order_id, amount, currency, card_last4, status, created_at)"
        " VALUES (?, ?, ?, ?, ?, ?, 'succeeded', ?)",
        (cid, key, body.get("order"), amount, currency, card[-4:], time.time()),
    )
    return 201, {
        "id": cid,
        "charge_id": cid,
        "amount": amount,
        "currency": currency,
        "order": body.get("order"),
        "card_last4": card[-4:],
        "status": "succeeded",
    }


def _refund(w: Books, body: dict, key: str) -> tuple[int, dict]:
    def pay_back(row: sqlite3.Row) -> dict:
        refund_id = _new_id("re")
        w.conn.execute("UPDATE charges SET refund_id=? WHERE id=?", (refund_id, row["id"]))
        return {"refund_id": refund_id, "amount": row["amount"]}

    return _undo(
        w,
        body,
        key,
        table="charges",
        field="charge_id",
        noun="charge",
        live="succeeded",
        done="refunded",
        on_undo=pay_back,
    )


def _enqueue(w: Books, body: dict, key: str) -> tuple[int, dict]:
    to, message = _str(body, "to"), _str(body, "message")
    nid, now = _new_id("ntf"), time.time()
    send_at = now + w.send_delay_s
    w.conn.execute(
        "INSERT INTO notifications (id, idempotency_key, to_addr, message, status, created_at, send_at)"
        " VALUES (?, ?, ?, ?, 'queued', ?, ?)",
        (nid, key, to, message, now, send_at),
    )
    return 201, {
        "id": nid,
        "notification_id": nid,
        "to": to,
        "status": "queued",
        "send_at": send_at,
    }


def _cancel(w: Books, body: dict, key: str) -> tuple[int, dict]:
    # A sent notification cannot be recalled: _undo answers 409 already_sent (stored under the key).
    return _undo(
        w,
        body,
        key,
        table="notifications",
        field="notification_id",
        noun="notification",
        live="queued",
        done="cancelled",
    )


OPERATIONS: dict[tuple[str, str], Callable[[Books, dict, str], tuple[int, dict]]] = {
    ("inventory", "reserve"): _reserve,
    ("inventory", "release"): _release,
    ("shipping", "create_label"): _create_label,
    ("shipping", "void_label"): _void_label,
    ("payments", "charge"): _charge,
    ("payments", "refund"): _refund,
    ("notifications", "enqueue"): _enqueue,
    ("notifications", "cancel"): _cancel,
}
