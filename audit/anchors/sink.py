"""Where anchors are kept: a sink the database cannot reach (a directory by default, ``ANCHOR_SINK``)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from django.conf import settings
from django.utils.module_loading import import_string


class DirectorySink:
    """One JSON line per anchor in ``ANCHOR_DIR/anchors.jsonl``, only ever opened O_APPEND: a line is
    written with one write() and fsynced, and nothing here rewrites, truncates or deletes the file."""

    filename = "anchors.jsonl"

    def __init__(self) -> None:
        self.path = Path(settings.ANCHOR_DIR) / self.filename

    def append(self, line: str) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
        try:
            os.write(fd, (line + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)

    def last(self) -> str | None:
        """The last line, read from the end of the file (the writer needs only that one)."""
        if not self.path.exists():
            return None
        with self.path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            end = fh.tell()
            start = max(0, end - 65536)
            while True:
                fh.seek(start)
                chunk = fh.read(end - start)
                lines = [x for x in chunk.split(b"\n") if x.strip()]
                if start == 0 or len(lines) > 1:
                    return lines[-1].decode("utf-8", "replace") if lines else None
                start = max(0, start - 4 * (end - start))

    def lines(self) -> Iterator[tuple[int, str]]:
        if not self.path.exists():
            return
        with self.path.open(encoding="utf-8", errors="replace") as fh:
            for number, text in enumerate(fh, start=1):
                if text.strip():
                    yield number, text


def sink() -> Any:
    """``ANCHOR_SINK``: dotted path of a class with ``append(line)`` and ``lines()`` (position, text)."""
    return import_string(settings.ANCHOR_SINK)()


def read_anchor_lines() -> Iterator[tuple[int, str]]:
    return sink().lines()
