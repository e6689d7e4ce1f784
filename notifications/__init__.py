"""Notification channels: approvals reach the people who must decide (docs/operations/notifications.md)."""
