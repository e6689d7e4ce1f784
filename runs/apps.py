from django.apps import AppConfig


class RunsConfig(AppConfig):
    name = "runs"
    verbose_name = "Runs"

    def ready(self) -> None:
        # audit_verify lives below runs and may not import it: runs hands it its checks instead.
        from django.db.backends.signals import connection_created

        from audit.registry import (
            register_anchor_part,
            register_append_only,
            register_check,
            register_run_team,
        )
        from core.roles import ADMIN, declare_permission
        from core.times import install_safe_time_loader

        from . import integrity

        # A stored time Python cannot hold is read as core.times.UnreadableTime, never a DataError.
        connection_created.connect(install_safe_time_loader, dispatch_uid="safe-time-loader")
        # Changing an agent's approval policies (PUT /api/v1/agents/{name}/approval-policies): admins.
        declare_permission("manage_approval_policies", frozenset({ADMIN}))
        from .models import Checkpoint, HistoryEvent

        # The same tables carry the append-only triggers (Meta.triggers, audit/triggers.py).
        register_append_only(HistoryEvent)
        register_run_team(_run_team)
        register_append_only(Checkpoint)
        register_check("history", integrity.verify_histories)
        register_check("ledger", integrity.verify_ledger)
        register_anchor_part("runs", integrity.anchor_run_heads, integrity.check_anchored_run_heads)


_RUN_TEAMS: dict[str, int] = {}  # a run's team never changes: remembered per process, bounded


def _run_team(run_id) -> int | None:
    """A run's team id (0 = the default team) for the audit's cross_team mark (audit.registry)."""
    key = str(run_id)
    team = _RUN_TEAMS.get(key)
    if team is None:
        from .models import Run

        row = Run.objects.filter(pk=run_id).values_list("team_id", flat=True)[:1]
        found = list(row)
        if not found:
            return None
        if len(_RUN_TEAMS) > 10_000:
            _RUN_TEAMS.clear()
        team = _RUN_TEAMS[key] = found[0] or 0
    return team
