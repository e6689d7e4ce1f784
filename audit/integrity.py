"""Everything ``audit_verify`` checks, in one database snapshot: the audit chains, every check the apps
above registered (audit/registry.py: runs' history chains and effect ledger) and, on request, the
signed anchors.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from .anchors.sink import read_anchor_lines
from .anchors.verify import verify_anchors
from .chain.verify import verify_chains
from .registry import checks
from .services import snapshot


def verify_all(*, anchors: bool = False, batch: int = 2000) -> dict[str, Any]:
    """The audit chain, every registered check and (``anchors``) the signed checkpoints.

    The anchors are read before the snapshot is taken: every anchor then names a head that was committed
    before the snapshot began, so a checkpoint written during the walk cannot look like a cut tail."""
    anchor_lines: Iterable[tuple[int, str]] = ()
    if anchors:
        anchor_lines = list(read_anchor_lines())
    report: dict[str, Any] = {}
    with snapshot():
        report["chain"] = verify_chains(batch).as_dict()
        for name, check in checks().items():
            report[name] = check()
        if anchors:
            report["anchors"] = verify_anchors(anchor_lines)
    return {"ok": all(part["ok"] for part in report.values()), **report}


def failures(report: dict[str, Any]) -> list[str]:
    """One line per failed part, naming its first broken position."""
    lines = []
    for name, part in report.items():
        if name == "ok" or part.get("ok", True):
            continue
        if name == "chain":
            lines.append(_chain_summary(part))
        else:
            lines.append(f"{name}: {part.get('summary') or part.get('detail', 'failed')}")
    return lines


def _broken_parts(report: dict[str, Any]) -> list[str]:
    return [k for k, v in report.items() if k != "ok" and not v.get("ok", True)]


def _chain_summary(part: dict[str, Any]) -> str:
    return (
        f"audit chain {part.get('chain')} broken at seq {part.get('first_broken_seq')}: "
        f"{part.get('problem')} ({part.get('detail')})"
    )


def verify_for_people(*, named: bool = True) -> dict[str, Any]:
    """What the console and the API show: the same checks as ``audit_verify`` (the anchors too, once
    any have been written), with the answer first: "Intact: 12,345 events in 210 chains, anchored
    …" or the first break, named.

    The checks always walk every chain: a break anywhere is everyone's concern. ``named=False`` (a
    team-limited verifier, docs/operator/teams.md): the verdict and the totals, but no break named
    -- a broken link's chain is a run's id, a history's or a ledger's names a run or an effect, of
    any team -- and each part's report reduced to its verdict."""
    anchored = next(iter(read_anchor_lines()), None) is not None
    report = verify_all(anchors=anchored)
    chain = report["chain"]
    latest = report.get("anchors", {}).get("latest_at")
    broken = failures(report)
    if broken:
        answer = f"Broken: {broken[0]}"
    else:
        answer = f"Intact: {chain['checked']:,} events in {chain['chains']:,} chains"
        if "history" in report:
            answer += f", {report['history'].get('runs', 0):,} run histories"
        if "ledger" in report:
            answer += f", {report['ledger'].get('effects', 0):,} ledger entries"
        if latest:
            answer += f", anchored {datetime.fromisoformat(latest):%Y-%m-%d %H:%M} UTC"
        else:
            answer += ", not anchored yet"
    if not named:
        report = {"ok": report["ok"]} | {
            k: {"ok": v.get("ok", True)} for k, v in report.items() if isinstance(v, dict)
        }
        broken = [f"{name}: broken (named to cross-team roles)" for name in _broken_parts(report)]
        if broken:
            answer = f"Broken: {broken[0]}"
    return {
        "ok": report["ok"],
        "answer": answer,
        "events": chain["checked"],
        "chains": chain["chains"],
        "anchored_at": latest,
        "anchors_checked": anchored,
        "failures": broken,
        "report": report,
    }
