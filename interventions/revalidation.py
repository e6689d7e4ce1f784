"""RevalidationReport: six checks a resume must pass -- a new decision against a changed world.

Built by a Celery job outside any transaction (assumption checkers call external systems); the
result is then applied in one transaction by ``interventions.resume.conclude_resume``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import timedelta
from typing import Any

from django.utils import timezone

from interventions import facts
from interventions.registry import get_assumption_checker
from runs.models import Assumption, AuthorityGrant, Checkpoint, Run
from runs.selectors import latest_checkpoint, starting_checkpoint, unresolved_effects


@dataclass
class Check:
    name: str
    ok: bool
    summary: str
    details: Any = None


@dataclass
class RevalidationReport:
    run_id: str
    checks: list[Check] = field(default_factory=list)
    checked_at: str = field(default_factory=lambda: timezone.now().isoformat())

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    @property
    def failing(self) -> list[str]:
        return [c.name for c in self.checks if not c.ok]

    def as_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "ok": self.ok,
            "failing": self.failing,
            "checked_at": self.checked_at,
            "checks": [asdict(c) for c in self.checks],
        }


def _flatten(versions: dict, prefix: str = "") -> dict[str, Any]:
    out = {}
    for key, value in (versions or {}).items():
        if isinstance(value, dict):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def version_diff(pinned: dict, now: dict) -> list[dict[str, Any]]:
    a, b = _flatten(pinned), _flatten(now)
    return [
        {"name": k, "then": a.get(k), "now": b.get(k)}
        for k in sorted(set(a) | set(b))
        if a.get(k) != b.get(k)
    ]


def check_boundary(run: Run) -> Check:
    cp = starting_checkpoint(run) or latest_checkpoint(run)
    if cp is None:
        return Check("boundary", True, "no checkpoint: the run restarts from its first step", None)
    return Check(
        "boundary",
        True,
        f"resumes from checkpoint {cp.seq} (after step {cp.step!r})",
        {"seq": cp.seq, "step": cp.step, "hash": cp.hash, "created_at": cp.created_at.isoformat()},
    )


def check_versions(run: Run) -> Check:
    now = run.agent.current_versions or {}
    if not now:
        return Check(
            "versions",
            True,
            "no newer versions reported by the agent's workers",
            {"then": run.versions, "now": None},
        )
    diff = version_diff(run.versions, now)
    if not diff:
        return Check(
            "versions",
            True,
            "code, model, tool and config versions unchanged",
            {"then": run.versions, "now": now},
        )
    names = ", ".join(f"{d['name']} {d['then']} → {d['now']}" for d in diff)
    return Check(
        "versions",
        False,
        f"versions changed since the run started: {names}",
        {"then": run.versions, "now": now, "diff": diff},
    )


def check_assumptions(run: Run, reobserve: bool) -> tuple[Check, list[tuple[Assumption, Any]]]:
    now, stale, fresh, refreshed = timezone.now(), [], [], []
    latest: dict[str, Assumption] = {}
    for a in Assumption.objects.filter(run=run).order_by("observed_at"):
        latest[a.key] = a  # a later observation of the same fact supersedes the earlier one
    for a in latest.values():
        problem, current = None, None
        if a.max_age_s and a.observed_at + timedelta(seconds=a.max_age_s) < now:
            problem = f"older than {a.max_age_s}s"
        checker = get_assumption_checker(a.checker) if a.checker else None
        if checker is not None:
            result = checker(a.key, a.value, a.meta or {})
            current = result.current_value
            if not result.ok:
                problem = f"changed: recorded {a.value!r}, now {result.current_value!r}" + (
                    f" ({result.detail})" if result.detail else ""
                )
        row: dict[str, Any] = {
            "key": a.key,
            "recorded": a.value,
            "observed_at": a.observed_at.isoformat(),
            "current": current,
        }
        if problem and reobserve and checker is not None:
            refreshed.append((a, current))
            fresh.append(row | {"note": f"re-observed by the operator's choice ({problem})"})
        elif problem:
            stale.append(row | {"problem": problem})
        else:
            fresh.append(row)
    if stale:
        return Check(
            "assumptions",
            False,
            f"{len(stale)} assumption(s) stale: " + ", ".join(s["key"] for s in stale),
            {"stale": stale, "fresh": fresh},
        ), refreshed
    return Check(
        "assumptions", True, f"{len(fresh)} assumption(s) still hold", {"stale": [], "fresh": fresh}
    ), refreshed


def check_unknown_effects(run: Run) -> Check:
    unknown = unresolved_effects(run)
    if unknown:
        return Check(
            "unknown_effects",
            False,
            f"{len(unknown)} effect(s) with ambiguous outcome must be reconciled first",
            unknown,
        )
    return Check("unknown_effects", True, "every effect's outcome is known", [])


def check_authority(run: Run) -> Check:
    now = timezone.now()
    grants = [
        {
            "scope": g.scope,
            "status": g.effective_status(now),
            "expires_at": g.expires_at.isoformat(),
        }
        for g in AuthorityGrant.objects.filter(run=run)
    ]
    missing = [g for g in grants if g["status"] != AuthorityGrant.ACTIVE]
    if missing:
        return Check(
            "authority",
            False,
            "authority not available now: "
            + ", ".join(f"{g['scope']} {g['status']}" for g in missing),
            grants,
        )
    return Check("authority", True, f"{len(grants)} grant(s) active", grants)


def check_replay(run: Run) -> Check:
    """Steps after the boundary run again; each effect they repeat must carry an idempotency key so
    the control plane replays the recorded result instead of dispatching twice."""
    cp: Checkpoint | None = starting_checkpoint(run) or latest_checkpoint(run)
    rows = facts.re_executes(run, cp)
    unprotected = [x for step in rows for x in step["effects"] if not x["protected"]]
    if unprotected:
        return Check(
            "replay", False, f"{len(unprotected)} repeated effect(s) lack an idempotency key", rows
        )
    summary = (
        f"{len(rows)} step(s) will execute again; every effect they repeat is protected by its idempotency key"
        if rows
        else "no step with effects will execute again"
    )
    return Check("replay", True, summary, rows)


def build_report(
    run: Run, *, reobserve: bool = False
) -> tuple[RevalidationReport, list[tuple[Assumption, Any]]]:
    assumptions, refreshed = check_assumptions(run, reobserve)
    report = RevalidationReport(
        str(run.pk),
        [
            check_boundary(run),
            check_versions(run),
            assumptions,
            check_unknown_effects(run),
            check_authority(run),
            check_replay(run),
        ],
    )
    return report, refreshed
