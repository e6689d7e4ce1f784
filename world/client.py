"""A small typed httpx client for the demo world (see ``world.server`` for the API).

Errors are split by what they mean for an effect's outcome, which is the whole point of the demo:

- :class:`WorldError` -- the world answered with a refusal (4xx; ``status``, ``error``, ``body``).
  Nothing was committed by this call: the effect *failed*. (``injected`` says it came from a fault.)
- :class:`WorldUnavailable` -- the world could not be reached, or answered 503/5xx. The request was
  not processed (connection refused / ``down`` fault): also *failed*, safe to retry with the same key.
- :class:`WorldTimeout` (a ``WorldUnavailable``) -- the request was sent but no answer came back (read
  timeout, connection dropped mid-call). It MAY have committed: the effect's outcome is *unknown*
  until ``by_key`` reconciles it. ``exc.ambiguous`` is True only for this one.

Every mutating method takes the ``idempotency_key`` to send as the ``Idempotency-Key`` header: agents
pass their effect's key, compensators the compensation's key.
"""

from __future__ import annotations

from typing import Any, Self
from urllib.parse import quote

import httpx

DEFAULT_URL = "http://127.0.0.1:8100"
Json = dict[str, Any]


class WorldClientError(Exception):
    ambiguous = False  # True when the call may have committed without us hearing about it


class WorldError(WorldClientError):
    def __init__(self, status: int, body: Json):
        self.status, self.body = status, body
        self.error: str = body.get("error", "error")
        self.injected: bool = bool(body.get("injected"))
        super().__init__(f"world answered {status} {self.error}: {body.get('detail', '')}")


class WorldUnavailable(WorldClientError):
    def __init__(self, message: str, status: int | None = None, body: Json | None = None):
        self.status, self.body = status, body or {}
        super().__init__(message)


class WorldTimeout(WorldUnavailable):
    ambiguous = True


