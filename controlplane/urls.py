from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

from audit import views as audit_views
from controlplane.api import api
from interventions import views as intervention_views
from runs import views as run_views

console = ([
    path("", run_views.run_list, name="runs"),
    path("runs/<uuid:run_id>/", run_views.run_page, name="run"),
    path("runs/<uuid:run_id>/interventions/new/", intervention_views.intervention_new, name="intervention-new"),
    path("runs/<uuid:run_id>/interventions/preview/", intervention_views.intervention_preview, name="intervention-preview"),
    path("runs/<uuid:run_id>/interventions/", intervention_views.intervention_issue, name="intervention-issue"),
    path("interventions/<uuid:intervention_id>/job/", intervention_views.intervention_job, name="intervention-job"),
    path("effects/<uuid:effect_id>/reconcile/", intervention_views.reconcile, name="reconcile"),
    path("approvals/", intervention_views.approvals_inbox, name="approvals"),
    path("contracts/", intervention_views.contracts_page, name="contracts"),
    path("audit/", audit_views.audit_page, name="audit"),
    path("audit/verify/", audit_views.audit_verify, name="audit-verify"),
    path("audit/export.jsonl", audit_views.audit_export, name="audit-export"),
], "console")

urlpatterns = [
    path("", include(console)),
    path("accounts/login/", auth_views.LoginView.as_view(redirect_authenticated_user=False), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(next_page="/accounts/login/"), name="logout"),
    path("admin/", admin.site.urls),  # read-only audit review and model browsing for staff
    path("api/v1/", api.urls),
]
