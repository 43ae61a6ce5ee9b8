"""Shared helpers for benchmarks: timing and the result section type."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class Section:
    """One benchmark's part of docs/performance.md: a table and notes."""

    title: str
    header: list[str]
    rows: list[list[str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def markdown(self) -> str:
        lines = [f"## {self.title}", ""]
        lines.append("| " + " | ".join(self.header) + " |")
        lines.append("|" + "|".join("---" for _ in self.header) + "|")
        lines += ["| " + " | ".join(row) + " |" for row in self.rows]
        if self.notes:
            lines.append("")
            lines += self.notes
        return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class Timing:
    """Wall-clock seconds of repeated runs."""

    best: float
    median: float
    runs: int


def time_it(fn: Callable[[], object], repeat: int = 5) -> Timing:
    """Run `fn` `repeat` times; best and median wall-clock seconds."""
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return Timing(min(samples), statistics.median(samples), repeat)


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"
