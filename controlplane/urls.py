from django.contrib import admin
from django.urls import path
from django.views.generic import RedirectView

from controlplane.api import api

urlpatterns = [
    # Until the htmx console lands, the read-only admin is the operator's view of runs, effects and audit.
    path("", RedirectView.as_view(url="/admin/", permanent=False)),
    path("accounts/login/", RedirectView.as_view(url="/admin/login/", permanent=False)),
    path("admin/", admin.site.urls),
    path("api/v1/", api.urls),
]
