"""mkdocs hook: render the run state machine from runs/states.py into the page that asks for it, so the
docs cannot drift from the table the services enforce. A page writes a marker on a line of its own:

    <!-- states:transitions -->   every (state, event) -> next state, with its guard
    <!-- states:directives -->    what the lease holder is told on heartbeat, by state
    <!-- states:sets -->          the named sets of states (leased, terminal, finished, ...)

runs/states.py imports nothing of Django (it is pure data), so the build needs no settings.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from runs import states  # noqa: E402


def _transitions() -> str:
    lines = ["| from | event | to | guard |", "|---|---|---|---|"]
    for row in states.as_table():
        guard = f"`{row['guard']}`" if row["guard"] else ""
        lines.append(f"| `{row['from']}` | `{row['event']}` | `{row['to']}` | {guard} |")
    return "\n".join(lines)


def _directives() -> str:
    lines = ["| state | directive on heartbeat | a declared effect is denied as |", "|---|---|---|"]
    for state, directive in states.DIRECTIVES.items():
        denial = "" if state in states.EFFECT_STATES else f"`{states.denial_reason(state)}`"
        lines.append(f"| `{state.value}` | `{directive}` | {denial} |")
    return "\n".join(lines)


def _sets() -> str:
    named = {
        "LEASED_STATES": "a worker holds (or may hold) the execution lease and may write facts",
        "EFFECT_STATES": "a new effect may be authorised",
        "APPROVAL_LIVE_STATES": "a pending approval can still be decided",
        "FINISHED_STATES": "execution is over; follow-up interventions may still apply",
        "TERMINAL_STATES": "nothing more happens",
    }
    lines = ["| set | meaning | states |", "|---|---|---|"]
    for name, meaning in named.items():
        members = ", ".join(f"`{s.value}`" for s in states.State if s in getattr(states, name))
        lines.append(f"| `{name}` | {meaning} | {members} |")
    return "\n".join(lines)


MARKERS = {
    "<!-- states:transitions -->": _transitions,
    "<!-- states:directives -->": _directives,
    "<!-- states:sets -->": _sets,
}


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    for marker, render in MARKERS.items():
        if marker in markdown:
            markdown = markdown.replace(marker, render())
    return markdown
