from django.contrib import admin
from django.urls import include, path

from api.app import api
from console.logout import LogoutView
from console.sso import LoginView, SsoCallbackView, SsoStartView
from controlplane.metrics import metrics

urlpatterns = [
    path("", include("console.urls")),
    path(
        "accounts/login/",
        LoginView.as_view(redirect_authenticated_user=False),
        name="login",
    ),
    # OpenID Connect (console/sso.py; 404 unless OIDC_RP_CLIENT_ID is set).
    path("oidc/authenticate/", SsoStartView.as_view(), name="oidc_authentication_init"),
    path("oidc/callback/", SsoCallbackView.as_view(), name="oidc_authentication_callback"),
    path(
        "accounts/logout/",
        LogoutView.as_view(next_page="/accounts/login/"),
        name="logout",
    ),
    path("admin/", admin.site.urls),  # read-only audit review and model browsing for staff
    path("api/v1/", api.urls),
    path("metrics", metrics, name="metrics"),  # Prometheus; who may scrape: controlplane/metrics.py
]

# Error pages in the caller's language: JSON under /api/ (a path the API cannot route, a UUID that
# does not parse), the console's HTML elsewhere.
handler400 = "controlplane.edge.bad_request"
handler403 = "controlplane.edge.forbidden"
handler404 = "controlplane.edge.not_found"
handler500 = "controlplane.edge.server_error"
