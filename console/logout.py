"""Logout for the console: Django's view, then the user's open sockets re-check their session."""

from __future__ import annotations

from django.contrib.auth import views as auth_views

from core.live import push_session_check


class LogoutView(auth_views.LogoutView):
    """``user_logged_out`` (audited in audit/access/receivers.py) fires before the session is flushed, so the
    sockets are told only here, after it is gone: they then find no session and close with 4401."""

    def post(self, request, *args, **kwargs):
        user_id = request.user.pk if request.user.is_authenticated else None
        response = super().post(request, *args, **kwargs)
        if user_id is not None:
            push_session_check(user_id)
        return response
