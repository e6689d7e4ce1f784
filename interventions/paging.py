"""Previews and receipts stay small whatever the tree or the ledger: a list of children or effects
shows its first ``RECEIPT_PAGE_ITEMS`` rows, the total, a digest of the whole list and where to read
the rest. Unpaged, a pause of a 1,500-child tree answered 707 KB (docs/operations/big-trees.md).

The digest keeps a preview honest: the preview digest (interventions/base.py) hashes what was shown,
and a change to a row past the first page changes ``<name>_digest``, so a confirm of a stale preview
is still refused."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from django.conf import settings


def page_size() -> int:
    return max(int(getattr(settings, "RECEIPT_PAGE_ITEMS", 50)), 1)


def paged(name: str, rows: list[dict[str, Any]], more: str) -> dict[str, Any]:
    """``{name: first page, name_total, name_digest, name_more}``; ``more`` is the link to the whole
    list, given only when there is more than the first page."""
    k = page_size()
    text = json.dumps(rows, sort_keys=True, default=str)
    return {
        name: rows[:k],
        f"{name}_total": len(rows),
        f"{name}_digest": hashlib.sha256(text.encode()).hexdigest()[:16],
        f"{name}_more": more if len(rows) > k else None,
    }


def children_link(run_id: Any) -> str:
    return f"/api/v1/runs/{run_id}/tree?after={page_size()}"


def receipt_children_link(intervention_id: Any) -> str:
    return f"/api/v1/interventions/{intervention_id}/children?after={page_size()}"


def ledger_link(run_id: Any, status: str) -> str:
    return f"/api/v1/runs/{run_id}/effects?status={status}"
