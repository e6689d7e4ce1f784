"""A tiny OpenID Connect provider (django-oauth-toolkit) for the SSO tests: its own SQLite file,
started as a real server process by tests/identity/conftest.py."""

import os

from jwcrypto import jwk

BASE = os.environ["IDP_DIR"]
SECRET_KEY = "test-idp-not-secret"
DEBUG = False
ALLOWED_HOSTS = ["*"]
ROOT_URLCONF = "tests.identity.provider.urls"
INSTALLED_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "oauth2_provider",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": f"{BASE}/idp.sqlite3"}}
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "DIRS": [os.path.join(os.path.dirname(__file__), "templates")],
    }
]
# The controlplane and the IdP share 127.0.0.1 in the tests: cookies do not tell ports apart.
SESSION_COOKIE_NAME = "idp_session"
CSRF_COOKIE_NAME = "idp_csrf"
LOGIN_URL = "/login/"
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"
_key_file = f"{BASE}/key.pem"
if not os.path.exists(_key_file):
    with open(_key_file, "wb") as fh:
        fh.write(
            jwk.JWK.generate(kty="RSA", size=2048).export_to_pem(private_key=True, password=None)
        )
OAUTH2_PROVIDER = {
    "OIDC_ENABLED": True,
    "OIDC_RSA_PRIVATE_KEY": open(_key_file).read(),
    "OAUTH2_VALIDATOR_CLASS": "tests.identity.provider.validator.GroupsValidator",
    "SCOPES": {"openid": "OpenID Connect", "email": "e-mail", "profile": "profile"},
    "PKCE_REQUIRED": True,
    "ACCESS_TOKEN_EXPIRE_SECONDS": 300,
    # RP-initiated logout (/o/logout/): with a valid id_token_hint, no confirmation page.
    "OIDC_RP_INITIATED_LOGOUT_ENABLED": True,
    "OIDC_RP_INITIATED_LOGOUT_ALWAYS_PROMPT": False,
}
