"""The SDK package's shape: no two of its modules import each other (not even for type checking,
not even through a longer circle), the core imports without Django or any framework, and it imports
fast (an agent process pays it at every start)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "sdk" / "src"
PACKAGE = "controlplane_sdk"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, modules: set[str]) -> set[str]:
    """Every SDK module ``path`` imports, anywhere in the file (TYPE_CHECKING blocks included)."""
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            # ``from pkg import name``: the submodule pkg.name if there is one, else pkg itself
            names = [
                f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names
            ]
        else:
            continue
        found |= {n for n in names if n in modules and n != me}
    return found


def test_no_module_of_the_sdk_is_in_an_import_circle():
    files = sorted(SRC.rglob("*.py"))
    modules = {module_name(p) for p in files}
    graph = {module_name(p): imports(p, modules) for p in files}
    circles: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        for nxt in sorted(graph[node]):
            if nxt in path:
                circles.append(path[path.index(nxt) :] + [nxt])
            elif len(path) < len(graph):
                visit(nxt, path + [nxt])

    for start in sorted(graph):
        visit(start, [start])
    assert not circles, "import circles:\n" + "\n".join(" -> ".join(c) for c in circles[:10])


def run_python(code: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    return out.stdout


def test_the_core_imports_without_django_or_a_framework():
    loaded = json.loads(
        run_python("import sys, json, controlplane_sdk; print(json.dumps(sorted(sys.modules)))")
    )
    heavy = {"django", "langgraph", "agents", "mcp", "langchain_core", "pydantic"}
    assert not heavy & {m.split(".")[0] for m in loaded}


def test_the_core_imports_in_under_100_ms():
    # The SDK's own cost in CPU time (a loaded machine stretches wall time, not the work), best
    # of five fresh interpreters. Its one
    # dependency, httpx, is imported first: its time is the environment's (it grows with optional
    # extras such as rich), and an agent that talks HTTP pays it anyway.
    code = (
        "import time, httpx; t = time.process_time(); import controlplane_sdk, "
        "controlplane_sdk.testing; print(time.process_time() - t)"
    )
    best = min(float(run_python(code)) for _ in range(5))
    assert best < 0.100, f"import controlplane_sdk took {best * 1000:.0f} ms"
