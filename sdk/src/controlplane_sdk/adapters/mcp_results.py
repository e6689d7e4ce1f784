"""What the MCP gateway answers and records: tool errors written as sentences, a tool's result as
the ledger keeps it and a replay returns it, and where a run's positional call keys continue."""

from __future__ import annotations

from typing import Any

import mcp.types as types

from . import recorded

PAUSED = {"pausing", "paused", "revalidating"}
OVER = {"succeeded", "failed", "cancelled", "compensating", "compensated", "closed"}


def error(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=True)


def plain(result: types.CallToolResult) -> dict[str, Any]:
    """The tool's result as it goes on the wire (``structuredContent`` included), for the ledger."""
    return result.model_dump(mode="json", by_alias=True, exclude_none=True)


def replayed(name: str, fx: Any) -> types.CallToolResult:
    """What a replayed call answers: the result the tool returned when it committed."""
    stored = recorded(fx, "result")
    if isinstance(stored, dict) and "content" in stored:
        return types.CallToolResult.model_validate(stored)
    text = recorded(fx, "text")
    if text is not None:  # recorded by an older gateway: the text only
        return types.CallToolResult(content=[types.TextContent(type="text", text=str(text))])
    return error(
        f"{name} was already done by an earlier attempt (the ledger says committed), but its "
        "result was not recorded, so it cannot be shown again. It was not called a second time."
    )


def refusal_text(state: str, tool: str, why: str) -> str:
    """Why ``tool`` was not called in a run in ``state`` (``why``: the operator's reason)."""
    because = f" ({why})" if why else ""
    if state in PAUSED:
        return (
            f"The run is paused{because}. {tool} was not called. Call it again once an "
            "operator resumes the run."
        )
    if state in ("cancelling", "cancelled"):
        return f"The run was cancelled{because}. {tool} was not called."
    if state in OVER:
        return f"The run has ended ({state}). {tool} was not called."
    return (
        f"The run is {state} and this gateway does not hold it now. {tool} was not called; "
        "try again in a moment."
    )


def positions(effects: list[dict[str, Any]], prefix: str) -> dict[str, int]:
    """Where each tool's numbering continues (keys ``{prefix}{tool}:{n}``): after the last resolved
    call, or at the first call whose outcome the ledger does not know (a retry of that call is
    then the same effect, not a second one)."""
    done: dict[str, int] = {}
    open_: dict[str, int] = {}
    for e in effects:
        key = str(e.get("idempotency_key") or "")
        if not key.startswith(prefix) or e.get("decision") == "denied":
            continue
        tool, _, pos = key.removeprefix(prefix).rpartition(":")
        if not pos.isdigit():
            continue
        if e.get("status") in ("in_flight", "unknown"):
            open_[tool] = min(open_.get(tool, int(pos)), int(pos))
        else:
            done[tool] = max(done.get(tool, 0), int(pos))
    return {**{t: n + 1 for t, n in done.items()}, **open_}
