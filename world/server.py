"""The demo world: a stand-alone HTTP service playing the external systems a purchasing agent touches.

Standard library only (``http.server.ThreadingHTTPServer`` + ``sqlite3``): it is its own process with
its own SQLite file, so the control plane can learn about it *only* through this HTTP API -- exactly
like a real payment provider. Run it with ``python -m world --port 8100 --db var/world.sqlite3``.

All bodies are JSON. Errors are ``{"error": code, "detail": text}``; errors produced by an injected
fault also carry ``"injected": true`` (so a caller can tell a chaos-test refusal from a real one).

Idempotency (every mutating call)
---------------------------------
Send the key in the ``Idempotency-Key`` header (preferred) or as ``"idempotency_key"`` in the body
(it is removed from the body before comparison; if both are given they must match). Keys are scoped
per system. Missing key -> 400 ``idempotency_key_required``. The first call under a key stores its
result in the same transaction as the mutation. Later calls with the same key and the same action
and body get that stored result with ``"replayed": true`` and nothing happens again (HTTP 200 for a
stored success; a stored business refusal is replayed with its original 4xx status). The same key
with a different action or body -> 422 ``idempotency_key_reused``. Malformed input (400) and
injected ``reject``/``down`` faults are *not* stored, so the key stays usable.

Systems (``{id}`` below is also returned as a generic ``"id"`` in every mutation result)
-------------------------------------------------------------------------------------------
inventory
  ``GET  /inventory/items``                  -> ``{"items": [{"sku","price","stock"}, ...]}``
  ``GET  /inventory/items/{sku}``            -> ``{"sku","price","stock"}`` | 404 ``unknown_sku``
  ``POST /inventory/reserve``  {sku, qty=1, order?} -> 201 ``{"reservation_id","sku","qty","unit_price",
       "status":"active"}``; stock goes down by qty. 404 ``unknown_sku``, 409 ``insufficient_stock``.
  ``POST /inventory/release``  {reservation_id} -> 200 ``{"reservation_id","status":"released",
       "already_released"}``; stock comes back once (a second release is a no-op, 200). 404
       ``unknown_reservation``.
  ``GET  /inventory/reservations/{id}``      -> the reservation row | 404
shipping
  ``POST /shipping/create_label`` {order, address (string or object)} -> 201 ``{"label_id","tracking",
       "status":"active",...}``
  ``POST /shipping/void_label``   {label_id} -> 200 ``{"status":"voided","already_voided"}`` | 404
       ``unknown_label``
  ``GET  /shipping/labels/{id}``             -> the label row | 404
payments
  ``POST /payments/charge`` {amount, card="4242424242424242", currency="EUR", order?} -> 201
       ``{"charge_id","amount","status":"succeeded",...}``. 402 ``amount_over_limit`` (amount > 5000),
       402 ``card_declined`` (card 4000000000000002).
  ``POST /payments/refund`` {charge_id} -> 200 ``{"refund_id","charge_id","amount","status":"refunded",
       "already_refunded"}`` (full refund, at most once per charge) | 404 ``unknown_charge``
  ``GET  /payments/charges/{id}``            -> the charge row | 404
notifications
  ``POST /notifications/enqueue`` {to, message} -> 201 ``{"notification_id","status":"queued","send_at"}``.
       A queued notification becomes ``sent`` ``--send-delay`` seconds later (default 2; evaluated
       lazily on every call).
  ``POST /notifications/cancel``  {notification_id} -> 200 ``{"status":"cancelled","already_cancelled"}``
       while queued; 409 ``already_sent`` once sent (irreversible); 404 ``unknown_notification``.
  ``GET  /notifications/messages/{id}``      -> the notification row (status queued|sent|cancelled) | 404
every system
  ``GET  /{system}/by-key/{key}`` -> 200 ``{"system","key","action","committed","status_code","result",
       "at"}`` when the key is known (``committed`` false for a stored business refusal), else 404
       ``{"error":"not_found","committed":false}``. Reconciliation uses this. A voided key shows
       ``"action": "void_key"``, ``committed`` false.
  ``POST /{system}/by-key/{key}/void`` -> 200 ``{"voided": true, "already"}`` if nothing happened under
       the key: from now on every call under it is refused 409 ``key_voided`` (never committed); else
       ``{"voided": false, ...by-key answer}``. Reconciliation uses this to make "never seen" final.

Fault injection and test control (``/admin/*``; never faulted, not recorded)
--------------------------------------------------------------------------
  ``POST   /admin/faults`` {system, kind, action?, count?, delay_ms?, status?, error?, drop?} -> 201
       ``{"fault": {...}}``. ``action`` limits the fault to one action (the POST action names above, or
       the read actions ``list_items``, ``get_item``, ``get_reservation``, ``get_label``, ``get_charge``,
       ``get_notification``, ``by_key``); without it the fault hits every call of that system.
       ``count`` = the next N matching calls, omitted/null = persistent. The oldest matching fault wins.
       Kinds: ``down`` -> 503 ``unavailable``, nothing committed; ``reject`` -> ``status`` (default 402
       for payments, else 422) with ``error`` (default ``card_declined`` / ``rejected``), nothing
       committed; ``slow`` -> sleep ``delay_ms`` (default 1000) then proceed normally; ``timeout`` ->
       the call is processed and COMMITS, then the server sleeps ``delay_ms`` (default 10000) before
       answering, or with ``drop: true`` closes the connection without any answer -- the ambiguous case.
  ``GET    /admin/faults`` -> ``{"faults": [...]}``;  ``DELETE /admin/faults[?system=s]`` -> ``{"cleared": n}``
  ``POST   /admin/prices`` {sku, price} / ``POST /admin/stock`` {sku, stock} -> the item | 404 ``unknown_sku``
  ``POST   /admin/items``  {sku, price?, stock?} -> the item, created if missing
  ``POST   /admin/reset``  -> wipe everything (objects, keys, requests, faults) back to the seed items
  ``GET    /admin/requests[?system=&action=&key=&limit=]`` -> ``{"requests": [{id, at, system, action,
       method, path, idempotency_key, body, status, committed, replayed, fault}]}`` -- every system call,
       including refused and faulted ones; ``committed`` means *this* call created a change.
  ``GET    /admin/counts`` -> rows actually created per object type (``total``, per status, ``by_key``,
       ``undo_by_key``, charge amounts) and per-action request totals -- the ground truth for "exactly
       one charge happened".
  ``GET    /health``       -> ``{"ok": true}``
"""

