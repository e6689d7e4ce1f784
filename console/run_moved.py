"""What moved in a run since a dialog's preview was drawn: the "run changed" note of an open dialog.

A preview and the run page's header both carry the run's *basis* (state, effects, unresolved
effects, checkpoints, history head) as ``data-basis``. A live push redraws the header, never the
dialog; static/console/console.js compares the two and writes the note in place ("the run changed
since this preview: 2 new effects"). Pages without a run header (the approvals inbox) ask the
server every few seconds (``moved_note``), which reads a few counts, not a preview. Confirm sends
the preview's digest; the service re-checks it under the run lock and a stale one re-previews
(docs/operator/console.md, "Previews and receipts").
"""

from __future__ import annotations

import json
from typing import Any

from runs.models import Run
from runs.selectors import effect_count, unresolved_count


def basis(run: Run, effects: int, unresolved: int) -> str:
    """The run's basis as the page carries it (JSON; compared by console.js and :func:`moved`)."""
    return json.dumps(
        {
            "state": str(run.state),
            "effects": effects,
            "unresolved": unresolved,
            "checkpoints": run.checkpoint_seq,
            "head": run.history_seq,
        },
        separators=(",", ":"),
    )


def basis_now(run: Run) -> str:
    """``run`` as just read (the dialog's views read it per request)."""
    return basis(run, effect_count(run), unresolved_count(run))


def _parse(text: str) -> dict[str, Any] | None:
    try:
        value = json.loads(text) if text else None
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _n(count: int, what: str) -> str:
    return f"{count} {what}{'' if count == 1 else 's'}"


def moved(before_text: str, now_text: str) -> list[str]:
    """What changed from ``before`` to ``now``, in the operator's words; [] if the run has not moved
    on (the same or an older history head). The same rule as console.js's ``runMoved``."""
    before, now = _parse(before_text), _parse(now_text)
    if before is None or now is None:
        return []
    head = int(now.get("head", 0)) - int(before.get("head", 0))
    if head <= 0:
        return []
    parts = []
    if (d := int(now["effects"]) - int(before["effects"])) > 0:
        parts.append(_n(d, "new effect"))
    if (d := int(before["unresolved"]) - int(now["unresolved"])) > 0:
        parts.append(_n(d, "effect") + " settled")
    if (d := int(now["checkpoints"]) - int(before["checkpoints"])) > 0:
        parts.append(_n(d, "new checkpoint"))
    if now["state"] != before["state"]:
        parts.append(f"state {before['state']} → {now['state']}")
    return parts or [_n(head, "new event")]
