"""Reads for the channel pages and the run page."""

from __future__ import annotations

from typing import Any

from notifications.models import Channel, Delivery


def channels() -> list[Channel]:
    return list(Channel.objects.all())


def channel(channel_id: Any) -> Channel | None:
    return Channel.objects.filter(pk=channel_id).first()


def run_notifications(run_id: Any) -> list[dict[str, Any]]:
    """The run's approval notifications, with each channel's health (failing: 5 failures in a row)."""
    rows = Delivery.objects.filter(run_id=run_id).select_related("channel").order_by("-created_at")
    return [
        {
            "channel": d.channel.name,
            "channel_id": str(d.channel.pk),
            "reason": d.reason,
            "status": d.status,
            "attempts": d.attempts,
            "last_error": d.last_error,
            "channel_failing": d.channel.failing,
            "channel_last_error": d.channel.last_error,
        }
        for d in rows[:20]
    ]
