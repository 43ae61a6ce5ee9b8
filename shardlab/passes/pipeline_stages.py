"""Stage assignment: which layers each pipeline stage (and model chunk) holds.

The layers (`layers.<i>` scopes) are split into `pp * v` contiguous model chunks, balanced
by FLOPs (`shardlab.cost.compute.op_flops` over each layer's forward and backward ops), by
the cost model's seconds on a cluster (`assign_layers_by_time`), or cut at given layer
boundaries; the balancing is an exact dynamic program over layers and chunks. Chunk `c`
runs on stage `c % pp`: with `v` virtual stages each
stage holds `v` chunks, round-robin (interleaved 1F1B). Modules before the first layer
(`embed`, `rope`) belong to chunk 0, the others (`final_norm`, `lm_head`, `loss`) to the last.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

from shardlab.cost.clusters import Cluster
from shardlab.cost.comm import step_time
from shardlab.cost.compute import op_flops, program_op_times
from shardlab.ir import Graph
from shardlab.passes.pipeline_schedule import PipelineError
from shardlab.program import DistProgram
from shardlab.repeats import layer_family, layer_of


@dataclass(frozen=True, slots=True)
class StageAssignment:
    """Which layers each model chunk holds; chunk c runs on pipeline stage c % pp."""

    pp: int
    virtual_stages: int
    chunks: tuple[tuple[int, int], ...]  # chunk -> [first layer, stop)
    #: top-level modules that come before the first layer (they live in chunk 0)
    pre_modules: frozenset[str] = frozenset()
    #: the numbered family of the layers (`layers`; `model.layers` in imported models)
    family: str = "layers"

    @property
    def last_chunk(self) -> int:
        return len(self.chunks) - 1

    def chunk_of_layer(self, layer: int) -> int:
        return next(c for c, (a, b) in enumerate(self.chunks) if a <= layer < b)

    def stage_of_chunk(self, chunk: int) -> int:
        return chunk % self.pp

    def stage_of_layer(self, layer: int) -> int:
        return self.stage_of_chunk(self.chunk_of_layer(layer))

    def chunk_of_scope(self, scope: str) -> int | None:
        """The chunk of an op's scope; None for an unscoped op (its data flow decides)."""
        if not scope:
            return None
        layer = layer_index(scope, self.family)
        if layer is not None:
            return self.chunk_of_layer(layer)
        return 0 if module_of(scope, self.family) in self.pre_modules else self.last_chunk

    def chunks_of_stage(self, stage: int) -> list[int]:
        return [c for c in range(len(self.chunks)) if c % self.pp == stage]

    def layers_of_stage(self, stage: int) -> list[int]:
        return [i for c in self.chunks_of_stage(stage) for i in range(*self.chunks[c])]


def stage_of_scope(scope: str, assignment: StageAssignment) -> int | None:
    """The pipeline stage an op of this scope runs on (None: unscoped, decided by data)."""
    chunk = assignment.chunk_of_scope(scope)
    return None if chunk is None else assignment.stage_of_chunk(chunk)


def layer_index(scope: str, family: str) -> int | None:
    """The layer of a scope under `family` (`model.layers.3.mlp` -> 3), else None."""
    found = layer_of(scope)
    return found[1] if found is not None and found[0] == family else None


def module_of(scope: str, family: str) -> str:
    """The module beside the layers a scope is in: its first parts at the layers' depth
    (`embed` for `embed.x` beside `layers`; `model.norm` for `model.norm.x` beside
    `model.layers`)."""
    return ".".join(scope.split(".")[: family.count(".") + 1])


def graph_layer_family(graph: Graph) -> str:
    """The family of the graph's layers, or an error saying pipelines split layers."""
    family = layer_family(graph)
    if family is None:
        raise PipelineError(
            f"graph {graph.name!r} has no ops in numbered layer scopes ('layers.<i>', "
            "'model.layers.<i>', ...): pipeline stages split the layers of a model"
        )
    return family


def layer_costs(graph: Graph) -> tuple[list[int], int, int, frozenset[str]]:
    """FLOPs per layer, of the modules before the layers and after them; the modules before.
    Counted once per graph and kept on it (graphs are not changed once built)."""
    known = graph.__dict__.get("_layer_costs")
    if known is None:
        known = graph.__dict__["_layer_costs"] = _count_layer_costs(graph)
    per, pre, post, pre_modules = known
    return list(per), pre, post, pre_modules


def _count_layer_costs(graph: Graph) -> tuple[list[int], int, int, frozenset[str]]:
    family = graph_layer_family(graph)
    per: dict[int, int] = {}
    pre = post = 0
    pre_modules: set[str] = set()
    for op in graph.ops:
        ins = [graph.type_of(v) for v in op.inputs]
        flops = op_flops(op.kind, ins, [graph.type_of(v) for v in op.outputs], op.attrs)
        layer = layer_index(op.scope, family)
        module = module_of(op.scope, family)
        if layer is not None:
            per[layer] = per.get(layer, 0) + flops
        elif op.scope and (module in pre_modules or not per):
            pre_modules.add(module)
            pre += flops
        elif op.scope:
            post += flops
    return [per.get(i, 0) for i in range(max(per) + 1)], pre, post, frozenset(pre_modules)


