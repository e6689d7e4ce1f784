"""The "run changed since this preview" note's rule (console/run_moved.py; console.js applies the same
one to the pushed run header)."""

from __future__ import annotations

import json

from console.run_moved import moved


def basis(**over) -> str:
    value = {"state": "running", "effects": 3, "unresolved": 1, "checkpoints": 2, "head": 10}
    return json.dumps(value | over)


def test_counts_what_moved_in_the_operators_words():
    now = basis(effects=5, unresolved=0, checkpoints=3, state="pausing", head=16)
    assert moved(basis(), now) == [
        "2 new effects",
        "1 effect settled",
        "1 new checkpoint",
        "state running → pausing",
    ]


def test_a_move_with_nothing_counted_is_named_by_its_events():
    assert moved(basis(), basis(head=13)) == ["3 new events"]


def test_the_same_or_an_older_head_has_not_moved():
    # a header drawn before the preview (an older head) must not say the run changed
    assert moved(basis(), basis()) == []
    assert moved(basis(head=12), basis(head=11, effects=9)) == []


def test_a_basis_it_cannot_read_says_nothing():
    assert moved("", basis()) == [] and moved("not json", basis()) == []
    assert moved("[1, 2]", basis()) == []
