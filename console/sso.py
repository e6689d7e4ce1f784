"""The console's edges of single sign-on (OpenID Connect, mozilla-django-oidc) and of local login.

Nothing is decided here: the claims go to audit.access.sso.sign_in_from_claims, which sets the
user's roles and writes the audit rows; these classes only adapt the library's hooks.
"""

from __future__ import annotations

import logging
import time
from urllib.parse import urlencode

import httpx
from django.conf import settings
from django.contrib import auth
from django.contrib.auth import views as auth_views
from django.contrib.auth.backends import ModelBackend
from django.core.exceptions import SuspiciousOperation
from django.http import Http404
from django.shortcuts import render
from mozilla_django_oidc.auth import OIDCAuthenticationBackend
from mozilla_django_oidc.middleware import SessionRefresh as LibrarySessionRefresh
from mozilla_django_oidc.views import OIDCAuthenticationCallbackView, OIDCAuthenticationRequestView

from audit.access import sso
from core.roles import ADMIN, roles_of

log = logging.getLogger(__name__)


def sso_enabled() -> bool:
    return bool(getattr(settings, "OIDC_RP_CLIENT_ID", ""))


class OIDCBackend(OIDCAuthenticationBackend):
    """Users are found and made by audit.access.sso from the verified userinfo claims."""

    def get_or_create_user(self, access_token, id_token, payload):
        claims = self.get_userinfo(access_token, id_token, payload)
        subject = str(payload.get("sub") or "")
        if str(claims.get("sub") or subject) != subject:  # OIDC Core 5.3.2: must be the token's
            reason = "the identity provider's userinfo names another subject than its ID token"
            sso.refuse(username=sso.username_from(claims), reason=reason, request=self.request)
            self.request.sso_refusal = sso.LoginRefused(reason)
            return None
        try:
            return sso.sign_in_from_claims(
                claims=claims,
                request=self.request,
                issuer=str(payload.get("iss") or ""),
                subject=subject,
            )
        except sso.LoginRefused as refused:
            self.request.sso_refusal = refused  # shown by the callback view
            return None


class BreakGlassModelBackend(ModelBackend):
    """Local password login, as settings.LOCAL_LOGIN allows: "on" (everyone), "admins" (break-glass
    admins and superusers only: everyone else signs in through the IdP) or "off"."""

    def authenticate(self, request, username=None, password=None, **kwargs):
        mode = settings.LOCAL_LOGIN
        if mode == "off":
            return None
        user = super().authenticate(request, username=username, password=password, **kwargs)
        if user is not None and mode == "admins":
            if not (user.is_superuser or ADMIN in roles_of(user)):
                return None
        return user


class LoginView(auth_views.LoginView):
    def get_context_data(self, **kwargs):
        context = super().get_context_data(**kwargs)
        context["sso_enabled"] = sso_enabled()
        context["sso_provider"] = settings.OIDC_PROVIDER_NAME
        context["local_login"] = settings.LOCAL_LOGIN
        return context


class SsoStartView(OIDCAuthenticationRequestView):
    def get(self, request):
        if not sso_enabled():
            raise Http404("single sign-on is not configured")
        return super().get(request)


