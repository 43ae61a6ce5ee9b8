"""Progress of a long command on stderr, so that stdout (a table, `--json`) stays clean.

The same `progress(fraction, message)` callback the service's jobs report through
(`worker.engine`): on a terminal one line, rewritten in place; otherwise (a log, a CI job)
a line per change, at most one every `every_s` seconds, and the last one always.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


class StderrProgress:
    """A `progress(fraction, message)` callback that writes `prefix: 42% message` lines to
    `stream` (stderr by default); call `close()` when the work is done."""

    def __init__(self, prefix: str, stream: TextIO | None = None, every_s: float = 2.0):
        self.prefix = prefix
        self.stream = stream if stream is not None else sys.stderr
        self.every_s = every_s
        self.live = bool(getattr(self.stream, "isatty", lambda: False)())
        self.last_s = float("-inf")
        self.pending: str | None = None
        self.width = 0

    def __call__(self, fraction: float, message: str) -> None:
        line = f"{self.prefix}: {max(0.0, min(1.0, fraction)):4.0%} {message}"
        now = time.monotonic()
        if now - self.last_s < self.every_s and fraction < 1.0:
            self.pending = line
            return
        self.last_s, self.pending = now, None
        self._write(line)

    def close(self) -> None:
        """Write the last line held back by the throttle; end a terminal's live line."""
        if self.pending is not None:
            self._write(self.pending)
            self.pending = None
        if self.live and self.width:
            self.stream.write("\n")
            self.stream.flush()
            self.width = 0

    def _write(self, line: str) -> None:
        if self.live:
            self.stream.write("\r" + line.ljust(self.width))
            self.width = len(line)
        else:
            self.stream.write(line + "\n")
        self.stream.flush()
