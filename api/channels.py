"""Notification channels for admins: list, read, create, change, delete, test-send
(notifications/services.py). A bad value is a 422 naming the field; secrets are never answered."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from django.http import HttpRequest
from ninja import Router
from ninja.responses import Status
from pydantic import Field

from api.auth import caller
from api.responses import ERRORS_READ, ERRORS_WRITE, JSON, Out
from api.schemas import Schema
from core.errors import Forbidden, NotFound
from core.roles import may
from notifications import jobs, selectors, services

router = Router(tags=["notification channels"])


class ChannelIn(Schema):
    name: str | None = Field(default=None, max_length=100)
    kind: str | None = Field(default=None, max_length=10)
    enabled: bool | None = None
    url: str | None = Field(default=None, max_length=500)
    recipients: list[str] | None = None
    smtp_host: str | None = Field(default=None, max_length=200)
    smtp_port: int | None = None
    smtp_username: str | None = Field(default=None, max_length=200)
    smtp_use_tls: bool | None = None
    from_email: str | None = Field(default=None, max_length=200)
    secret: str | None = Field(default=None, max_length=500)  # the signing key or SMTP password
    roles: list[str] | None = None
    escalate_after_s: int | None = None
    escalate_to: str | None = Field(default=None, max_length=100)


class ChannelOut(Out):
    id: str
    name: str
    kind: str
    secret: str  # a mask: "set (sha256 ab12cd34…)" or "not set"
    failing: bool
    last_error: str


class ChannelListOut(Out):
    channels: list[ChannelOut]


class TestSendOut(Out):
    sent: bool
    error: str
    channel: JSON


def _admin(request: HttpRequest) -> Any:
    actor = caller(request)
    if actor.is_worker or not may(actor.roles, "manage_channels"):
        raise Forbidden("only an admin may configure notification channels")
    return actor


def _data(body: ChannelIn) -> dict[str, Any]:
    return {k: v for k, v in body.model_dump().items() if v is not None}


@router.get("/channels", response={200: ChannelListOut, **ERRORS_READ})
def list_channels(request: HttpRequest) -> Any:
    _admin(request)
    return {"channels": [services.shown(c) for c in selectors.channels()]}


@router.post("/channels", response={201: ChannelOut, **ERRORS_WRITE})
def create_channel(request: HttpRequest, body: ChannelIn) -> Any:
    channel = services.create_channel(actor=_admin(request), data=_data(body))
    return Status(201, services.shown(channel))


@router.get("/channels/{channel_id}", response={200: ChannelOut, **ERRORS_READ})
def get_channel(request: HttpRequest, channel_id: UUID) -> Any:
    _admin(request)
    channel = selectors.channel(channel_id)
    if channel is None:
        raise NotFound("no such channel", object="channel")
    return services.shown(channel)


@router.patch("/channels/{channel_id}", response={200: ChannelOut, **ERRORS_WRITE})
def change_channel(request: HttpRequest, channel_id: UUID, body: ChannelIn) -> Any:
    channel = services.change_channel(
        actor=_admin(request), channel_id=channel_id, data=_data(body)
    )
    return services.shown(channel)


class DeletedOut(Out):
    deleted: str


@router.delete("/channels/{channel_id}", response={200: DeletedOut, **ERRORS_WRITE})
def delete_channel(request: HttpRequest, channel_id: UUID) -> Any:
    services.delete_channel(actor=_admin(request), channel_id=channel_id)
    return {"deleted": str(channel_id)}


@router.post("/channels/{channel_id}/test", response={200: TestSendOut, **ERRORS_WRITE})
def test_send(request: HttpRequest, channel_id: UUID) -> Any:
    actor = _admin(request)
    if selectors.channel(channel_id) is None:
        raise NotFound("no such channel", object="channel")
    result = jobs.test_send(actor=actor, channel_id=channel_id)
    return result | {"channel": services.shown(selectors.channel(channel_id))}  # type: ignore[arg-type]
