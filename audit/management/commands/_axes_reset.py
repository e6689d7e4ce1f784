"""django-axes' reset commands, audited: these override axes' own (``audit`` precedes ``axes`` in
INSTALLED_APPS) so that lifting a lockout from the command line leaves an audit event."""

from __future__ import annotations

from django.core.management.base import BaseCommand

from audit.access.events import reset_lockouts
from core.actors import system_actor


def reset_and_report(command: BaseCommand, name: str, **scope: str | None) -> None:
    removed = reset_lockouts(actor=system_actor(name, name="manage.py"), **scope)
    command.stdout.write(f"{removed} attempts removed." if removed else "No attempts found.")
