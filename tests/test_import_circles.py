"""No two modules of the project import each other, directly or around a loop.

grimp (import-linter's engine) reads every import statement, including those inside functions and
under ``if TYPE_CHECKING:``, so a circle hidden in a function body or a type hint counts too. The
layering contracts (pyproject.toml, ``lint-imports``) keep packages in order; this keeps modules
inside one package from leaning on each other.
"""

from __future__ import annotations

import grimp

PACKAGES = (
    "controlplane",
    "console",
    "api",
    "interventions",
    "runs",
    "audit",
    "core",
    "world",
    "demo",
    "demo_agents",
    "bench",
    "controlplane_sdk",
)

# Circles other engineers of issue 17 are removing on their own branches. Remove each entry once its
# branch is merged: the test then holds the line for those modules too.
KNOWN: dict[frozenset[str], str] = {}
KNOWN_PREFIXES: dict[str, str] = {}


def circles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append(
                        (child, iter(sorted(graph.find_modules_directly_imported_by(child))))
                    )
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def _known(component: list[str]) -> bool:
    if any(set(component) <= known for known in KNOWN):
        return True
    return any(all(m.startswith(p) for m in component) for p in KNOWN_PREFIXES)


def test_circles_finds_a_loop_of_three_and_ignores_a_chain():
    graph = grimp.ImportGraph()
    for importer, imported in (("p.a", "p.b"), ("p.b", "p.c"), ("p.c", "p.a"), ("p.c", "p.d")):
        graph.add_import(importer=importer, imported=imported)
    assert circles(graph) == [["p.a", "p.b", "p.c"]]


def test_no_two_modules_import_each_other():
    graph = grimp.build_graph(*PACKAGES, include_external_packages=False, cache_dir=None)
    found = [c for c in circles(graph) if not _known(c)]
    assert found == [], (
        "import circles (each a set of modules that reach each other):\n"
        + "\n".join(" <-> ".join(c) for c in found)
    )