class WorldClient:
    def __init__(
        self,
        base_url: str = DEFAULT_URL,
        timeout: float = 5.0,
        transport: httpx.BaseTransport | None = None,
    ):
        self.base_url = base_url.rstrip("/")
        self._http = httpx.Client(base_url=self.base_url, timeout=timeout, transport=transport)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- transport ------------------------------------------------------------------------------
    def _call(
        self,
        method: str,
        path: str,
        json: Json | None = None,
        key: str | None = None,
        params: Json | None = None,
    ) -> Json:
        headers = {"Idempotency-Key": key} if key is not None else None
        try:
            resp = self._http.request(method, path, json=json, headers=headers, params=params)
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
            # Never reached the server: nothing can have committed.
            raise WorldUnavailable(f"world unreachable at {self.base_url}: {exc!r}") from exc
        except (
            httpx.TimeoutException,
            httpx.RemoteProtocolError,
            httpx.ReadError,
            httpx.WriteError,
        ) as exc:
            # Sent (at least partly) and no answer: the call may or may not have committed.
            raise WorldTimeout(f"no answer from the world for {method} {path}: {exc!r}") from exc
        except httpx.TransportError as exc:
            raise WorldTimeout(f"transport error for {method} {path}: {exc!r}") from exc
        try:
            body = resp.json()
        except ValueError:
            body = {"error": "invalid_response", "detail": resp.text[:200]}
        if resp.status_code >= 500:
            raise WorldUnavailable(
                f"world answered {resp.status_code}: {body.get('detail', '')}",
                status=resp.status_code,
                body=body,
            )
        if resp.status_code >= 400:
            raise WorldError(resp.status_code, body)
        return body

    def perform(self, system: str, action: str, args: Json, idempotency_key: str) -> Json:
        """Generic mutation: ``POST /{system}/{action}`` -- handy for dispatching a declared effect."""
        return self._call("POST", f"/{system}/{action}", json=args, key=idempotency_key)

    # -- inventory ------------------------------------------------------------------------------
    def get_item(self, sku: str) -> Json:
        return self._call("GET", f"/inventory/items/{quote(sku, safe='')}")

    def list_items(self) -> list[Json]:
        return self._call("GET", "/inventory/items")["items"]

    def reserve(self, sku: str, qty: int, idempotency_key: str, order: str | None = None) -> Json:
        args: Json = {"sku": sku, "qty": qty}
        if order is not None:
            args["order"] = order
        return self.perform("inventory", "reserve", args, idempotency_key)

    def release(self, reservation_id: str, idempotency_key: str) -> Json:
        return self.perform(
            "inventory", "release", {"reservation_id": reservation_id}, idempotency_key
        )

    # -- shipping -------------------------------------------------------------------------------
    def create_label(self, order: str, address: str | Json, idempotency_key: str) -> Json:
        return self.perform(
            "shipping", "create_label", {"order": order, "address": address}, idempotency_key
        )

    def void_label(self, label_id: str, idempotency_key: str) -> Json:
        return self.perform("shipping", "void_label", {"label_id": label_id}, idempotency_key)

    # -- payments -------------------------------------------------------------------------------
    def charge(
        self,
        amount: float,
        idempotency_key: str,
        card: str | None = None,
        order: str | None = None,
        currency: str | None = None,
    ) -> Json:
        args: Json = {"amount": amount}
        for name, value in (("card", card), ("order", order), ("currency", currency)):
            if value is not None:
                args[name] = value
        return self.perform("payments", "charge", args, idempotency_key)

    def refund(self, charge_id: str, idempotency_key: str) -> Json:
        return self.perform("payments", "refund", {"charge_id": charge_id}, idempotency_key)

    # -- notifications --------------------------------------------------------------------------
    def enqueue_notification(self, to: str, message: str, idempotency_key: str) -> Json:
        return self.perform(
            "notifications", "enqueue", {"to": to, "message": message}, idempotency_key
        )

    def cancel_notification(self, notification_id: str, idempotency_key: str) -> Json:
        return self.perform(
            "notifications", "cancel", {"notification_id": notification_id}, idempotency_key
        )

    def get_notification(self, notification_id: str) -> Json:
        return self._call("GET", f"/notifications/messages/{quote(notification_id, safe='')}")

    # -- reconciliation -------------------------------------------------------------------------
    def by_key(self, system: str, key: str) -> Json:
        """What the system recorded under ``key``; ``{"committed": False, "found": False}`` if never seen."""
        try:
            return {"found": True, **self._call("GET", f"/{system}/by-key/{quote(key, safe='')}")}
        except WorldError as exc:
            if exc.status == 404 and exc.error == "not_found":
                return {"found": False, "committed": False, "system": system, "key": key}
            raise

    def void_key(self, system: str, key: str) -> Json:
        """``POST /{system}/by-key/{key}/void``: nothing will ever commit under ``key`` (unless it had)."""
        return self._call("POST", f"/{system}/by-key/{quote(key, safe='')}/void")

    # -- admin ----------------------------------------------------------------------------------
    def set_fault(
        self,
        system: str,
        kind: str,
        action: str | None = None,
        count: int | None = None,
        delay_ms: int | None = None,
        status: int | None = None,
        error: str | None = None,
        drop: bool = False,
    ) -> Json:
        spec: Json = {
            "system": system,
            "kind": kind,
            "action": action,
            "count": count,
            "drop": drop,
        }
        for name, value in (("delay_ms", delay_ms), ("status", status), ("error", error)):
            if value is not None:
                spec[name] = value
        return self._call("POST", "/admin/faults", json=spec)["fault"]

    def faults(self) -> list[Json]:
        return self._call("GET", "/admin/faults")["faults"]

    def clear_faults(self, system: str | None = None) -> int:
        return self._call("DELETE", "/admin/faults", params={"system": system} if system else None)[
            "cleared"
        ]

    def set_price(self, sku: str, price: float) -> Json:
        return self._call("POST", "/admin/prices", json={"sku": sku, "price": price})

    def set_stock(self, sku: str, stock: int) -> Json:
        return self._call("POST", "/admin/stock", json={"sku": sku, "stock": stock})

    def put_item(self, sku: str, price: float | None = None, stock: int | None = None) -> Json:
        body: Json = {"sku": sku}
        if price is not None:
            body["price"] = price
        if stock is not None:
            body["stock"] = stock
        return self._call("POST", "/admin/items", json=body)

    def reset(self) -> None:
        self._call("POST", "/admin/reset")

    def requests(
        self,
        system: str | None = None,
        action: str | None = None,
        key: str | None = None,
        limit: int | None = None,
    ) -> list[Json]:
        params = {
            k: v
            for k, v in (("system", system), ("action", action), ("key", key), ("limit", limit))
            if v
        }
        return self._call("GET", "/admin/requests", params=params)["requests"]

    def counts(self) -> Json:
        return self._call("GET", "/admin/counts")

    def health(self) -> bool:
        try:
            return bool(self._call("GET", "/health").get("ok"))
        except WorldClientError:
            return False
