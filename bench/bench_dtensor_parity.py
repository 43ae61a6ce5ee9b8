"""Bytes our sharding rules move against PyTorch DTensor's choices, op by op.

For each op of `tests/shardlab/spmd/dtensor_parity_cases.py` and every combination of
arriving input placements on a (2, 2) mesh, both sides' input reshard bytes per rank
(`tests/shardlab/spmd/dtensor_parity.py`): how often ours is cheaper (<), equal (=) or
dearer (>), how often we move more both ways (deferred all-reduces of Partial outputs
counted or not: "worse"), why (`dtensor_parity.REASONS`), and the largest excess of each
reason. Two scales: "toy" (a few KiB per tensor, where our 64 KiB per-collective latency
term decides) and "large" (about 1 MiB per rank, where bytes decide). Takes 10-15 minutes
on 2 cores: DTensor's propagation costs 5-200 ms per case, seconds where a _StridedShard
sends it to its graph-based redistribute planner.

`python -m bench.bench_dtensor_parity` prints the table; `--allowlist` prints the test's
allow-list of today's failing quick cases (`KNOWN` in test_dtensor_parity.py).
"""

from __future__ import annotations

import sys
import textwrap
import time
from collections import Counter
from dataclasses import dataclass, field

from bench.common import Section
from tests.shardlab.spmd import dtensor_parity as dp
from tests.shardlab.spmd.dtensor_parity_cases import all_cases

SCALES = ("toy", "large")
HEADER = ["scale", "op", "cases", "ours <", "=", ">", "worse", "deferral", "refused", "reasons"]


@dataclass
class Summary:
    """Counts of one scale: per case name, the verdicts; all worse records, worst first."""

    scale: str
    rows: dict[str, Counter[str]] = field(default_factory=dict)
    worse: list[dp.Record] = field(default_factory=list)
    refused: list[dp.Record] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def total(self) -> Counter[str]:
        out: Counter[str] = Counter()
        for counts in self.rows.values():
            out.update(counts)
        return out


def measure(scale: str = "toy", quick: bool = False) -> Summary:
    """Both sides for every case of `scale` (every combination unless `quick`)."""
    summary = Summary(scale)
    start = time.perf_counter()
    with dp.fake_world() as dmesh:
        for case in all_cases(quick=quick, scale=scale):
            dp._CACHE.pop(case.name, None)  # the cache is keyed by name, not by scale
            records = dp.evaluate(case, dmesh)
            counts: Counter[str] = Counter(cases=len(records))
            for r in records:
                if r.error:
                    counts["refused"] += 1
                    summary.refused.append(r)
                    continue
                counts[r.verdict] += 1
                counts["worse"] += r.worse
                counts["deferral"] += r.deferral
                if r.worse:
                    counts[f"reason {dp.reason(r)}"] += 1
                    summary.worse.append(r)
            summary.rows[case.name] = counts
            dp._CACHE.pop(case.name, None)
    summary.seconds = time.perf_counter() - start
    summary.worse.sort(key=lambda r: r.theirs_total - r.ours_total)  # largest excess first
    return summary


def worst_per_reason(summary: Summary) -> list[dp.Record]:
    """The case with the largest excess (both ways, the smaller of the two) per reason."""
    best: dict[str, dp.Record] = {}
    for r in summary.worse:
        key = dp.reason(r) or ""
        excess = min(r.ours_bytes - r.theirs_bytes, r.ours_total - r.theirs_total)
        if key not in best or excess > min(
            best[key].ours_bytes - best[key].theirs_bytes,
            best[key].ours_total - best[key].theirs_total,
        ):
            best[key] = r
    return [best[k] for k in sorted(best)]


def _reasons(counts: Counter[str]) -> str:
    found = sorted((k.split()[1], n) for k, n in counts.items() if k.startswith("reason "))
    return " ".join(f"{k}:{n}" for k, n in found)


def _row(scale: str, name: str, c: Counter[str]) -> list[str]:
    cells = [c["cases"], c["<"], c["="], c[">"], c["worse"], c["deferral"], c["refused"]]
    return [scale, name, *map(str, cells), _reasons(c)]


def run() -> Section:
    section = Section(
        "Sharding rules against DTensor's propagation (bytes per rank, (2, 2) mesh)", HEADER
    )
    for scale in SCALES:
        s = measure(scale)
        section.rows += [_row(scale, name, c) for name, c in s.rows.items()]
        t = s.total
        section.rows.append(_row(scale, "**all**", t))
        share = t["worse"] / max(t["cases"] - t["refused"], 1)
        section.notes.append(
            f"{scale}: {t['cases']} cases in {s.seconds:.0f} s; ours moves more both ways in "
            f"{t['worse']} ({share:.1%}); reasons: {_reasons(t)}; DTensor refused "
            f"{t['refused']}. The largest excess per reason:"
        )
        section.notes += [f"- ({dp.reason(r)}) `{r.describe()}`" for r in worst_per_reason(s)]
        section.notes.append("")
    section.notes.append(
        "Reasons: "
        + "; ".join(f"({k}) {v}" for k, v in dp.REASONS.items())
        + ". worse: more bytes both ways (with and without the all-reduce of a Partial "
        "output); deferral: more input bytes only because DTensor leaves a Partial output; "
        "refused: DTensor raised (e.g. a _StridedShard it cannot unflatten)."
    )
    return section


def _pack(items: list[str], width: int) -> list[str]:
    """`items` joined by spaces into lines of at most `width` characters (never split)."""
    lines: list[str] = []
    for item in items:
        if lines and len(lines[-1]) + 1 + len(item) <= width:
            lines[-1] += " " + item
        else:
            lines.append(item)
    return lines


def allowlist() -> str:
    """The test's KNOWN block for today's failing quick toy cases, grouped by reason."""
    s = measure("toy", quick=True)
    groups: dict[str, list[str]] = {}
    for r in sorted(s.worse, key=lambda r: r.id):
        groups.setdefault(dp.reason(r) or "", []).append(f'"{r.id}",')
    lines = ["# fmt: off", "KNOWN: dict[str, tuple[str, ...]] = {"]
    for key in sorted(groups):
        lines += [f"    # {line}" for line in textwrap.wrap(f"({key}) {dp.REASONS[key]}", 90)]
        lines.append(f'    "{key}": (')
        lines += [f"        {line}" for line in _pack(groups[key], 92)]
        lines.append("    ),")
    lines += ["}", "# fmt: on"]
    return "\n".join(lines)


if __name__ == "__main__":
    if "--allowlist" in sys.argv:
        print(allowlist())
    else:
        print(run().markdown())
