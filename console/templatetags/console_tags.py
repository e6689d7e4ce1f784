"""Template tags every console page shares: human times, copyable ids, recorded values as tables.

They are template builtins (settings.TEMPLATES OPTIONS), so no template needs ``{% load %}``.

- ``{% reltime value %}``: "3 min ago" in a ``<time>`` whose ``title`` is the absolute UTC time and
  whose ``datetime`` is machine-readable. Accepts a datetime, an ISO string or an epoch number.
  Never shows microseconds.
- ``{% copyable_id value %}``: the first 8 characters, the full id in ``title``, and a copy button
  (static/console/console.js copies ``data-copy``); the markup of console/templates/console/_id.html.
- ``{% value_table value %}``: a recorded JSON value (args, versions, a checkpoint state) as a
  key/value table; long text and nested values fold into ``<details>``; ids and times as above.
  It masks what core.redaction masks (a tool adapter's own rules: interventions.registry.redact).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from django import template
from django.utils import timezone
from django.utils.html import escape, format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

from core.redaction import redact
from core.times import is_unreadable, time_text_problem

register = template.Library()

ISO_RE = re.compile(r"^\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(:\d{2}(\.\d+)?)?(Z|[+-]\d{2}:?\d{2})?$")
UUID_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
FOLD_AT = 80  # characters: longer text folds behind its first line
MAX_DEPTH = 6


def as_datetime(value: Any) -> datetime | None:
    """A datetime from what records hold: a datetime, an ISO 8601 string, or epoch seconds (or ms)."""
    if isinstance(value, datetime):
        return value if timezone.is_aware(value) else value.replace(tzinfo=UTC)
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        seconds = value / 1000 if value > 1e11 else value
        try:
            return datetime.fromtimestamp(seconds, tz=UTC)
        except (OverflowError, OSError, ValueError):
            return None
    if isinstance(value, str) and ISO_RE.match(value.strip()):
        if time_text_problem(value):  # outside what Python can convert: shown as plain text
            return None
        try:
            parsed = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError:
            return None
        return parsed if timezone.is_aware(parsed) else parsed.replace(tzinfo=UTC)
    return None


# Keys under which external systems record a time as epoch seconds (the world's ``"at": 1764651234.5``).
TIME_KEY = re.compile(r"(^|_)(at|ts|time|timestamp)$")


def epoch_at(key: Any, value: Any) -> bool:
    """A number recorded under a time's key that reads as epoch seconds: drawn as a time, never raw."""
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and bool(TIME_KEY.search(str(key)))
        and 1e9 <= value < 1e11
    )


def looks_like_time(value: Any) -> bool:
    return isinstance(value, (str, datetime)) and as_datetime(value) is not None