def assign_layers(
    graph: Graph, pp: int, virtual_stages: int = 1, boundaries: Sequence[int] | None = None
) -> StageAssignment:
    """Split the layers of `graph` into pp*v contiguous chunks.

    With `boundaries` [k1, k2, ...] (pp*v - 1 increasing layer indices) chunk c starts at
    layer k_c; otherwise the split minimises the largest chunk's FLOPs (the modules before
    the layers count for chunk 0, those after them for the last chunk).
    """
    costs, pre, post, pre_modules = layer_costs(graph)
    family = graph_layer_family(graph)
    n, k = len(costs), pp * virtual_stages
    if n < k:
        raise PipelineError(
            f"{n} layers cannot fill {k} pipeline chunks (pp={pp} x {virtual_stages} virtual "
            "stages): every chunk needs a layer",
            layers=n,
        )
    if boundaries is None:
        cuts = balanced_cuts(costs, k, pre, post)
    else:
        cuts = [int(b) for b in boundaries]
        edges = [0, *cuts, n]
        if len(cuts) != k - 1 or any(a >= b for a, b in pairwise(edges)):
            raise PipelineError(
                f"pipeline boundaries {list(boundaries)} must be {k - 1} increasing layer "
                f"indices between 1 and {n - 1} (chunk c starts at layer boundaries[c-1])",
                boundaries=list(boundaries),
            )
    starts, stops = [0, *cuts], [*cuts, n]
    return StageAssignment(
        pp, virtual_stages, tuple(zip(starts, stops, strict=True)), pre_modules, family
    )


def assign_layers_by_time(
    program: DistProgram, training: Graph, pp: int, virtual_stages: int, cluster: Cluster
) -> StageAssignment:
    """Split the layers into pp*v chunks balanced by the cost model's seconds: every op of the
    lowered program (forward, backward and the collectives inside each layer) on its first
    rank, summed per layer, with the modules before and after the layers as in
    `assign_layers`. FLOPs miss what is bound by memory or links: the embedding's gather,
    the loss over a large vocabulary, the tensor-parallel collectives."""
    _, _, _, pre_modules = layer_costs(training)
    family = graph_layer_family(training)
    compute = program_op_times(program, cluster)
    rank = program.mesh.ranks[0]
    per: dict[int, float] = {}
    pre = post = 0.0
    for op in program.ops:
        if op.comm is not None:
            seconds = step_time(op.comm, program.mesh.group_of(rank, op.comm.axis), cluster)
        else:
            seconds = compute.get(op.name, 0.0)
        layer = layer_index(op.scope, family)
        if layer is not None:
            per[layer] = per.get(layer, 0.0) + seconds
        elif module_of(op.scope, family) in pre_modules:
            pre += seconds
        elif op.scope:
            post += seconds
    n, k = max(per) + 1, pp * virtual_stages
    if n < k:
        raise PipelineError(
            f"{n} layers cannot fill {k} pipeline chunks (pp={pp} x {virtual_stages} virtual "
            "stages): every chunk needs a layer",
            layers=n,
        )
    cuts = balanced_cuts([per.get(i, 0.0) for i in range(n)], k, pre, post)
    starts, stops = [0, *cuts], [*cuts, n]
    return StageAssignment(
        pp, virtual_stages, tuple(zip(starts, stops, strict=True)), pre_modules, family
    )


def balanced_cuts(costs: Sequence[float], k: int, pre: float = 0, post: float = 0) -> list[int]:
    """Cut points of k contiguous chunks minimising the largest chunk cost (exact DP).

    `pre` is added to the first chunk's cost and `post` to the last one's.
    """
    n = len(costs)
    prefix: list[float] = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + c)

    def cost(chunk: int, a: int, b: int) -> float:
        return prefix[b] - prefix[a] + (pre if chunk == 0 else 0) + (post if chunk == k - 1 else 0)

    inf = float("inf")
    # best[c][i]: the smallest largest cost of chunks 0..c covering layers [0, i)
    best: list[list[float]] = [[inf] * (n + 1) for _ in range(k)]
    cut = [[0] * (n + 1) for _ in range(k)]
    for i in range(1, n + 1):
        best[0][i] = cost(0, 0, i)
    for c in range(1, k):
        for i in range(c + 1, n + 1):
            for j in range(c, i):
                worst = max(best[c - 1][j], cost(c, j, i))
                if worst < best[c][i]:
                    best[c][i], cut[c][i] = worst, j
    cuts, i = [], n
    for c in range(k - 1, 0, -1):
        i = cut[c][i]
        cuts.append(i)
    return cuts[::-1]
