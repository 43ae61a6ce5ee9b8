"""Planning at the scale people train at: repeated layers and micro-batches folded.

Each case runs 3 times, each in a fresh process (`bench.scale_case`): the median seconds and
the largest peak RSS are reported, with the goal of issue 16. Every case is also run at a
second size in the same run (more layers or more micro-batches) to show how it grows.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from dataclasses import dataclass

from bench.common import Section

RUNS = 3


@dataclass(frozen=True)
class Case:
    label: str
    name: str  # bench.scale_case CASES key
    bigger: str  # the same case at a second size
    growth: str  # what the second size changes
    goal_s: float
    goal_rss_mb: float | None = None
    ratio_goal: float | None = None  # goal on bigger / name instead of seconds


CASES = [
    Case("llama3-8b, dp=8,tp=8 + sequence_parallel, h100-sxm-8x8: whole `build_plan` with "
         "costing", "llama8b-32", "llama8b-64", "32 -> 64 layers", 1.0),
    Case("llama3-70b, pp=8,dp=8,tp=8, 1F1B, 16 micro-batches, h100-sxm-64x8: schedule "
         "simulation alone", "llama70b-schedule-16", "llama70b-schedule-64",
         "16 -> 64 micro-batches", 0.05),
    Case("GPT 175B (hidden 12288, 96 layers, 96 heads, seq 2048), pp=8,tp=8, interleaved v=3, "
         "64 micro-batches, 64 A100: whole plan", "gpt175b-64", "gpt175b-128",
         "64 -> 128 micro-batches", 5.0),
    Case("GPT 1T (hidden 25600, 128 layers, 160 heads, seq 2048), pp=64,tp=8, 1F1B, 512 "
         "micro-batches, 512 A100: whole plan", "gpt1t-512", "gpt1t-256",
         "512 -> 256 micro-batches", 10.0, 1024.0),
    Case("llama3-8b forward, 32 layers against 320 layers: completion time ratio (cold)",
         "completion-32", "completion-320", "32 -> 320 layers", 0.0, ratio_goal=1.5),
]  # fmt: skip


def run_case(name: str) -> list[dict[str, float]]:
    """`RUNS` fresh-process runs of one case."""
    out = []
    for _ in range(RUNS):
        done = subprocess.run(
            [sys.executable, "-m", "bench.scale_case", name],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        out.append(json.loads(done.stdout.strip().splitlines()[-1]))
    return out


def _median(runs: list[dict[str, float]], key: str = "seconds") -> float:
    return statistics.median(r[key] for r in runs)


def _rss(runs: list[dict[str, float]]) -> float:
    return max(r["rss_mb"] for r in runs)


def _time(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


def run() -> Section:
    section = Section(
        "Planning at scale (repeated layers and micro-batches folded; median of 3 fresh processes)",
        ["case", "time", "peak RSS", "goal", "met", "at a second size", "growth"],
    )
    for case in CASES:
        small, big = run_case(case.name), run_case(case.bigger)
        t_small, t_big = _median(small), _median(big)
        if case.ratio_goal is not None:
            ratio = t_big / t_small
            met = ratio <= case.ratio_goal
            time_cell = f"{_time(t_small)} / {_time(t_big)} = ratio {ratio:.2f}"
            goal = f"ratio ≤ {case.ratio_goal}"
            extra = (f"structure index (built once per graph, apart): "
                     f"{_time(_median(small, 'index_s'))} / {_time(_median(big, 'index_s'))}; "
                     f"folded segments {int(big[0]['folded'])}")  # fmt: skip
        else:
            met = t_small <= case.goal_s
            if case.goal_rss_mb is not None:
                met = met and _rss(small) <= case.goal_rss_mb
            time_cell = _time(t_small)
            goal = f"≤ {_time(case.goal_s)}" + (
                f", ≤ {case.goal_rss_mb / 1024:.0f} GB RSS" if case.goal_rss_mb else ""
            )
            extra = f"{_time(t_big)}, {_rss(big):.0f} MB"
        section.rows.append([
            case.label, time_cell, f"{_rss(small):.0f} MB", goal, "yes" if met else "**no**",
            extra, f"{case.growth}: x{t_big / t_small:.2f} time",
        ])  # fmt: skip
    section.notes.append(
        "Peak RSS is the whole process's (Python, numpy and the engine's imports take about "
        "35 MB). Completion folds repeated layers (`shardlab.spmd.folding`): a layer whose "
        "inputs arrive as its twin's did takes the twin's results, so its time grows with the "
        "distinct situations, not the layers. Pipelines cost each stage's units once and lay "
        "the micro-batches out as slots (`cost.pipeline_slots`)."
    )
    return section