def _span(seconds: float) -> str:
    s = int(abs(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min"
    if s < 86400:
        h, m = divmod(s // 60, 60)
        return f"{h} h {m} min" if m and h < 10 else f"{h} h"
    return f"{s // 86400} d"


def relative(when: datetime, now: datetime | None = None) -> str:
    delta = ((now or timezone.now()) - when).total_seconds()
    if abs(delta) < 2:
        return "just now"
    if abs(delta) > 30 * 86400:
        return when.astimezone(UTC).strftime("%Y-%m-%d")
    return f"{_span(delta)} ago" if delta > 0 else f"in {_span(delta)}"


@register.simple_tag
def reltime(value: Any, now: datetime | None = None) -> SafeString:
    if is_unreadable(value):  # core.times: a stored time Python cannot hold; say so, never fail
        return format_html(
            '<span class="unreadable-time" title="stored as {}">unreadable time</span>',
            value.stored,
        )
    when = as_datetime(value)
    if when is None:
        return format_html('<span class="muted">{}</span>', "—" if value in (None, "") else value)
    utc = when.astimezone(UTC).replace(microsecond=0)
    return format_html(
        '<time datetime="{}" title="{}">{}</time>',
        utc.strftime("%Y-%m-%dT%H:%M:%SZ"),
        utc.strftime("%Y-%m-%d %H:%M:%S UTC"),
        relative(when, now),
    )


@register.simple_tag
def copyable_id(value: Any, length: int = 8, url: str = "") -> SafeString:
    """The same markup as console/templates/console/_id.html (static/console/console.js copies ``data-copy``)."""
    if value in (None, ""):
        return format_html('<span class="muted">{}</span>', "—")
    full = str(value)
    code = format_html('<code class="id" title="{}">{}</code>', full, full[:length])
    if url:
        code = format_html('<a href="{}">{}</a>', url, code)
    # The glyph is drawn by CSS (static/console/theme.css button.copy::before).
    return format_html(
        '{}<button type="button" class="copy" data-copy="{}" title="copy {}" aria-label="copy id">'
        "</button>",
        code,
        full,
        full,
    )


def _text(value: str) -> SafeString:
    if UUID_RE.match(value):
        return copyable_id(value)
    if looks_like_time(value):
        return reltime(value)
    if len(value) > FOLD_AT or "\n" in value:
        first = value.splitlines()[0][:60] if value.strip() else value[:60]
        return format_html(
            '<details class="fold"><summary>{}…</summary><pre class="wrap">{}</pre></details>',
            first,
            value,
        )
    return format_html("{}", value)


def _scalar(value: Any) -> SafeString:
    if value is None:
        return format_html('<span class="muted">{}</span>', "—")
    if isinstance(value, bool):
        return format_html("{}", "yes" if value else "no")
    if isinstance(value, (UUID, datetime)):
        return _text(str(value)) if isinstance(value, UUID) else reltime(value)
    return _text(str(value))


def _is_flat(value: Any) -> bool:
    return not isinstance(value, (dict, list, tuple))


def render_value(value: Any, depth: int = 0) -> SafeString:
    """One value as HTML: scalars inline, dicts as key/value tables, lists of records as tables."""
    if depth > MAX_DEPTH:
        return _text(str(value))
    if isinstance(value, dict):
        if not value:
            return format_html('<span class="muted">{}</span>', "none")
        rows = format_html_join(
            "",
            '<tr><th scope="row">{}</th><td>{}</td></tr>',
            (
                (str(k).replace("_", " "), reltime(v) if epoch_at(k, v) else _nested(v, depth))
                for k, v in value.items()
            ),
        )
        return format_html('<table class="kvt"><tbody>{}</tbody></table>', rows)
    if isinstance(value, (list, tuple)):
        if not value:
            return format_html('<span class="muted">{}</span>', "none")
        if all(_is_flat(v) for v in value):
            joined = ", ".join("—" if v is None else str(v) for v in value)
            if len(joined) <= FOLD_AT and not any(
                isinstance(v, str) and (UUID_RE.match(v) or looks_like_time(v)) for v in value
            ):
                return format_html("{}", joined)
            items = format_html_join("", "<li>{}</li>", ((_scalar(v),) for v in value))
            return format_html('<ul class="vals">{}</ul>', items)
        if all(isinstance(v, dict) and v and all(_is_flat(x) for x in v.values()) for v in value):
            cols = list(dict.fromkeys(k for v in value for k in v))
            head = format_html_join("", "<th>{}</th>", ((str(c).replace("_", " "),) for c in cols))
            body = format_html_join(
                "",
                "<tr>{}</tr>",
                (
                    (format_html_join("", "<td>{}</td>", ((_scalar(v.get(c)),) for c in cols)),)
                    for v in value
                ),
            )
            return format_html(
                '<table class="vals"><thead><tr>{}</tr></thead><tbody>{}</tbody></table>',
                head,
                body,
            )
        items = format_html_join("", "<li>{}</li>", ((render_value(v, depth + 1),) for v in value))
        return format_html('<ul class="vals">{}</ul>', items)
    return _scalar(value)


def _nested(value: Any, depth: int) -> SafeString:
    """A nested record folds behind a one-line summary; a flat value shows as it is."""
    if isinstance(value, dict) and value:
        summary = f"{len(value)} field{'s' if len(value) != 1 else ''}: " + ", ".join(
            str(k) for k in list(value)[:4]
        )
        return format_html(
            '<details class="fold"><summary>{}</summary>{}</details>',
            summary,
            render_value(value, depth + 1),
        )
    if isinstance(value, (list, tuple)) and value and not all(_is_flat(v) for v in value):
        return format_html(
            '<details class="fold"><summary>{} item{}</summary>{}</details>',
            len(value),
            "s" if len(value) != 1 else "",
            render_value(value, depth + 1),
        )
    return render_value(value, depth + 1)


@register.simple_tag
def value_table(value: Any) -> SafeString:
    return render_value(redact(value))  # core.redaction: masked by key and by value before drawn


@register.simple_tag
def value_tree(node: dict[str, Any]) -> SafeString:
    """A tree of console.common.present() as HTML (console/templates/console/_value.html is this tag): the markup
    the recursive template drew, built in one pass here (an include per node cost a page with a
    timeline of 50 entries more than the rest of its timeline)."""
    out: list[str] = []
    _tree(node, out)
    return mark_safe("".join(out))


def _tree(node: Any, out: list[str]) -> None:
    if not isinstance(node, dict):
        return  # what the template drew for a missing node: nothing
    t = node.get("t")
    if t == "dict":
        out.append('<dl class="kv">')
        for label, child in node["items"]:
            out.append(f"<dt>{escape(label)}</dt><dd>")
            _tree(child, out)
            out.append("</dd>")
        out.append("</dl>")
    elif t == "table":
        out.append('<table class="vals"><thead><tr>')
        out.extend(f"<th>{escape(c)}</th>" for c in node["cols"])
        out.append("</tr></thead><tbody>")
        for row in node["rows"]:
            out.append("<tr>")
            for cell in row:
                out.append("<td>")
                _tree(cell, out)
                out.append("</td>")
            out.append("</tr>")
        out.append("</tbody></table>")
    elif t == "list":
        out.append('<ul class="vals">')
        for child in node["items"]:
            out.append("<li>")
            _tree(child, out)
            out.append("</li>")
        out.append("</ul>")
    elif t == "id":
        out.append(copyable_id(node["v"]))
    elif t == "time":
        out.append(reltime(node["v"]))
    elif t == "bool":
        out.append("yes" if node["v"] else "no")
    elif t == "none":
        out.append('<span class="muted">—</span>')
    elif t == "empty":
        out.append('<span class="muted">none</span>')
    else:
        out.append(escape(node.get("v", "")))


@register.filter
def effect_name(row: Any) -> str:
    """``tool:action`` of an effect row (a dict or a model)."""
    get = row.get if isinstance(row, dict) else lambda k, d="": getattr(row, k, d)
    return f"{get('tool', '')}:{get('action', '')}"


@register.simple_tag
def nothing() -> SafeString:
    return mark_safe('<span class="muted">none</span>')
