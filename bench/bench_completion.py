"""Sharding completion time of llama3-8b forward graphs on an 8x8 mesh (dp x megatron_tp)."""

from __future__ import annotations

from bench.common import Section, ms, time_it
from shardlab.models import build_model
from shardlab.spmd.complete import complete
from shardlab.strategy import Strategy


def run() -> Section:
    section = Section(
        "Sharding completion (llama3-8b forward, mesh dp=8,tp=8, templates dp + megatron_tp)",
        ["layers", "ops", "values", "complete (best)", "complete (median)", "ops/s", "fallbacks"],
    )
    strategy = Strategy.build("dp=8,tp=8", ["dp", "megatron_tp"])
    best = {}
    for layers in (32, 64):
        graph = build_model("llama3-8b", {"layers": layers})
        done = complete(graph, strategy)
        t = time_it(lambda g=graph: complete(g, strategy), repeat=5)
        best[layers] = t.best
        section.rows.append(
            [
                str(layers),
                str(len(graph.ops)),
                str(len(graph.values)),
                ms(t.best),
                ms(t.median),
                f"{len(graph.ops) / t.best:,.0f}",
                str(len(done.fallback_ops())),
            ]
        )
    section.notes.append(
        f"64-layer / 32-layer completion time = {best[64] / best[32]:.2f} (2.00 is linear), "
        "measured in the same run."
    )
    return section
