"""Screening: a candidate costed on two shallow copies of the model and its full-depth
figures drawn through them, in a fraction of the time its full plan takes.

Planning work grows with the layers: at full depth a Llama-3-70B candidate takes seconds,
almost all of it spent on 80 copies of one layer. The cost model's figures are built from
the layer's terms: compute seconds, bytes moved and FLOPs are sums over the layers (affine
in the depth); the step is the longest path through the timeline and the peak memory the
largest live total, each a maximum of such sums (convex and piecewise affine in the depth).
So the line through the plans at depths 4 and 5 (`DEPTHS`; a pipeline at two and three
layers per stage, or one and two per chunk where stages interleave two, `depths_of`) gives
at the model's depth

- the exact figure where both shallow plans see the same longest path or peak as the full
  one: every flat and two-stage candidate of Llama-3-8B and 70B tried at full size (the
  tests, `make bench`);
- less than the full figure where the full plan's maximum grows faster (a convex function
  lies above the line through two earlier points): a Llama-3-70B ZeRO-1 plan with full
  recomputation on tp=4 screens 31% below its full plan's peak;
- more or less, where a choice the planner makes depends on the depth: the gradient bucket
  size the cost guard picks, buckets that span several layers of a tiny model, stages
  balanced by time (an interleaved Llama-3-8B pipeline on
  two stages screens its step 0.8% and its peak memory 4.5% low). On every flat
  candidate of a 16-layer model of hidden 1024 on 8 GPUs, screened steps lay at most 0.24%
  above the full plans' and peaks not at all; of hidden 256, where a 25 MiB bucket spans
  several layers, plain data parallelism screened up to 11% (step) and 61% (peak) high.

So the walk (`walk`) takes a screened figure, less a margin (`least_step`, `least_memory`),
as a bound on the full plan's: a candidate whose screened memory is over the usable memory
by more than `MEMORY_MARGIN` (`INTERLEAVED_MEMORY_MARGIN` for interleaved pipelines) cannot
fit; one whose screened step is over the best plan so
far by more than `STEP_MARGIN` (and the walk's slack) cannot win; either is skipped with its
reason, and every other is planned at full depth before it is ranked. The full plans of the
survivors measure how far screening was off (`screening_report`, in every search result).

A pipeline is screened only where the layers split evenly over its chunks: its stages are
balanced by time, and at a depth where they cannot split evenly they are balanced otherwise.
Where the head's time moves a layer off the last stage at full depth but not at the shallow
ones, screening misses the move; the margins and the full plans cover it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from shardlab.cost.clusters import Cluster
from shardlab.ir import Graph
from shardlab.search.evaluate import Evaluation, evaluate
from shardlab.search.space import Candidate

#: The two shallow depths a candidate without pipeline stages is planned at: the shallowest
#: where every full-size candidate tried draws a line through its full plan (at 2 layers
#: one recipe's recomputation keeps a buffer it drops from 3 on; at 3 layers of Llama-3-70B
#: the cost guard picks another gradient bucket size than from 4 on).
DEPTHS = (4, 5)
#: The fewest layers per stage a pipelined candidate is screened with: a stage of one layer
#: is not on the line through deeper ones (Llama-3-8B on two stages: its peak memory).
MIN_PER_STAGE = 2
#: How far above a full plan's step a screened one may lie (module docstring).
STEP_MARGIN = 0.05
#: How far above a full plan's work a screened one may lie: its compute, the repeated
#: layers' work and its exposed tensor-parallel comm, sums over the layers (a 30B GPT on
#: 384 GPUs and Llama-3-70B on 512, every flat recipe: within 0.34%; `search.bound`'s
#: flat work).
WORK_MARGIN = 0.01
#: How far above a full plan's peak memory a screened one may lie.
MEMORY_MARGIN = 0.10
#: The same for an interleaved pipeline: its chunks are balanced by time at every depth,
#: and the shallow copies put other layer counts on the chunk that holds the most
#: micro-batches in flight (a 30B GPT on 384 GPUs, pp=4 x 2 chunks: screened peaks from
#: 18% below to 24% above the full plans'), so its screened memory rules it out only when
#: it is over by more than this.
INTERLEAVED_MEMORY_MARGIN = 0.30
#: Screen only models at least this many times deeper than the screening depths together,
#: so that screening plus the full plans of the survivors costs less than full plans alone.
MIN_SAVING = 1.5


def depths_of(candidate: Candidate) -> tuple[int, int]:
    """The two depths `candidate` is screened at: `DEPTHS` without pipeline stages, else
    `k` and `k + 1` layers per chunk (`pp x v` chunks), `k` the fewest that give every
    stage `MIN_PER_STAGE` layers (2 with one chunk per stage, 1 with two)."""
    v = candidate.virtual_stages or 1
    chunks = candidate.mesh.pp * v
    if candidate.mesh.pp == 1:
        return DEPTHS
    k = -(-MIN_PER_STAGE // v)
    return (k * chunks, (k + 1) * chunks)


def screens(candidate: Candidate, layers: int) -> bool:
    """Whether a candidate of a model of `layers` layers is screened before its full plan:
    a model deep enough to save time and, with pipeline stages, layers that split evenly
    over the chunks (else the shallow stages are balanced otherwise than the full ones)."""
    chunks = candidate.mesh.pp * (candidate.virtual_stages or 1)
    deep = layers >= MIN_SAVING * sum(depths_of(candidate))
    return deep and not candidate.annotations and layers % chunks == 0


def shallow_copy(graph: Graph, depth: int) -> Graph:
    """The preset `graph` was built from, with `depth` layers and everything else the same."""
    from shardlab.models import build_model
    from shardlab.models.config import OVERRIDABLE

    config = graph.meta.get("config")
    assert isinstance(config, Mapping), "screening needs a preset's graph"
    settings = {k: v for k, v in config.items() if k in OVERRIDABLE}
    return build_model(str(graph.meta["preset"]), {**settings, "layers": depth})


def least_step(e: Evaluation) -> float:
    """The least step time the full plan of a screened candidate can have."""
    return (e.step_time_s or 0.0) / (1.0 + STEP_MARGIN)


def least_memory(e: Evaluation) -> float:
    """The least peak memory per rank the full plan of a screened candidate can have."""
    interleaved = (e.candidate.virtual_stages or 1) > 1
    margin = INTERLEAVED_MEMORY_MARGIN if interleaved else MEMORY_MARGIN
    return (e.peak_memory_bytes or 0) / (1.0 + margin)


def screened_at(e: Evaluation) -> str:
    """`screened at 4 and 5 layers`: where a screened evaluation's figures come from."""
    d1, d2 = e.screened or (0, 0)
    return f"screened at {d1} and {d2} layers"


