from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

from api.app import api
from console.accounts import LogoutView
from controlplane.metrics import metrics

urlpatterns = [
    path("", include("console.urls")),
    path(
        "accounts/login/",
        auth_views.LoginView.as_view(redirect_authenticated_user=False),
        name="login",
    ),
    path(
        "accounts/logout/",
        LogoutView.as_view(next_page="/accounts/login/"),
        name="logout",
    ),
    path("admin/", admin.site.urls),  # read-only audit review and model browsing for staff
    path("api/v1/", api.urls),
    path("metrics", metrics, name="metrics"),  # Prometheus; who may scrape: controlplane/metrics.py
]
