"""Lowering time of llama3-8b training graphs with 12, 96 and 192 layers on an 8x8 mesh.

Seed 000 reports 4.18 s -> 1.89 s for reshard insertion on a 12-layer model after removing
the per-insertion re-synchronisation; here lowering is one pass by construction. A quadratic
lowering would show a 96/12 time ratio near 64; a linear one near 8.

Python's per-op cost is not constant across sizes, though: a 12-layer training program and
its graph fit in a core's L2 cache, a 96-layer one does not, and backward ops read activations
that the forward produced thousands of ops earlier. The `walk` column times a loop that only
reads each op and its rule (no lowering at all): its ratio is the memory hierarchy's share,
so the lowering ratio divided by the walk ratio isolates the algorithm.
"""

from __future__ import annotations

import gc
import math
from collections.abc import Callable

from bench.common import Section, Timing, ms, time_it
from shardlab.autodiff import training_graph
from shardlab.lower import lower
from shardlab.models import build_model
from shardlab.spmd.complete import CompletedGraph, complete
from shardlab.strategy import Strategy

LAYERS = (12, 96, 192)


def _walk(done: CompletedGraph) -> Callable[[], int]:
    """The cheapest pass over the same data lowering reads: each op, its rule, its inputs."""

    def walk() -> int:
        n = 0
        for op in done.graph.ops:
            rule = done.rules[op.name]
            for v, need in zip(op.inputs, rule.input_specs, strict=True):
                n += done.specs[v] is need
        return n

    return walk


def _timed(fn: Callable[[], object], budget_s: float = 2.0) -> Timing:
    """Best of at least 7 runs (more for short ones: about `budget_s` of runs in all) with
    the garbage collector off, as `timeit` does. A 12-layer lowering takes ~15 ms, so its
    best-of-7 alone is at the mercy of a shared machine; equal time budgets give every size
    the same chance of an undisturbed run."""
    gc.collect()
    gc.disable()
    try:
        first = time_it(fn, repeat=1).best
        return time_it(fn, repeat=max(7, min(200, math.ceil(budget_s / max(first, 1e-6)))))
    finally:
        gc.enable()


def run() -> Section:
    section = Section(
        "Lowering (llama3-8b training graph, mesh dp=8,tp=8, dp + megatron_tp + "
        "sequence_parallel)",
        ["layers", "serial ops", "program ops", "comm ops", "lower (best)", "µs / program op",
         "reshards/s", "walk (best)"],
    )  # fmt: skip
    strategy = Strategy.build("dp=8,tp=8", ["dp", "megatron_tp", "sequence_parallel"])
    best: dict[int, float] = {}
    walk: dict[int, float] = {}
    for layers in LAYERS:
        done = complete(training_graph(build_model("llama3-8b", {"layers": layers})), strategy)
        program = lower(done)
        t = _timed(lambda d=done: lower(d))  # type: ignore[misc]
        w = _timed(_walk(done))
        best[layers], walk[layers] = t.best, w.best
        comm = sum(1 for op in program.ops if op.is_comm)
        section.rows.append(
            [
                str(layers),
                str(len(done.graph.ops)),
                str(len(program.ops)),
                str(comm),
                ms(t.best),
                f"{t.best / len(program.ops) * 1e6:.2f}",
                f"{comm / t.best:,.0f}",
                ms(w.best),
            ]
        )
    lower_ratio, walk_ratio = best[96] / best[12], walk[96] / walk[12]
    section.notes.append(
        f"96/12 lowering time = {lower_ratio:.2f} (8.00 is linear; acceptance bound 8.8); "
        f"192/96 = {best[192] / best[96]:.2f} (2.00 is linear). The read-only walk over the "
        f"same graphs has 96/12 = {walk_ratio:.2f}: the extra over 8 is the memory hierarchy "
        f"(L2 spill), not the algorithm; lowering / walk = {lower_ratio / walk_ratio:.2f}. "
        "All figures from the same run. Seed 000 reported 4.18 s -> 1.89 s for 12 layers in "
        "Paddle."
    )
    return section
