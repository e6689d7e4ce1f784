"""What the apps above audit register with it when Django starts (``AppConfig.ready``), so audit never
imports them: the checks ``audit_verify`` runs in its snapshot, the parts every anchor signs beside the
chain heads, and the tables that must stay append-only (``db_grants`` grants the application role only
INSERT and SELECT on them).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.db.models import Model

Check = Callable[[], dict[str, Any]]  # returns at least {"ok": bool}
# Given every valid anchor's (time, value) of one part, says whether the database still matches them.
AnchorCheck = Callable[[list[tuple[str, Any]]], dict[str, Any]]

_checks: dict[str, Check] = {}
_append_only: dict[str, type[Model]] = {}
_anchor_parts: dict[str, tuple[Callable[[], Any], AnchorCheck]] = {}
_run_team: list[Callable[[Any], int | None]] = []  # run id -> its team id (0 = default), or None


def register_check(name: str, check: Check) -> None:
    """``check`` runs inside ``audit_verify``'s snapshot; its report appears under ``name``."""
    _checks[name] = check


def register_append_only(model: type[Model]) -> None:
    _append_only[model._meta.label] = model


def register_anchor_part(name: str, collect: Callable[[], Any], check: AnchorCheck) -> None:
    """``collect()`` runs in the snapshot the chain head is read in; its JSON value is signed with the
    head in every anchor. ``audit_verify --anchors`` hands all of them back to ``check``."""
    _anchor_parts[name] = (collect, check)


def anchor_parts() -> dict[str, tuple[Callable[[], Any], AnchorCheck]]:
    return dict(_anchor_parts)


def checks() -> dict[str, Check]:
    return dict(_checks)


def append_only_tables() -> list[str]:
    return sorted(m._meta.db_table for m in _append_only.values())


def register_run_team(lookup: Callable[[Any], int | None]) -> None:
    """How the audit learns a run's team (0 = the default team; None: no such run yet), to mark
    events written under the cross_team right on another team's run (audit.services)."""
    _run_team[:] = [lookup]


def run_team(run_id: Any) -> int | None:
    return _run_team[0](run_id) if _run_team else None
