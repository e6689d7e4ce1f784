"""The MCP gateway declares upstream tools under the server's canonical names (issue 19, core/names.py
on the server): a camelCase or spaced MCP tool name would otherwise be refused with a 422."""

from __future__ import annotations

from controlplane_sdk.adapters.mcp_gateway import canonical_name
from core.names import name_problem


def test_mcp_tool_names_are_declared_in_the_servers_canonical_form():
    for raw, want in [
        ("getWeather", "getweather"),
        ("search/web", "search_web"),
        ("Send Email", "send_email"),
        ("refund", "refund"),
    ]:
        assert canonical_name(raw) == want
        assert name_problem(canonical_name(raw)) is None
