"""The console reads through selectors: no console module builds a query of its own.

Selectors (``runs/selectors.py``, ``runs/search.py``, ``interventions/selectors.py``,
``audit/selectors.py``) are the only readers (docs/concepts/architecture.md); a page that queried
models itself would be a second reader nobody reviews with the others. The check is syntactic: a
manager (``.objects``) or a queryset-building method anywhere in ``console/``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import console

QUERY_METHODS = {
    "filter",
    "exclude",
    "order_by",
    "select_related",
    "prefetch_related",
    "annotate",
    "aggregate",
    "defer",
    "only",
    "select_for_update",
    "raw",
    "extra",
}


def query_sites(source: str) -> list[tuple[int, str]]:
    sites = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr == "objects":
            sites.append((node.lineno, ".objects"))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in QUERY_METHODS
        ):
            sites.append((node.lineno, f".{node.func.attr}()"))
    return sites


def test_the_check_sees_a_query():
    assert sorted(query_sites("Run.objects.filter(pk=1)")) == [(1, ".filter()"), (1, ".objects")]
    assert query_sites("qs = run.effects.order_by('-seq')") == [(1, ".order_by()")]
    assert query_sites("x = pending.values()") == []


def test_console_modules_build_no_query():
    root = Path(console.__file__).parent
    found = [
        f"{path.relative_to(root.parent)}:{line}: {what}"
        for path in sorted(root.rglob("*.py"))
        for line, what in query_sites(path.read_text())
    ]
    assert found == [], "console modules must read through selectors:\n" + "\n".join(found)
