"""Evidence for the operator's run-control test, written as JSON (machines) and HTML (people).

Every fact is taken from recorded data (the API's answers, the ledger, history, audit, the world's own
request record) -- never from what an agent said about itself.
"""

from __future__ import annotations

import html
import json
import os
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPORT_DIR = Path(
    os.environ.get("RUN_CONTROL_REPORT_DIR", Path(__file__).resolve().parents[2] / "reports")
)


@dataclass
class Scenario:
    number: int
    title: str
    facts: list[dict[str, Any]] = field(default_factory=list)
    status: str = "running"
    error: str = ""

    def fact(self, claim: str, evidence: Any, source: str) -> Any:
        """Record one shown fact; callers assert on the same evidence they record."""
        self.facts.append({"claim": claim, "evidence": evidence, "source": source})
        return evidence


SCENARIOS: dict[int, Scenario] = {}


def scenario(number: int, title: str) -> Scenario:
    SCENARIOS[number] = Scenario(number, title)
    return SCENARIOS[number]


def write_report() -> Path | None:
    if not SCENARIOS:
        return None
    REPORT_DIR.mkdir(parents=True, exist_ok=True)
    doc = {
        "generated_at": datetime.now(UTC).isoformat(),
        "scenarios": [s.__dict__ for s in sorted(SCENARIOS.values(), key=lambda s: s.number)],
    }
    doc["passed"] = all(s["status"] == "passed" for s in doc["scenarios"])
    (REPORT_DIR / "run-control.json").write_text(json.dumps(doc, indent=2, default=str))
    (REPORT_DIR / "run-control.html").write_text(_html(doc))
    return REPORT_DIR


def _html(doc: dict[str, Any]) -> str:
    parts = [
        "<!doctype html><meta charset=utf-8><title>Run-control test</title>",
        "<style>body{font:14px system-ui;margin:2em;max-width:1100px}h2{margin-top:2em}"
        ".passed{color:#176f2c}.failed{color:#b00020}pre{background:#f5f5f5;padding:.5em;white-space:pre-wrap;"
        "max-height:18em;overflow:auto}td{vertical-align:top;padding:.3em}</style>",
        f"<h1>The operator's run-control test</h1><p>generated {html.escape(doc['generated_at'])} — "
        f"<b class={'passed' if doc['passed'] else 'failed'}>"
        f"{'all scenarios passed' if doc['passed'] else 'FAILED'}</b></p>",
    ]
    for s in doc["scenarios"]:
        parts.append(
            f"<h2>{s['number']}. {html.escape(s['title'])} — <span class={s['status']}>{s['status']}</span></h2>"
        )
        if s["error"]:
            parts.append(f"<pre>{html.escape(s['error'])}</pre>")
        parts.append("<table>")
        for f in s["facts"]:
            ev = json.dumps(f["evidence"], indent=1, default=str)
            parts.append(
                f"<tr><td><b>{html.escape(f['claim'])}</b><br><small>{html.escape(f['source'])}</small></td>"
                f"<td><pre>{html.escape(ev[:3000])}</pre></td></tr>"
            )
        parts.append("</table>")
    return "\n".join(parts)