from __future__ import annotations

import json
import logging
import random
import socket
import time
import traceback
from collections.abc import Callable
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from .operations import OPERATIONS, BadRequest, _num, _str
from .store import SYSTEMS, World

log = logging.getLogger("world")

# GET /{system}/{collection}/{id} -> (read action name, table)
READS = {
    ("inventory", "items"): ("get_item", "items"),
    ("inventory", "reservations"): ("get_reservation", "reservations"),
    ("shipping", "labels"): ("get_label", "labels"),
    ("payments", "charges"): ("get_charge", "charges"),
    ("notifications", "messages"): ("get_notification", "notifications"),
}
Result = tuple[int, dict[str, Any], bool, bool]  # status, body, committed now, replayed


class WorldServer(ThreadingHTTPServer):
    daemon_threads = True  # a request sleeping in a timeout fault must not keep the process alive
    request_queue_size = 128  # many agents may call at once; the default backlog of 5 is for toys

    def __init__(
        self,
        address: tuple[str, int],
        world: World,
        verbose: bool = False,
        commit_delay_s: float = 0.0,
    ):
        self.world, self.verbose, self.commit_delay_s = world, verbose, commit_delay_s
        super().__init__(address, Handler)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: WorldServer

    def setup(self) -> None:
        super().setup()
        # Headers and body go out in separate writes; without NODELAY, Nagle + delayed ACK add ~40 ms
        # to every keep-alive request.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, fmt: str, *args: Any) -> None:
        if self.server.verbose:
            super().log_message(fmt, *args)

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_DELETE(self) -> None:
        self._handle("DELETE")

    # -- plumbing -------------------------------------------------------------------------------
    def _send(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the caller gave up (e.g. after a timeout fault): fine

    def _handle(self, method: str) -> None:
        try:
            url = urlsplit(self.path)
            # Split before unquoting so an idempotency key may contain an encoded "/".
            parts = [unquote(p) for p in url.path.split("/") if p]
            query = {k: v[-1] for k, v in parse_qs(url.query).items()}
            try:
                length = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                self.close_connection = True
                return self._send(400, {"error": "invalid_request", "detail": "bad Content-Length"})
            raw = self.rfile.read(length) if length > 0 else b""
            try:
                body = json.loads(raw) if raw.strip() else {}
            except ValueError:
                return self._send(
                    400, {"error": "invalid_json", "detail": "the body is not valid JSON"}
                )
            if not isinstance(body, dict):
                return self._send(
                    400, {"error": "invalid_json", "detail": "the body must be a JSON object"}
                )
            if parts == ["health"]:
                return self._send(200, {"ok": True})
            if parts[:1] == ["admin"]:
                return self._send(*self._admin(method, parts[1:], query, body))
            if len(parts) >= 2 and parts[0] in SYSTEMS:
                return self._system(method, parts, body)
            return self._send(
                404, {"error": "not_found", "detail": f"no route {method} {url.path}"}
            )
        except (
            Exception
        ):  # never let a bug surface as a dropped connection: that would look like a fault
            log.error("world: unhandled error\n%s", traceback.format_exc())
            self._send(500, {"error": "internal", "detail": "unexpected server error"})

    # -- the four systems -------------------------------------------------------------------------
    def _system(self, method: str, parts: list[str], body: dict[str, Any]) -> None:
        world, system = self.server.world, parts[0]
        key: str | None = None
        if method == "POST" and len(parts) == 2 and (system, parts[1]) in OPERATIONS:
            action = parts[1]
            header_key, body_key = (
                self.headers.get("Idempotency-Key"),
                body.pop("idempotency_key", None),
            )
            if header_key and body_key and header_key != body_key:
                return self._refuse(
                    system,
                    action,
                    None,
                    body,
                    400,
                    "invalid_request",
                    "Idempotency-Key header and body idempotency_key differ",
                )
            key = header_key or body_key
            if not isinstance(key, str) or not key.strip() or len(key) > 255:
                return self._refuse(
                    system,
                    action,
                    None,
                    body,
                    400,
                    "idempotency_key_required",
                    "mutating calls need an Idempotency-Key header (1-255 characters)",
                )
            run: Callable[[], Result] = partial(world.mutate, system, action, body, key)
            if self.server.commit_delay_s > 0:
                # A real processor takes a while to commit: the effect stays in flight meanwhile
                # (--commit-delay, jittered 0.5-1.5x; 0 in the tests, which use "slow" faults).
                time.sleep(self.server.commit_delay_s * random.uniform(0.5, 1.5))
        elif method == "GET" and len(parts) == 3 and parts[1] == "by-key":
            action, key = "by_key", parts[2]  # recorded, so a test can see reconciliation asking
            run = lambda: self._by_key(system, parts[2])  # noqa: E731
        elif method == "POST" and len(parts) == 4 and parts[1] == "by-key" and parts[3] == "void":
            action, key = "void_key", parts[2]
            run = lambda: (200, world.void_key(system, parts[2]), False, False)  # noqa: E731
        elif method == "GET" and parts[1:] == ["items"] and system == "inventory":
            action = "list_items"
            run = lambda: (200, {"items": world.items()}, False, False)  # noqa: E731
        elif method == "GET" and len(parts) == 3 and (system, parts[1]) in READS:
            action, table = READS[(system, parts[1])]
            run = lambda: self._read(table, parts[2])  # noqa: E731
        else:
            return self._send(
                404, {"error": "not_found", "detail": f"no route {method} /{'/'.join(parts)}"}
            )

        fault = world.take_fault(system, action) or {}
        kind = fault.get("kind")
        if kind == "down":
            return self._refuse(
                system,
                action,
                key,
                body,
                503,
                "unavailable",
                f"{system} is down (injected fault)",
                fault=kind,
            )
        if kind == "reject":
            return self._refuse(
                system,
                action,
                key,
                body,
                fault["status"],
                fault["error"],
                f"{system} rejected the call (injected fault)",
                fault=kind,
            )
        if kind == "slow":
            time.sleep(fault["delay_ms"] / 1000)
        status, payload, committed, replayed = run()
        world.record(
            method, self.path, system, action, key, body, status, committed, replayed, kind
        )
        if kind == "timeout":
            # Accept-then-time-out: the work above is committed; the caller just never hears of it.
            if fault["drop"]:
                self.close_connection = True
                return
            time.sleep(fault["delay_ms"] / 1000)
        self._send(status, payload)

    def _refuse(
        self,
        system: str,
        action: str,
        key: str | None,
        body: dict[str, Any],
        status: int,
        error: str,
        detail: str,
        fault: str | None = None,
    ) -> None:
        self.server.world.record(
            self.command, self.path, system, action, key, body, status, fault=fault
        )
        payload: dict[str, Any] = {"error": error, "detail": detail}
        if fault:
            payload["injected"] = True
        self._send(status, payload)

    def _by_key(self, system: str, key: str) -> Result:
        found = self.server.world.by_key(system, key)
        if found is None:
            return (
                404,
                {
                    "error": "not_found",
                    "committed": False,
                    "detail": f"{system} never saw key {key!r}",
                },
                False,
                False,
            )
        return 200, found, False, False

    def _read(self, table: str, ident: str) -> Result:
        row = self.server.world.get(table, ident)
        if row is None:
            noun = {
                "items": "sku",
                "reservations": "reservation",
                "labels": "label",
                "charges": "charge",
                "notifications": "notification",
            }[table]
            return 404, {"error": f"unknown_{noun}", "detail": f"no {noun} {ident}"}, False, False
        return 200, row, False, False

    # -- admin ----------------------------------------------------------------------------------
    def _admin(
        self, method: str, parts: list[str], query: dict[str, str], body: dict[str, Any]
    ) -> tuple[int, dict]:
        world = self.server.world
        route = (method, "/".join(parts))
        try:
            if route == ("POST", "faults"):
                return 201, {"fault": world.add_fault(body)}
            if route == ("GET", "faults"):
                return 200, {"faults": world.faults()}
            if route == ("DELETE", "faults"):
                return 200, {"cleared": world.clear_faults(query.get("system"))}
            if route == ("POST", "reset"):
                world.reset()
                return 200, {"ok": True}
            if route == ("GET", "requests"):
                filters = {
                    "system": query.get("system"),
                    "action": query.get("action"),
                    "idempotency_key": query.get("key"),
                }
                limit = int(query.get("limit") or 10000)
                return 200, {"requests": world.requests(filters, limit)}
            if route == ("GET", "counts"):
                return 200, world.counts()
            if route in {("POST", "prices"), ("POST", "stock"), ("POST", "items")}:
                return self._set_item(parts[0], body)
        except BadRequest as exc:
            return 400, {"error": "invalid_request", "detail": str(exc)}
        except ValueError as exc:
            return 400, {"error": "invalid_request", "detail": str(exc)}
        return 404, {"error": "not_found", "detail": f"no admin route {method} /admin/{route[1]}"}

    def _set_item(self, what: str, body: dict[str, Any]) -> tuple[int, dict]:
        sku = _str(body, "sku")
        price = (
            _num(body, "price")
            if what == "prices" or (what == "items" and "price" in body)
            else None
        )
        stock = (
            _num(body, "stock", integer=True)
            if what == "stock" or (what == "items" and "stock" in body)
            else None
        )
        if (price is not None and price < 0) or (stock is not None and stock < 0):
            raise BadRequest("price and stock must be >= 0")
        item = self.server.world.set_item(sku, price, stock, create=what == "items")
        if item is None:
            return 404, {"error": "unknown_sku", "detail": f"no item {sku}"}
        return 200, item


def make_server(
    host: str,
    port: int,
    db_path: str,
    send_delay_s: float = 2.0,
    verbose: bool = False,
    commit_delay_s: float = 0.0,
) -> WorldServer:
    return WorldServer(
        (host, port),
        World(db_path, send_delay_s=send_delay_s),
        verbose=verbose,
        commit_delay_s=commit_delay_s,
    )
