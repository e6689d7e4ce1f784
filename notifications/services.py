"""The only writer of channels: create, change, delete, each one transaction with its audit row.
Input is checked here too (the API and the console form both call these), and a bad value raises
``Invalid`` naming the field."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from django.db import transaction
from django.utils import timezone

from audit.services import record_audit
from core.actors import Actor
from core.errors import Conflict, Invalid, NotFound
from notifications import secrets
from notifications.models import Channel

FIELDS = (
    "name",
    "kind",
    "enabled",
    "url",
    "recipients",
    "smtp_host",
    "smtp_port",
    "smtp_username",
    "smtp_use_tls",
    "from_email",
    "roles",
    "escalate_after_s",
    "escalate_to",
)


def _check_url(url: str) -> str:
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise Invalid("url must be an http:// or https:// URL", field="url")
    return url.strip()


def _as_list(value: Any, field: str) -> list[str]:
    if isinstance(value, str):
        value = [v.strip() for v in value.split(",")]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise Invalid(f"{field} must be a list of names", field=field)
    return [v for v in value if v]


def _clean(data: dict[str, Any], channel: Channel) -> dict[str, Any]:
    """The fields to write, checked against the kind the channel will have."""
    unknown = set(data) - set(FIELDS) - {"secret"}
    if unknown:
        field = sorted(unknown)[0]
        raise Invalid(f"{field} is not a channel field", field=field)
    out: dict[str, Any] = {k: v for k, v in data.items() if k in FIELDS}
    kind = out.get("kind", channel.kind)
    if kind not in Channel.KINDS:
        raise Invalid(f"kind must be one of {', '.join(Channel.KINDS)}", field="kind")
    name = str(out.get("name", channel.name) or "").strip()
    if not name or len(name) > 100:
        raise Invalid("name is required (at most 100 characters)", field="name")
    out["name"] = name
    for field in ("roles", "recipients"):
        if field in out:
            out[field] = _as_list(out[field], field)
    if kind in (Channel.WEBHOOK, Channel.SLACK):
        out["url"] = _check_url(str(out.get("url", channel.url) or ""))
    if kind == Channel.WEBHOOK and not (data.get("secret") or channel.secret_encrypted):
        raise Invalid("a webhook needs a signing key (secret)", field="secret")
    if kind == Channel.WEBHOOK and data.get("secret") and len(str(data["secret"])) < 16:
        raise Invalid("secret: a signing key has at least 16 characters", field="secret")
    if kind == Channel.EMAIL:
        if not str(out.get("smtp_host", channel.smtp_host) or "").strip():
            raise Invalid("an e-mail channel needs smtp_host", field="smtp_host")
        recipients = out.get("recipients", channel.recipients)
        if not recipients or not all("@" in r for r in recipients):
            raise Invalid("recipients must be e-mail addresses", field="recipients")
    after = out.get("escalate_after_s")
    if after not in (None, "") and (
        isinstance(after, bool) or not isinstance(after, int) or after <= 0
    ):
        raise Invalid(
            "escalate_after_s must be a positive number of seconds", field="escalate_after_s"
        )
    if after == "":
        out["escalate_after_s"] = None
    port = out.get("smtp_port")
    if port is not None and (not isinstance(port, int) or not 0 < port < 65536):
        raise Invalid("smtp_port must be a port number", field="smtp_port")
    return out


def shown(channel: Channel) -> dict[str, Any]:
    """The channel as pages, API answers and audit rows show it: secrets masked."""
    return {
        "id": str(channel.pk),
        "name": channel.name,
        "kind": channel.kind,
        "enabled": channel.enabled,
        "url": secrets.mask_url(channel.url) if channel.kind == Channel.SLACK else channel.url,
        "recipients": channel.recipients,
        "smtp_host": channel.smtp_host,
        "smtp_port": channel.smtp_port,
        "smtp_username": channel.smtp_username,
        "smtp_use_tls": channel.smtp_use_tls,
        "from_email": channel.from_email,
        "secret": secrets.mask(channel.secret_encrypted),
        "roles": channel.roles,
        "escalate_after_s": channel.escalate_after_s,
        "escalate_to": channel.escalate_to,
        "failing": channel.failing,
        "consecutive_failures": channel.consecutive_failures,
        "last_error": channel.last_error,
        "last_failure_at": channel.last_failure_at.isoformat() if channel.last_failure_at else None,
        "last_success_at": channel.last_success_at.isoformat() if channel.last_success_at else None,
    }


def create_channel(*, actor: Actor, data: dict[str, Any]) -> Channel:
    channel = Channel(kind=data.get("kind", ""))
    fields = _clean(data, channel)
    with transaction.atomic():
        if Channel.objects.filter(name=fields["name"]).exists():
            raise Conflict(f"a channel named {fields['name']!r} exists", field="name")
        for key, value in fields.items():
            setattr(channel, key, value)
        channel.secret_encrypted = secrets.encrypt(str(data.get("secret") or ""))
        channel.created_by = actor.label
        channel.save()
        record_audit(
            actor=actor,
            action="channel.create",
            object_type="channel",
            object_id=channel.pk,
            context=shown(channel),
        )
    return channel


def change_channel(*, actor: Actor, channel_id: Any, data: dict[str, Any]) -> Channel:
    with transaction.atomic():
        channel = Channel.objects.select_for_update().filter(pk=channel_id).first()
        if channel is None:
            raise NotFound("no such channel", object="channel")
        before = shown(channel)
        fields = _clean(data, channel)
        if Channel.objects.filter(name=fields["name"]).exclude(pk=channel.pk).exists():
            raise Conflict(f"a channel named {fields['name']!r} exists", field="name")
        for key, value in fields.items():
            setattr(channel, key, value)
        if data.get("secret"):  # empty = keep the stored one
            channel.secret_encrypted = secrets.encrypt(str(data["secret"]))
        channel.updated_at = timezone.now()
        channel.save()
        after = shown(channel)
        record_audit(
            actor=actor,
            action="channel.change",
            object_type="channel",
            object_id=channel.pk,
            context={
                "changed": {k: after[k] for k in after if after[k] != before[k]},
                "secret_replaced": bool(data.get("secret")),
            },
        )
    return channel


def delete_channel(*, actor: Actor, channel_id: Any) -> None:
    with transaction.atomic():
        channel = Channel.objects.select_for_update().filter(pk=channel_id).first()
        if channel is None:
            raise NotFound("no such channel", object="channel")
        record_audit(
            actor=actor,
            action="channel.delete",
            object_type="channel",
            object_id=channel.pk,
            context=shown(channel),
        )
        channel.delete()