class SsoCallbackView(OIDCAuthenticationCallbackView):
    """The IdP's redirect back. A state this session did not send (tampered, replayed, or from a
    session that expired) or a refused login is audited and shown as a page naming why."""

    def get(self, request):
        if not sso_enabled():
            raise Http404("single sign-on is not configured")
        if request.GET.get("error"):
            self._refuse(f"the identity provider answered {request.GET['error'][:100]!r}")
        elif "code" in request.GET and "state" in request.GET:
            if request.GET["state"] not in request.session.get("oidc_states", {}):
                return self._refused_page(
                    self._refuse("the login's state is unknown or expired: start again"), 400
                )
        try:
            return super().get(request)
        except SuspiciousOperation as exc:
            return self._refused_page(self._refuse(f"the identity provider's answer: {exc}"), 400)

    def _refuse(self, reason: str) -> str:
        sso.refuse(username="", reason=reason, request=self.request)
        return reason

    def login_success(self):
        """A silent refresh (``prompt=none``) of the person already signed in is not a login: the
        library does not call ``auth.login`` for the same user, so no ``login`` row is written; their
        roles were just re-read from the IdP's groups. The next refresh is due in
        OIDC_SESSION_REFRESH_S."""
        response = super().login_success()
        self.request.session["oidc_id_token_expiration"] = (
            time.time() + settings.OIDC_SESSION_REFRESH_S
        )
        return response

    def login_failure(self):
        # A refresh that fails (groups that grant nothing now, a deactivated user) ends the session.
        if self.request.user.is_authenticated:
            auth.logout(self.request)
        refusal = getattr(self.request, "sso_refusal", None)
        if refusal is None:
            return self._refused_page("the identity provider did not sign you in", 403)
        return self._refused_page(refusal.reason, 403, groups=refusal.groups)

    def _refused_page(self, reason: str, status: int, groups: list[str] | None = None):
        return render(
            self.request,
            "registration/sso_refused.html",
            {"reason": reason, "groups": groups or [], "sso_provider": settings.OIDC_PROVIDER_NAME},
            status=status,
        )


class SessionRefresh(LibrarySessionRefresh):
    """Every OIDC_SESSION_REFRESH_S, a page GET of a person signed in through the IdP goes back to
    the IdP with ``prompt=none``: still signed in there, they return at once with fresh claims and
    their roles are recomputed (a removed group drops its role); signed out there, the IdP answers
    ``login_required`` and the session ends. Settings are read per request (tests change them), and
    htmx fragments and the API are not redirected: the next page GET refreshes."""

    def __init__(self, get_response):
        self.get_response = get_response
        super().__init__(get_response)

    @property
    def exempt_urls(self):
        return {"/oidc/authenticate/", "/oidc/callback/", "/accounts/logout/", "/accounts/login/"}

    def is_refreshable_url(self, request):
        if not sso_enabled() or request.path.startswith("/api/"):
            return False
        if request.headers.get("HX-Request"):
            return False
        return super().is_refreshable_url(request)

    def process_request(self, request):
        self.OIDC_OP_AUTHORIZATION_ENDPOINT = settings.OIDC_OP_AUTHORIZATION_ENDPOINT
        self.OIDC_RP_CLIENT_ID = settings.OIDC_RP_CLIENT_ID
        self.OIDC_RP_SCOPES = settings.OIDC_RP_SCOPES
        return super().process_request(request)


_DISCOVERED: dict[str, str] = {}


def discovered_end_session_endpoint() -> str:
    """The IdP's ``end_session_endpoint`` from its discovery document (OIDC_OP_DISCOVERY_ENDPOINT),
    read once per process and document address. Unreachable or absent: "" (logout is then local
    only, and the next logout tries again)."""
    url = settings.OIDC_OP_DISCOVERY_ENDPOINT
    if not url:
        return ""
    if url not in _DISCOVERED:
        try:
            answer = httpx.get(url, timeout=5, follow_redirects=True)
            answer.raise_for_status()
            endpoint = str(answer.json().get("end_session_endpoint") or "")
        except (httpx.HTTPError, ValueError, AttributeError) as exc:
            log.warning("could not read the IdP's discovery document %s: %s", url, exc)
            return ""
        if not endpoint.startswith(("https://", "http://")):
            return ""
        _DISCOVERED[url] = endpoint
    return _DISCOVERED[url]


def idp_logout_url(request, id_token: str) -> str | None:
    """Where to send a person signed in through the IdP at logout (RP-initiated logout), or None
    when OIDC_OP_END_SESSION_ENDPOINT is not set."""
    if not (sso_enabled() and id_token):
        return None
    endpoint = settings.OIDC_OP_END_SESSION_ENDPOINT or discovered_end_session_endpoint()
    if not endpoint:
        return None
    query = urlencode(
        {
            "id_token_hint": id_token,
            "client_id": settings.OIDC_RP_CLIENT_ID,
            "post_logout_redirect_uri": request.build_absolute_uri(settings.LOGIN_URL),
        }
    )
    return f"{endpoint}{'&' if '?' in endpoint else '?'}{query}"
