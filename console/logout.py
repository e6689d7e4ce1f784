"""Logout for the console: Django's view, then the user's open sockets re-check their session."""

from __future__ import annotations

from django.contrib.auth import views as auth_views
from django.http import HttpResponseRedirect

from audit.access import sso
from console.sso import idp_logout_url
from core.live import push_session_check


class LogoutView(auth_views.LogoutView):
    """``user_logged_out`` (audited in audit/access/receivers.py) fires before the session is flushed, so the
    sockets are told only here, after it is gone: they then find no session and close with 4401."""

    def post(self, request, *args, **kwargs):
        user_id = request.user.pk if request.user.is_authenticated else None
        username = request.user.get_username() if user_id is not None else ""
        # Signed in through the IdP: after the local logout, the IdP's session ends too
        # (RP-initiated logout), so the next "Sign in with …" asks for the password again.
        idp_url = idp_logout_url(request, request.session.get("oidc_id_token", ""))
        response = super().post(request, *args, **kwargs)
        if user_id is not None:
            push_session_check(user_id)
        if user_id is not None and idp_url is not None:
            sso.record_idp_logout(
                user_id=user_id, username=username, request=request, endpoint=idp_url
            )
            return HttpResponseRedirect(idp_url)
        return response
