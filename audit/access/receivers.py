"""Thin edges: Django's and django-axes' authentication signals call the account audit services.

Signals are the only hook Django's login/logout views and django-axes offer; nothing is decided
here, every receiver calls one service in audit/access/events.py.
"""

from __future__ import annotations

from axes.signals import user_locked_out
from django.contrib.auth.signals import user_logged_in, user_logged_out, user_login_failed
from django.dispatch import receiver

from . import events as accounts


@receiver(user_logged_in, dispatch_uid="audit.login")
def on_login(sender, request=None, user=None, **kwargs):
    accounts.record_login(user=user, request=request)


@receiver(user_logged_out, dispatch_uid="audit.logout")
def on_logout(sender, request=None, user=None, **kwargs):
    accounts.record_logout(user=user, request=request)


@receiver(user_login_failed, dispatch_uid="audit.login_failed")
def on_login_failed(sender, credentials=None, request=None, **kwargs):
    accounts.record_login_failed(username=(credentials or {}).get("username", ""), request=request)


@receiver(user_locked_out, dispatch_uid="audit.locked_out")
def on_locked_out(sender, request=None, username=None, ip_address=None, **kwargs):
    accounts.record_lockout(username=username or "", request=request, ip_address=ip_address or "")
