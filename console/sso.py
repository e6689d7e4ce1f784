"""The console's edges of single sign-on (OpenID Connect, mozilla-django-oidc) and of local login.

Nothing is decided here: the claims go to audit.access.sso.sign_in_from_claims, which sets the
user's roles and writes the audit rows; these classes only adapt the library's hooks.
"""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth import views as auth_views
from django.contrib.auth.backends import ModelBackend
from django.core.exceptions import SuspiciousOperation
from django.http import Http404
from django.shortcuts import render
from mozilla_django_oidc.auth import OIDCAuthenticationBackend
from mozilla_django_oidc.views import OIDCAuthenticationCallbackView, OIDCAuthenticationRequestView

from audit.access import sso
from core.roles import ADMIN, roles_of


def sso_enabled() -> bool:
    return bool(getattr(settings, "OIDC_RP_CLIENT_ID", ""))


class OIDCBackend(OIDCAuthenticationBackend):
    """Users are found and made by audit.access.sso from the verified userinfo claims."""

    def get_or_create_user(self, access_token, id_token, payload):
        claims = self.get_userinfo(access_token, id_token, payload)
        try:
            return sso.sign_in_from_claims(claims=claims, request=self.request)
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

    def login_failure(self):
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
