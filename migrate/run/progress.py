"""A one-line progress bar on stderr for large trees, drawn only on a terminal (never in logs or pre-commit)."""

from __future__ import annotations

import os
import time
from typing import TextIO


def is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


class Progress:
    """A one-line bar on stderr for large trees, only when stderr is a terminal (never in logs or pre-commit)."""

    THRESHOLD = 50

    def __init__(self, total: int, stream: TextIO):
        self.total, self.stream, self.done, self.drawn = total, stream, 0, 0.0
        self.active = total >= self.THRESHOLD and is_terminal(stream) and os.environ.get("TERM") != "dumb"

    def __enter__(self) -> Progress:
        self._draw()
        return self

    def __exit__(self, *exc: object) -> None:
        self.clear()

    def advance(self) -> None:
        self.done += 1
        self._draw()

    def say(self, message: str) -> None:
        """Print a line above the bar."""
        self.clear()
        print(message, file=self.stream, flush=True)
        self.drawn = 0.0
        self._draw()

    def clear(self) -> None:
        if self.active:
            self.stream.write("\r\033[K")
            self.stream.flush()

    def _draw(self) -> None:
        if self.active and (self.done in (0, self.total) or time.monotonic() - self.drawn > 0.1):
            self.drawn = time.monotonic()
            filled = 30 * self.done // max(self.total, 1)
            self.stream.write(f"\rdpmigrate [{'#' * filled}{'.' * (30 - filled)}] {self.done}/{self.total} files")
            self.stream.flush()
