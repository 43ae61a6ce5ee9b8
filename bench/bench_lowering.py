"""Lowering time of llama3-8b training graphs with 12, 96 and 192 layers on an 8x8 mesh.

Seed 000 reports 4.18 s -> 1.89 s for reshard insertion on a 12-layer model after removing
the per-insertion re-synchronisation; here lowering is one pass by construction. A quadratic
lowering would show a 96/12 time ratio near 64; a linear one near 8.

Each timed run starts with cold caches: a buffer three times the size of the last-level
cache is written first. That is how lowering runs in the service (once per plan, right after
completion has filled the caches with other data), and it gives every size the same start.
Timing the same lowering back to back ("warm") flatters small graphs: a 12-layer graph, its
completion and its program (about 4.4 MB by tracemalloc) stay in the 32 MiB L3 that this
machine's other tenants share too, a 96-layer one (about 29 MB) does not, so the warm 96/12
ratio is about 10 where the work per op is the same. Both figures are reported; the `walk`
column times a loop that only reads each op and its rule (no lowering at all), warm: its
ratio is the memory hierarchy's share.
"""

from __future__ import annotations

import gc
import math
import statistics
import time
from collections.abc import Callable
from functools import partial

from bench.common import Section, Timing, ms, time_it
from shardlab.autodiff import training_graph
from shardlab.lower import lower
from shardlab.models import build_model
from shardlab.spmd.complete import CompletedGraph, complete
from shardlab.strategy import Strategy

LAYERS = (12, 96, 192)
#: Written before each cold run: three times this machine's 32 MiB L3, so nothing of the
#: previous run survives in any cache level.
EVICT_BYTES = 96 << 20


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


def _cold_rounds(fns: dict[int, Callable[[], object]], rounds: int = 15) -> dict[int, Timing]:
    """Best and median per size over `rounds` rounds; a round runs every size once, each run
    after evicting every cache level (GC off). Interleaving the sizes spreads the shared
    machine's noise evenly over them."""
    evict, zeros = bytearray(EVICT_BYTES), bytes(EVICT_BYTES)
    samples: dict[int, list[float]] = {size: [] for size in fns}
    gc.collect()
    gc.disable()
    try:
        for _ in range(rounds):
            for size, fn in fns.items():
                evict[:] = zeros
                start = time.perf_counter()
                result = fn()
                samples[size].append(time.perf_counter() - start)
                del result  # freeing the program is not part of lowering
    finally:
        gc.enable()
    return {
        size: Timing(min(runs), statistics.median(runs), rounds) for size, runs in samples.items()
    }


def run() -> Section:
    section = Section(
        "Lowering (llama3-8b training graph, mesh dp=8,tp=8, dp + megatron_tp + "
        "sequence_parallel)",
        ["layers", "serial ops", "program ops", "comm ops", "lower, cold (best)",
         "µs / program op", "reshards/s", "lower, warm (best)", "walk, warm (best)"],
    )  # fmt: skip
    strategy = Strategy.build("dp=8,tp=8", ["dp", "megatron_tp", "sequence_parallel"])
    dones = {
        layers: complete(training_graph(build_model("llama3-8b", {"layers": layers})), strategy)
        for layers in LAYERS
    }
    cold = _cold_rounds({layers: partial(lower, done) for layers, done in dones.items()})
    warm: dict[int, float] = {}
    walk: dict[int, float] = {}
    for layers, done in dones.items():
        program = lower(done)
        c = cold[layers]
        warm[layers] = _timed(partial(lower, done)).best
        walk[layers] = _timed(_walk(done)).best
        comm = sum(1 for op in program.ops if op.is_comm)
        section.rows.append(
            [
                str(layers),
                str(len(done.graph.ops)),
                str(len(program.ops)),
                str(comm),
                ms(c.best),
                f"{c.best / len(program.ops) * 1e6:.2f}",
                f"{comm / c.best:,.0f}",
                ms(warm[layers]),
                ms(walk[layers]),
            ]
        )
    section.notes.append(
        f"96/12 lowering time, cold caches = {cold[96].best / cold[12].best:.2f} (8.00 is linear; "
        f"acceptance bound 8.8); 192/96 = {cold[192].best / cold[96].best:.2f} (2.00 is linear). "
        f"Warm (the same lowering back to back): 96/12 = {warm[96] / warm[12]:.2f}, and the "
        f"read-only walk over the same graphs {walk[96] / walk[12]:.2f}: the small graph's "
        "data stays in the caches between warm runs, the large one's does not (see "
        "`bench/bench_lowering.py`). All figures from the same run. Seed 000 reported "
        "4.18 s -> 1.89 s for 12 layers in Paddle."
    )
    return section
