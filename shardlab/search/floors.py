"""What a pipelined candidate's own parameters force on its step, before it is planned: the
first stage's tail after its units, and under FSDP a layer's forward unit (`Floors`).

Both are collectives of known size on known ranks, priced by the cost model's
`collective_time`:

- The first stage's tail. The first stage ends its units last (the last micro-batch's
  backward ends there), and where the gradient reductions wait for the tail (dp, ZeRO-1,
  ZeRO-2 in a pipeline: `bound.SAME_UNITS`) it then reduces its float32 gradients over dp:
  at least one reduce-scatter of the fewest it can hold, the embedding's and one layer's
  per chunk, 1/tp of each on a rank (`tail_floor`). Every bound on when the stages end
  their units (`bound`) is followed by it.
- FSDP's gathers. Under FSDP a layer's matrices rest sharded over dp and every forward
  unit that reads them gathers them, one collective at a time on the data-parallel stream:
  a layer's forward takes at least that gather, however well the compute hides it
  (`gather_floor`, `gathered`).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

from shardlab.cost.clusters import Cluster
from shardlab.cost.comm import collective_time
from shardlab.ir import DTYPE_BYTES, Graph, ValueKind
from shardlab.passes.pipeline_stages import (
    graph_layer_family,
    layer_costs,
    layer_index,
    module_of,
)
from shardlab.search.bound import SAME_UNITS, FlatWork
from shardlab.search.space import Candidate
from shardlab.strategy import PIPELINE_AXIS


@dataclass(frozen=True)
class StageParams:
    """The fewest parameter elements a pipeline's first stage holds besides its layers (the
    embedding: the parameters the modules before the layers read) and per layer, and the
    fewest bytes of one layer's matrices as stored (`Floors`)."""

    first: int
    layer: int
    layer_bytes: int = 0


def stage_params(graph: Graph) -> StageParams:
    """`StageParams` of a model: the parameters its forward ops read, by where they read
    them (a parameter the embedding and the head share counts for the embedding's stage)."""
    family = graph_layer_family(graph)
    pre_modules = layer_costs(graph)[3]
    params = {v.name: v.type for v in graph.values_of_kind(ValueKind.PARAM)}
    first: set[str] = set()
    per: dict[int, set[str]] = {}
    for op in graph.ops:
        for v in op.inputs:
            if v not in params:
                continue
            layer = layer_index(op.scope, family)
            if layer is not None:
                per.setdefault(layer, set()).add(v)
            elif module_of(op.scope, family) in pre_modules:
                first.add(v)
    least = min((sum(params[v].numel for v in names) for names in per.values()), default=0)
    matrices = min((sum(params[v].numel * DTYPE_BYTES[params[v].dtype] for v in names
                        if params[v].rank >= 2) for names in per.values()), default=0)  # fmt: skip
    return StageParams(sum(params[v].numel for v in first), least, matrices)


@dataclass(frozen=True)
class Floors:
    """What a pipelined candidate's own parameters force on its step, on one cluster: the
    first stage's tail after its units (`tail`) and, under FSDP, a layer's forward unit
    (`gather`)."""

    cluster: Cluster
    params: StageParams

    def tail(self, candidate: Candidate) -> float:
        return tail_floor(candidate, self.cluster, self.params)

    def gather(self, candidate: Candidate) -> float:
        return gather_floor(candidate, self.cluster, self.params)


@functools.lru_cache(maxsize=4096)
def tail_floor(candidate: Candidate, cluster: Cluster, params: StageParams) -> float:
    """The least seconds the first stage's tail takes once its units have ended, on a
    pipelined candidate whose gradient reductions wait for the tail (`SAME_UNITS`): one
    reduce-scatter over its data-parallel ranks of the float32 gradients (AdamW keeps a
    16-bit parameter's so, Megatron-LM's `main_grad`) of the fewest parameters it holds, the
    embedding's and one layer's per chunk, each at least 1/tp of it on a rank. The first
    stage ends its units last (the last micro-batch's backward ends there), so every bound
    on the stages' units bounds when this tail starts."""
    c = candidate
    if c.mesh.pp == 1 or c.mesh.dp == 1 or c.dp_recipe not in SAME_UNITS:
        return 0.0
    stage = c.strategy().mesh.submesh(PIPELINE_AXIS, 0)
    group = stage.group_of(stage.ranks[0], "dp")
    elements = params.first + (c.virtual_stages or 1) * params.layer
    return collective_time("reduce_scatter", 4.0 * elements / c.mesh.tp, group, cluster)


@functools.lru_cache(maxsize=4096)
def gather_floor(candidate: Candidate, cluster: Cluster, params: StageParams) -> float:
    """The least seconds a layer adds to a pipelined FSDP candidate's forward unit of one
    micro-batch by its parameters alone: its matrices sharded over dp at rest are gathered
    in every forward unit that reads them, at least 1/tp of each on a rank, on the
    data-parallel stream, which runs one collective at a time (one gather of them all
    takes no longer than several; the least over the stages' groups). 0 for other
    recipes."""
    c = candidate
    if c.mesh.pp == 1 or c.mesh.dp == 1 or c.dp_recipe != "fsdp":
        return 0.0
    mesh = c.strategy().mesh
    size = params.layer_bytes / c.mesh.tp
    stages = (mesh.submesh(PIPELINE_AXIS, s) for s in range(c.mesh.pp))
    return min(collective_time("all_gather", size, st.group_of(st.ranks[0], "dp"), cluster)
               for st in stages)  # fmt: skip


def gathered(work: FlatWork, candidate: Candidate, gather: float, layers: int) -> FlatWork:
    """`work` (in a flat rank's shares) with the layers' forward no shorter than their
    gathers (`gather_floor`: `gather` seconds a layer per micro-batch)."""
    if gather <= 0:
        return work
    floor = layers * gather * (candidate.microbatches or 1) / candidate.mesh.pp
    lay = max(work.layers, floor + work.backward)
    return dataclasses.replace(work, step=work.step - work.layers + lay, layers=lay,
                               forward=max(work.forward, floor))  # fmt: skip
