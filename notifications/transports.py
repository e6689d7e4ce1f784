"""How one message reaches one channel. Network I/O only: called outside any transaction
(notifications/jobs.py), raises on failure with an error the channel page shows."""

from __future__ import annotations

import json
from typing import Any

import httpx
from django.conf import settings
from django.core.mail import EmailMessage
from django.core.mail.backends.smtp import EmailBackend

from notifications import secrets, signing
from notifications.models import Channel


class DeliveryFailed(Exception):
    pass


def _timeout() -> float:
    return float(getattr(settings, "NOTIFY_TIMEOUT_S", 10))


def _post(url: str, body: bytes, headers: dict[str, str]) -> None:
    try:
        response = httpx.post(
            url,
            content=body,
            headers={"Content-Type": "application/json", **headers},
            timeout=_timeout(),
        )
    except httpx.HTTPError as exc:
        raise DeliveryFailed(f"{type(exc).__name__}: {exc}") from exc
    if response.status_code >= 300:
        raise DeliveryFailed(f"HTTP {response.status_code}: {response.text[:200]}")


def send_webhook(channel: Channel, message: dict[str, Any]) -> None:
    body = json.dumps(message, sort_keys=True, separators=(",", ":")).encode()
    _post(channel.url, body, signing.sign(secrets.decrypt(channel.secret_encrypted), body))


def send_slack(channel: Channel, message: dict[str, Any]) -> None:
    """A Slack-compatible incoming-webhook payload: ``text`` plus one section block with the link."""
    text = f"{message['title']}\n{message['summary']}\n<{message['link']}|Open the approval>"
    payload = {
        "text": text,
        "blocks": [{"type": "section", "text": {"type": "mrkdwn", "text": text}}],
    }
    _post(channel.url, json.dumps(payload).encode(), {})


def send_email(channel: Channel, message: dict[str, Any]) -> None:
    # Django 6.1 deprecates building an EmailBackend directly (and EmailMessage(connection=...)):
    # mailers are meant to come from settings.MAILERS. A channel's SMTP server is data, not a
    # setting, so the backend is built as a mailer is, under an alias of its own: every option given
    # here, none read from the EMAIL_* settings, no deprecation warning.
    backend = EmailBackend(
        alias=f"notification-channel-{channel.pk}",
        host=channel.smtp_host,
        port=channel.smtp_port,
        username=channel.smtp_username or None,
        password=secrets.decrypt(channel.secret_encrypted) or None,
        use_tls=channel.smtp_use_tls,
        timeout=_timeout(),
    )
    mail = EmailMessage(
        subject=message["title"],
        body=f"{message['summary']}\n\nOpen the approval (sign in first): {message['link']}\n",
        from_email=channel.from_email or None,
        to=list(channel.recipients),
    )
    try:
        backend.send_messages([mail])
    except Exception as exc:  # smtplib and socket errors: the channel page shows which
        raise DeliveryFailed(f"{type(exc).__name__}: {exc}") from exc


SENDERS = {Channel.WEBHOOK: send_webhook, Channel.SLACK: send_slack, Channel.EMAIL: send_email}


def send(channel: Channel, message: dict[str, Any]) -> None:
    SENDERS[channel.kind](channel, message)
