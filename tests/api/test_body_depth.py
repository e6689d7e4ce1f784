"""api.parser._depth: the body's nesting counted at C speed gives the byte-by-byte walk's answer on
every JSON text, and no body it lets through can make json.loads recurse out of the interpreter."""

from __future__ import annotations

import json
import random

import pytest
from django.test import RequestFactory

from api.parser import MAX_BODY_DEPTH, BodyRefused, StrictJsonParser, _depth


def walked_depth(raw: bytes) -> int:
    """The byte-by-byte walk the C-speed count replaced (the reference)."""
    depth = deepest = 0
    in_string = escaped = False
    for byte in raw:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:
                escaped = True
            elif byte == 0x22:
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):
            depth += 1
            deepest = max(deepest, depth)
        elif byte in (0x5D, 0x7D):
            depth -= 1
    return deepest


TRICKY = ['"', "\\", "[", "]", "{", "}", '\\"', "\\\\", '\\\\"', "a", "é"]


def _document(rng: random.Random, depth: int = 0):
    kind = rng.random()
    if depth > 70 or kind < 0.3:
        return "".join(rng.choice(TRICKY) for _ in range(rng.randrange(8)))
    if kind < 0.4:
        return rng.randrange(-5, 5)
    if kind < 0.7:
        return [_document(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {
        "".join(rng.choice(TRICKY) for _ in range(rng.randrange(4))) + str(i): _document(
            rng, depth + 1
        )
        for i in range(rng.randrange(4))
    }


def test_the_same_depth_as_the_walk_on_json_texts():
    rng = random.Random(24)
    for _ in range(400):
        raw = json.dumps(_document(rng), ensure_ascii=rng.random() < 0.5).encode()
        assert _depth(raw) == walked_depth(raw), raw[:200]
    for raw in (b"", b"{}", b"[[[", b"]]][[", b'"[[[', b'["]"]', b'"\\\\"[', b'{"a\\"[":[[1]]}'):
        assert _depth(raw) == walked_depth(raw), raw


def test_no_body_it_lets_through_recurses_out_of_the_parser():
    """Malformed text may be counted differently from the walk, never so low that json.loads
    recurses past the interpreter's limit (a 500) instead of refusing it: deep, valid prefixes full
    of escaped quotes and backslashes, cut off or ended with junk."""
    rng = random.Random(11)
    checked = 0
    for _ in range(40):
        levels = rng.choice([rng.randrange(50, 200), rng.randrange(10_000, 30_000)])
        pieces = []
        for _ in range(levels):
            text = "".join(rng.choice(TRICKY) for _ in range(rng.randrange(4)))
            pieces.append(rng.choice(["[", "{" + json.dumps(text) + ":"]))
            pieces.append(json.dumps(text) + "," if pieces[-1] == "[" else "")
        raw = "".join(pieces) + rng.choice(["", "]", '"', "\\", "}}}", '"\\"'])
        if _depth(raw.encode()) > MAX_BODY_DEPTH:
            continue
        checked += 1
        with pytest.raises(ValueError):
            json.loads(raw)
    assert 0 < checked < 40  # the deep ones were counted deep


@pytest.mark.parametrize("levels", [MAX_BODY_DEPTH, MAX_BODY_DEPTH + 1])
def test_the_limit_is_unchanged(levels):
    body = ('{"args": ' + "[" * (levels - 1) + "]" * (levels - 1) + "}").encode()
    request = RequestFactory().post("/", data=body, content_type="application/json")
    if levels <= MAX_BODY_DEPTH:
        assert StrictJsonParser().parse_body(request)["args"] is not None
    else:
        with pytest.raises(BodyRefused, match=f"deeper than {MAX_BODY_DEPTH} levels"):
            StrictJsonParser().parse_body(request)
