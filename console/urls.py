"""Every operator page, partial and dialog lives under these routes (namespace "console")."""

from django.urls import path

from console import (
    audit,
    channels,
    fleet,
    freezes,
    intake,
    interventions,
    receipts,
    run_list,
    run_page,
    workers,
)

app_name = "console"

urlpatterns = [
    path("", run_list.run_list, name="runs"),
    path("runs/<uuid:run_id>/", run_page.run_page, name="run"),
    path("runs/<str:prefix>/", run_list.run_by_prefix, name="run-prefix"),
    path(
        "runs/<uuid:run_id>/interventions/new/",
        interventions.intervention_new,
        name="intervention-new",
    ),
    path(
        "runs/<uuid:run_id>/interventions/preview/",
        interventions.intervention_preview,
        name="intervention-preview",
    ),
    path(
        "runs/<uuid:run_id>/interventions/",
        interventions.intervention_issue,
        name="intervention-issue",
    ),
    path(
        "interventions/<uuid:intervention_id>/job/",
        interventions.intervention_job,
        name="intervention-job",
    ),
    path("receipts/<uuid:intervention_id>/", receipts.receipt_page, name="receipt"),
    path(
        "receipts/<uuid:intervention_id>/children/",
        receipts.receipt_children,
        name="receipt-children",
    ),
    path(
        "receipts/<uuid:intervention_id>/now/",
        receipts.receipt_headline,
        name="receipt-now",
    ),
    path("effects/<uuid:effect_id>/reconcile/", interventions.reconcile, name="reconcile"),
    path("approvals/", interventions.approvals_inbox, name="approvals"),
    path("contracts/", interventions.contracts_page, name="contracts"),
    path("intake/", intake.intake_page, name="intake"),
    path("intake/preview/", intake.hold_preview_view, name="intake-preview"),
    path("intake/hold/", intake.hold_confirm, name="intake-hold"),
    path(
        "intake/<uuid:hold_id>/release/preview/",
        intake.release_preview_view,
        name="intake-release-preview",
    ),
    path("intake/<uuid:hold_id>/release/", intake.release_confirm, name="intake-release"),
    path("fleet/", fleet.fleet_page, name="fleet"),
    path("fleet/preview/", fleet.fleet_preview, name="fleet-preview"),
    path("fleet/freezes/preview/", freezes.freeze_preview, name="freeze-preview"),
    path("fleet/freezes/", freezes.freeze_set, name="freeze-set"),
    path(
        "fleet/freezes/<uuid:freeze_id>/restore/preview/",
        freezes.freeze_restore_preview,
        name="freeze-restore-preview",
    ),
    path("fleet/freezes/<uuid:freeze_id>/restore/", freezes.freeze_restore, name="freeze-restore"),
    path("fleet/start/", fleet.fleet_start, name="fleet-start"),
    path("fleet/<uuid:operation_id>/", fleet.fleet_operation, name="fleet-operation"),
    path("fleet/<uuid:operation_id>/halt/", fleet.fleet_halt, name="fleet-halt"),
    path("fleet/<uuid:operation_id>/confirm/", fleet.fleet_confirm, name="fleet-confirm"),
    path("fleet/<uuid:operation_id>/cancel/", fleet.fleet_cancel, name="fleet-cancel"),
    path("workers/", workers.workers_page, name="workers"),
    path("channels/", channels.channels_page, name="channels"),
    path("channels/<uuid:channel_id>/", channels.channel_page, name="channel"),
    path("channels/<uuid:channel_id>/delete/", channels.channel_delete, name="channel-delete"),
    path("channels/<uuid:channel_id>/test/", channels.channel_test, name="channel-test"),
    path("audit/", audit.audit_page, name="audit"),
    path("audit/verify/", audit.audit_verify, name="audit-verify"),
    path("audit/export.jsonl", audit.audit_export, name="audit-export"),
]
