"""docs/: the state table page is rendered from runs/states.py, and the site builds strictly (a broken
link, anchor or image fails)."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

from runs import states

ROOT = Path(__file__).resolve().parents[2]


def _hook():
    spec = importlib.util.spec_from_file_location("state_table", ROOT / "docs/hooks/state_table.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_state_page_lists_every_edge_of_the_table():
    page = (ROOT / "docs/concepts/states.md").read_text()
    rendered = _hook().on_page_markdown(page)
    assert "<!-- states:" not in rendered
    for row in states.as_table():
        guard = f"`{row['guard']}`" if row["guard"] else ""
        assert f"| `{row['from']}` | `{row['event']}` | `{row['to']}` | {guard} |" in rendered
    for state, directive in states.DIRECTIVES.items():
        assert f"| `{state.value}` | `{directive}` |" in rendered


def test_a_page_without_markers_is_left_alone():
    assert _hook().on_page_markdown("# x\n\nno table here\n") == "# x\n\nno table here\n"


def test_the_operator_guide_shows_only_screenshots_that_exist():
    page = (ROOT / "docs/operator/scenarios.md").read_text()
    for name in sorted(p.name for p in (ROOT / "docs/img").glob("scenario-*.png")):
        assert f"../img/{name}" in page, f"{name} is committed but not shown"


def test_the_site_builds_strictly(tmp_path):
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent))  # the dev extra has it
    assert mkdocs, "mkdocs is not installed beside this Python: make venv"
    proc = subprocess.run(
        [mkdocs, "build", "--strict", "--quiet", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    html = (tmp_path / "site/concepts/states/index.html").read_text()
    assert "<code>needs_attention</code>" in html
