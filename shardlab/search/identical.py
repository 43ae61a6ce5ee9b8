"""Candidates whose plans are identical are one row of a search's ranking.

Two recipes can give the same plan on a mesh: a ZeRO stage that shards nothing the other
does not, recomputation that drops nothing on a model whose attention never stores what it
would drop. Listed apart they fill the ranking with twins, and the "runner-up" of why the
winner won is the winner again under another name. So the ranking keeps one row per plan:
the simplest recipe (`simplicity`) stands for the row and the others are listed with it
(`Evaluation.same_plan`).

Identity is exact, never a likeness: two full plans (never a screened figure, never a
refusal) are the same plan when they share the mesh and the pipeline schedule (schedule,
micro-batches, virtual stages) and their step time to the nanosecond, their peak memory per
rank to the byte and their communication per rank to the byte (`plan_key`). Plans that
differ in anything the cost model sees differ in one of these.
"""

from __future__ import annotations

from collections.abc import Hashable

from shardlab.search.evaluate import Evaluation
from shardlab.search.space import DP_RECIPES, HSDP, RECOMPUTE, Candidate


def plan_key(e: Evaluation) -> Hashable | None:
    """What two evaluations must share to be the same plan (module docstring); None for one
    that cannot be merged (a planner's refusal, screened figures)."""
    if e.error is not None or e.screened is not None or e.step_time_s is None:
        return None
    c = e.candidate
    return (
        c.mesh,
        c.schedule,
        c.microbatches,
        c.virtual_stages,
        round(e.step_time_s * 1e9),
        e.peak_memory_bytes,
        round(e.comm_bytes_per_rank),
    )


def simplicity(c: Candidate) -> tuple[int, int, int, int, int]:
    """Which of several recipes with the same plan stands for it, smallest first: the
    cheaper data-parallel recipe, less recomputation, no sequence parallelism, fewer
    micro-batches, no per-op placements."""
    order = (*DP_RECIPES, HSDP)
    recipe = order.index(c.dp_recipe) if c.dp_recipe in order else -1
    return (recipe, RECOMPUTE.index(c.recompute), int(c.sequence_parallel),
            c.microbatches or 0, len(c.annotations))  # fmt: skip


def merge_identical(ranked: list[Evaluation]) -> list[Evaluation]:
    """`ranked` with each plan once: the first row of each `plan_key` keeps its place and
    lists the later ones' candidates in its `same_plan` (in their order; merging twice
    lists none twice)."""
    first: dict[Hashable, Evaluation] = {}
    out = []
    for e in ranked:
        key = plan_key(e)
        if key is not None and key in first:
            keeper = first[key]
            twins = [e.candidate, *e.same_plan]
            keeper.same_plan = keeper.same_plan + [c for c in twins if c not in keeper.same_plan]
            continue
        if key is not None:
            first[key] = e
        out.append(e)
    return out
