"""console/templatetags/console_tags.py: human times, copyable ids, recorded values as tables."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from django.template import Context, Template

from console.templatetags.console_tags import copyable_id, reltime, value_table

NOW = datetime(2026, 12, 1, 14, 0, 0, 123456, tzinfo=UTC)


@pytest.mark.parametrize(
    ("value", "said"),
    [
        (NOW - timedelta(seconds=42, microseconds=5), "42 s ago"),
        ((NOW - timedelta(minutes=3)).isoformat(), "3 min ago"),
        ((NOW - timedelta(hours=2, minutes=5)).isoformat().replace("+00:00", "Z"), "2 h 5 min ago"),
        (NOW + timedelta(minutes=59, seconds=30), "in 59 min"),
        ((NOW - timedelta(days=3)).timestamp(), "3 d ago"),  # epoch seconds
        ((NOW - timedelta(seconds=5)).timestamp() * 1000, "5 s ago"),  # epoch milliseconds
        (NOW - timedelta(days=90), "2026-09-02"),
    ],
)
def test_it_says_times_relative_with_the_absolute_utc_time_on_hover(value, said):
    html = str(reltime(value, now=NOW))
    assert f">{said}</time>" in html
    assert re.search(r'datetime="\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ" title="[\d-]+ [\d:]+ UTC"', html)
    assert not re.search(r"\d\d:\d\d:\d\d\.\d", html)  # never microseconds


def test_it_leaves_what_is_not_a_time_as_it_is():
    assert "—" in str(reltime(None)) and "soon" in str(reltime("soon"))


def test_a_copyable_id_shows_8_characters_and_carries_the_full_id():
    full = "3f2a1b4c-0000-4000-8000-000000000001"
    html = str(copyable_id(full))
    assert f'<code class="id" title="{full}">3f2a1b4c</code>' in html
    assert f'data-copy="{full}"' in html and 'class="copy"' in html


def test_a_recorded_value_is_a_table_with_long_and_nested_values_folded_and_escaped():
    html = str(
        value_table(
            {
                "code": "1.0.0",
                "tools": {"payments": "3.1", "inventory": "2.0"},
                "note": "x" * 200,
                "html": "<script>alert(1)</script>",
                "at": "2026-12-01T13:59:00.654321+00:00",
                "run": "3f2a1b4c-0000-4000-8000-000000000001",
            }
        )
    )
    assert '<table class="kvt">' in html and '<th scope="row">code</th><td>1.0.0</td>' in html
    assert '<details class="fold"><summary>2 fields: payments, inventory</summary>' in html
    assert html.count("<details") == 2  # the nested versions and the long note
    assert "<script>" not in html and "&lt;script&gt;" in html
    assert "<time datetime=" in html and ".654321" not in html
    assert 'data-copy="3f2a1b4c-0000-4000-8000-000000000001"' in html
    assert "{'" not in html and "{&#x27;" not in html  # no Python dict text


def test_the_tags_are_builtins_every_template_can_use():
    html = Template("{% reltime when %} {% copyable_id id %} {% value_table v %}").render(
        Context({"when": NOW, "id": "abcdef123456", "v": {"a": [1, 2]}})
    )
    assert "<time" in html and "abcdef12" in html and "1, 2" in html


def test_a_presented_value_is_drawn_in_one_pass_with_everything_escaped():
    from console.common import present

    full = "3f2a1b4c-0000-4000-8000-000000000001"
    node = present(
        {
            "who": "<b>x</b>",
            "ok": False,
            "none": None,
            "empty": [],
            "id": full,
            "at": "2026-12-01T13:00:00Z",
            "rows": [{"a": 1, "b": "two"}, {"a": 3}],
            "items": [1, {"deep": "y"}],
        }
    )
    html = Template("{% include 'console/_value.html' with node=node %}").render(
        Context({"node": node})
    )
    assert html.startswith('<dl class="kv"><dt>who</dt><dd>&lt;b&gt;x&lt;/b&gt;</dd>')
    assert "<dt>ok</dt><dd>no</dd>" in html
    assert '<dt>none</dt><dd><span class="muted">—</span></dd>' in html
    assert '<dt>empty</dt><dd><span class="muted">none</span></dd>' in html
    assert f'data-copy="{full}"' in html and ">3f2a1b4c</code>" in html
    assert '<time datetime="2026-12-01T13:00:00Z"' in html
    assert (
        '<table class="vals"><thead><tr><th>a</th><th>b</th></tr></thead><tbody>'
        '<tr><td>1</td><td>two</td></tr><tr><td>3</td><td><span class="muted">—</span></td></tr>'
        "</tbody></table>"
    ) in html
    assert (
        '<ul class="vals"><li>1</li><li><dl class="kv"><dt>deep</dt><dd>y</dd></dl></li></ul>'
        in html
    )
    assert Template("{% value_tree None %}").render(Context()) == ""
