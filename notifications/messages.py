"""What a notification says. The link opens the exact approval after login: it carries no token,
so following it without a session lands on the login page, and deciding still needs the approver's
role, a session and CSRF (docs/operations/notifications.md)."""

from __future__ import annotations

from typing import Any

from django.conf import settings

from notifications.models import Delivery


def approval_link(run_id: Any, approval_id: Any) -> str:
    base = str(getattr(settings, "CONSOLE_BASE_URL", "http://127.0.0.1:8000")).rstrip("/")
    return f"{base}/runs/{run_id}/?approval={approval_id}#approval-{approval_id}"


def message_for(delivery: Delivery) -> dict[str, Any]:
    approval = delivery.approval
    if approval is None:  # a test-send from the channel page
        return {
            "event": "test",
            "title": f"Test notification from controlplane ({delivery.channel.name})",
            "summary": "The channel works: approvals will reach this address.",
            "link": f"{str(getattr(settings, 'CONSOLE_BASE_URL', '')).rstrip('/')}/approvals/",
        }
    escalated = delivery.reason == Delivery.ESCALATED
    return {
        "event": "approval.escalated" if escalated else "approval.requested",
        "title": ("Escalated: " if escalated else "")
        + f"approval needed for {approval.tool}:{approval.action}",
        "summary": (
            f"Run {approval.run_id} asks for {approval.tool}:{approval.action} "
            f"(needs {_needs(approval)}; requested by {approval.requested_by}"
            + (f"; deadline {approval.deadline.isoformat()}" if approval.deadline else "")
            + (f"). Reason: {approval.reason}" if approval.reason else ")")
        ),
        "approval": str(approval.pk),
        "run": str(approval.run_id),
        "required_role": approval.required_role,
        "digest": approval.digest,
        "link": approval_link(approval.run_id, approval.pk),
    }


def _needs(approval: Any) -> str:
    """ "role approver", or with team steps "role approver; 2 from team payments"."""
    teams = [f"{s.get('count', 1)} from team {s['team']}" for s in approval.steps if s.get("team")]
    roles = [s["role"] for s in approval.steps if s.get("role")] if approval.steps else []
    words = [f"role {approval.required_role}"] if roles or not teams else []
    return "; ".join(words + teams)