class Screener:
    """Screens candidates of one model; its shallow copies are built once, on first use, and
    kept (with the plans' caches they carry) for every candidate after."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self.shallow: dict[int, Graph] = {}

    def screen(self, candidate: Candidate, cluster: Cluster, headroom: float) -> Evaluation:
        """`candidate`'s screened figures at the model's depth (`screen`)."""
        depths = depths_of(candidate)
        for depth in depths:
            if depth not in self.shallow:
                self.shallow[depth] = shallow_copy(self.graph, depth)
        graphs = (self.shallow[depths[0]], self.shallow[depths[1]])
        return screen(candidate, graphs, cluster, headroom, layers_of(self.graph))


def layers_of(graph: Graph) -> int:
    """The repeated layers of a preset's graph."""
    config = graph.meta.get("config")
    assert isinstance(config, Mapping) and "layers" in config, "screening needs a preset's graph"
    return int(config["layers"])


def screen(
    candidate: Candidate, shallow: tuple[Graph, Graph], cluster: Cluster, headroom: float,
    layers: int,
) -> Evaluation:  # fmt: skip
    """`candidate`'s figures at `layers` layers, drawn through its plans on two shallow
    copies of the model (at `depths_of(candidate)`); a planner's refusal at either depth is
    the candidate's."""
    depths = depths_of(candidate)
    a = evaluate(candidate, shallow[0], cluster, headroom)
    if a.error is not None:
        return replace(a, screened=depths)
    b = evaluate(candidate, shallow[1], cluster, headroom)
    if b.error is not None:
        return replace(b, screened=depths)
    ratio = (layers - depths[0]) / (depths[1] - depths[0])

    def line(x: float, y: float) -> float:
        return x + (y - x) * ratio

    step = line(a.step_time_s or 0.0, b.step_time_s or 0.0)
    # MFU is model FLOPs over step time: the FLOPs (MFU x step) are drawn, not the ratio
    flops = line((a.mfu or 0.0) * (a.step_time_s or 0.0), (b.mfu or 0.0) * (b.step_time_s or 0.0))
    if step <= 0:
        return replace(b, screened=depths)
    # seconds are drawn; a fraction of the step (a pipeline's bubble) as the seconds it is
    ta, tb = a.step_time_s or 0.0, b.step_time_s or 0.0
    terms = {
        k: line(a.terms[k], v) if k.endswith("_s") else line(a.terms[k] * ta, v * tb) / step
        for k, v in b.terms.items()
    }
    return replace(
        b,
        step_time_s=step,
        peak_memory_bytes=round(line(a.peak_memory_bytes or 0, b.peak_memory_bytes or 0)),
        mfu=flops / step,
        terms=terms,
        comm_bytes_per_rank=line(a.comm_bytes_per_rank, b.comm_bytes_per_rank),
        screened=depths,
    )


def screening_report(screened: list[Evaluation], planned: list[Evaluation]) -> dict[str, Any]:
    """How screening did in one search: how many candidates it screened and, for those then
    planned at full depth, how far the screened step time and peak memory lay from the full
    plan's (relative, least and most: a negative error is a screened figure below)."""
    full = {e.candidate: e for e in planned if e.error is None}
    steps, memories = [], []
    for s in screened:
        f = full.get(s.candidate)
        if f is None or not f.step_time_s or not f.peak_memory_bytes:
            continue
        steps.append((s.step_time_s or 0.0) / f.step_time_s - 1.0)
        memories.append((s.peak_memory_bytes or 0) / f.peak_memory_bytes - 1.0)
    return {
        "screened": len(screened),
        "checked": len(steps),
        "step_error": [min(steps, default=0.0), max(steps, default=0.0)],
        "memory_error": [min(memories, default=0.0), max(memories, default=0.0)],
    }
