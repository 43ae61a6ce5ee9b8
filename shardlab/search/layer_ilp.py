"""Per-op refinement: an integer program over the placements of one transformer layer's ops on
the tensor-parallel axis, solved with HiGHS (`scipy.optimize.milp`), as Alpa's intra-op pass.

The layer is the model's first (`layers.0.*`); its solution applies to every repeat.

- Nodes. Each op of the layer, each parameter it owns, and each value it reads from outside
  (the residual stream coming in, the rotary tables) is a node with a few choices:
  - a parameter or an outside value is `R` or `S(d)` on the axis, for each dim it divides;
  - an op's choices are the SPMD rules' own answers (`spmd.engine.infer`) to every
    combination of `R` and `S(d)` arriving at its inputs, with each output placement asked
    for (`R`, `S(d)`, `P`): which placement each input is used in and which each output
    comes out in (`P` where a sharded dim is contracted).
- Costs, in seconds on the cluster:
  - an op's choice costs its kernels on the local blocks, forward and backward (three times
    the forward, `cost.compute`), plus the collectives inside its kernel;
  - an edge from a producer's choice to a consumer's costs the reshard the planner would
    insert (`spmd.cost.reshard_cost`) forward, and backward the conversion of the input's
    gradient into the producer's layout: a gradient is partial where the op split its work
    over an input it used whole (a column-parallel projection's input, a replicated weight
    under split data), so it is all-reduced or reduce-scattered back;
  - a parameter is pinned, as Megatron's template pins it: a choice that would move it on
    this axis (gather it, or move its shard) is ruled out; a replicated parameter may be
    used sliced. Gathering parameters before use is the data-parallel axis's recipe (FSDP).
  Bytes become seconds at the axis's link (`Cluster.intra_node` inside a node).
- Memory. A parameter's choice holds its local block with gradient and optimizer state
  (`STATE_BYTES` per 16-bit element, Megatron-LM's mixed precision accounting); an op's
  choice keeps its outputs' local blocks for the backward. Times the layers, this must stay
  under `memory_bytes`.
- The residual stream leaves the layer as it comes in (the next layer reads it): the edge
  from the layer's last add back to its input is priced as well.

A cost that depends on two nodes' choices is linearised the standard way: a variable
`w >= x_a + x_b - 1` per producer choice and reader placement, where that costs anything.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from shardlab.cost.clusters import Cluster, Link
from shardlab.cost.compute import compute_time, op_bytes, op_dtype, op_flops
from shardlab.errors import ShardlabError
from shardlab.ir import DTYPE_BYTES, Graph, Op, TensorType, ValueKind
from shardlab.mesh import Mesh
from shardlab.placement import DistSpec, Partial, Placement, Replicate, Shard, local_shape
from shardlab.spmd.cost import reshard_cost
from shardlab.spmd.engine import infer

#: Bytes a rank holds per parameter element of a 16-bit model: the parameter, its float32
#: gradient, master copy and two Adam moments (2 + 4 + 4 + 4 + 4).
STATE_BYTES_16 = 18
#: The same for a float32 model (parameter, gradient, two moments).
STATE_BYTES_32 = 16
#: The backward of an op costs about twice its forward.
FORWARD_AND_BACKWARD = 3.0
LAYER = "layers.0"
_LAYER = re.compile(r"^layers\.0(\.|$)")


class LayerILPError(ShardlabError):
    """The layer cannot be refined: no layers, no choice fits the memory, ..."""

    code = "layer_ilp"


@dataclass(frozen=True)
class Choice:
    """One way to run a node: placements of its inputs (ops only) and of its outputs."""

    inputs: tuple[Placement, ...]
    outputs: tuple[Placement, ...]
    seconds: float
    memory: float  # bytes per rank for one layer


@dataclass
class Node:
    name: str  # the op's name, or the value's for a parameter or an outside value
    kind: str  # "op", "param", "stream" (the residual stream coming in) or "outside"
    choices: list[Choice]
    op: Op | None = None


@dataclass
class LayerSolution:
    """The placement of every value of the layer on the axis, and what it costs."""

    axis: str
    size: int
    placements: dict[str, Placement]  # value name -> placement on the axis
    uses: dict[str, tuple[Placement, ...]]  # op name -> the placements it reads its inputs in
    seconds: float  # the objective: one layer's forward and backward
    memory_bytes: float  # one layer's parameters, states and kept activations per rank
    nodes: int
    variables: int
    status: str = ""

    def annotations(self, graph: Graph) -> list[str]:
        """Annotations that put the solution on every repeat of the layer: each of its values
        (`layers.*.attn.q_proj.weight=tp:S(1)`, parameters pinned, activations as hints)."""
        return [
            f"layers.*{name[len(LAYER) :]}={self.axis}:{p}"
            for name, p in sorted(self.placements.items())
            if _LAYER.match(name)
        ]

    def sequence_sharded(self, graph: Graph) -> bool:
        """Whether the residual stream between layers is sharded on the sequence dim."""
        stream = _residual_names(graph)
        return bool(stream) and self.placements.get(stream[-1]) == Shard(1)

    def to_json(self) -> dict[str, object]:
        return {
            "axis": self.axis,
            "size": self.size,
            "placements": {k: str(v) for k, v in sorted(self.placements.items())},
            "seconds": self.seconds,
            "memory_bytes": self.memory_bytes,
            "nodes": self.nodes,
            "variables": self.variables,
            "status": self.status,
        }


def solve_layer(
    graph: Graph,
    cluster: Cluster,
    size: int,
    memory_bytes: float,
    *,
    axis: str = "tp",
    layers: int | None = None,
    state_bytes: float | None = None,
    fixed: Mapping[str, Placement] | None = None,
) -> LayerSolution:
    """The cheapest placements of `graph`'s first layer on an axis of `size` ranks whose
    `layers` repeats (default: the model's) fit in `memory_bytes` per rank. `state_bytes`:
    bytes a rank holds per parameter element with its gradient and optimizer state (default
    `STATE_BYTES_16` or `_32` by the parameter's dtype; less where a data-parallel recipe
    shards them). `fixed`: placements some parameters must take (a template's, to price it)."""
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import coo_array

    mesh = Mesh((size,), (axis,))
    count = layers or _layer_count(graph)
    link = cluster.intra_node if size <= cluster.devices_per_node else cluster.inter_node
    ops = [op for op in graph.ops if _LAYER.match(op.scope) or _LAYER.match(op.name)]
    if not ops:
        raise LayerILPError(f"graph {graph.name!r} has no ops in {LAYER!r}: nothing to refine")
    nodes, node_of = _nodes(graph, ops, mesh, cluster, state_bytes)
    for node in nodes:
        if fixed and node.kind == "param" and node.name in fixed:
            node.choices = [ch for ch in node.choices if ch.outputs[0] == fixed[node.name]]
    program = _Program()
    x = {(n, c): program.variable(ch.seconds, integer=True)
         for n, node in enumerate(nodes) for c, ch in enumerate(node.choices)}  # fmt: skip
    for n, node in enumerate(nodes):  # one choice per node
        program.row({x[(n, c)]: 1.0 for c in range(len(node.choices))}, 1.0, 1.0)
    program.row({x[(n, c)]: ch.memory * count for (n, c), ch in _each(nodes)}, -np.inf,
                float(memory_bytes))  # fmt: skip
    for name, (u, out) in node_of.items():
        readers = [(v, k) for v, node in enumerate(nodes) if node.op is not None
                   for k, i in enumerate(node.op.inputs) if i == name]  # fmt: skip
        _price_value(program, x, graph.type_of(name), mesh, nodes, u, out, readers, link)
    _price_stream(program, x, graph, nodes, node_of, mesh, link)
    c = np.array(program.costs)
    rows, cols, vals = program.coo()
    matrix = coo_array((vals, (rows, cols)), shape=(len(program.lo), len(c)))
    result = milp(
        c,
        constraints=LinearConstraint(matrix, np.array(program.lo), np.array(program.hi)),
        integrality=np.array(program.integer, dtype=float),
        bounds=Bounds(0.0, 1.0),
    )
    if result.x is None:
        least = sum(min(ch.memory for ch in node.choices) for node in nodes) * count
        raise LayerILPError(
            f"no placement of {count} layers on {axis}={size} fits in "
            f"{memory_bytes / (1 << 30):.1f} GiB per rank (the leanest needs "
            f"{least / (1 << 30):.1f} GiB)",
            memory_bytes=memory_bytes,
        )
    chosen = {n: c for (n, c), i in x.items() if result.x[i] > 0.5}
    placements: dict[str, Placement] = {}
    uses: dict[str, tuple[Placement, ...]] = {}
    for n, node in enumerate(nodes):
        choice = node.choices[chosen[n]]
        names = node.op.outputs if node.op is not None else (node.name,)
        for name, p in zip(names, choice.outputs, strict=True):
            placements[name] = p
        if node.op is not None:
            uses[node.op.name] = choice.inputs
    used = sum(nodes[n].choices[ch].memory for n, ch in chosen.items())
    return LayerSolution(axis, size, placements, uses, float(result.fun), used, len(nodes),
                         len(c), str(result.message))  # fmt: skip


class _Program:
    """A 0-1 program being written: costs, integrality and sparse rows `lo <= a.x <= hi`."""

    def __init__(self) -> None:
        self.costs: list[float] = []
        self.integer: list[bool] = []
        self.rows: list[dict[int, float]] = []
        self.lo: list[float] = []
        self.hi: list[float] = []

    def variable(self, cost: float, integer: bool = False) -> int:
        self.costs.append(cost)
        self.integer.append(integer)
        return len(self.costs) - 1

    def row(self, coefficients: dict[int, float], lo: float, hi: float) -> None:
        self.rows.append(coefficients)
        self.lo.append(lo)
        self.hi.append(hi)

    def at_least_both(self, w: int, a: int, bs: Sequence[int]) -> None:
        """w >= x_a + sum(x_b) - 1 (the bs are choices of one node: at most one is 1)."""
        self.row({w: 1.0, a: -1.0, **dict.fromkeys(bs, -1.0)}, -1.0, np.inf)

    def coo(self) -> tuple[list[int], list[int], list[float]]:
        rows, cols, vals = [], [], []
        for r, coefficients in enumerate(self.rows):
            for col, val in coefficients.items():
                rows.append(r)
                cols.append(col)
                vals.append(val)
        return rows, cols, vals


def _each(nodes: Sequence[Node]) -> list[tuple[tuple[int, int], Choice]]:
    return [((n, c), ch) for n, node in enumerate(nodes) for c, ch in enumerate(node.choices)]


def _price_value(
    program: _Program,
    x: Mapping[tuple[int, int], int],
    ttype: TensorType,
    mesh: Mesh,
    nodes: Sequence[Node],
    u: int,
    out: int,
    readers: Sequence[tuple[int, int]],
    link: Link,
) -> None:
    """The communication of one value: forward, one reshard per distinct placement its
    readers use it in (a copy made for one reader serves the others); backward, one
    conversion per distinct gradient layout the readers give back (partial gradients of
    several readers are summed locally, then reduced once)."""
    source = nodes[u].kind
    keys: dict[tuple[str, Placement], list[tuple[int, int]]] = {}  # key -> [(reader, choice)]
    for v, k in readers:
        for b, choice in enumerate(nodes[v].choices):
            used = choice.inputs[k]
            keys.setdefault(("use", used), []).append((v, b))
            if source != "outside":  # a table (rotary cos and sin) has no gradient
                keys.setdefault(("grad", _gradient(used, choice)), []).append((v, b))
    for a, made in enumerate(nodes[u].choices):
        produced = made.outputs[out]
        for (what, p), users in keys.items():
            if what == "use":
                nbytes = reshard_cost(ttype, mesh, (produced,), (p,))
                if source == "param" and nbytes > 0:  # pinned: never moved on this axis
                    for v, b in users:
                        program.row({x[(u, a)]: 1.0, x[(v, b)]: 1.0}, -np.inf, 1.0)
                    continue
            else:
                back = Replicate() if isinstance(produced, Partial) else produced
                nbytes = reshard_cost(ttype, mesh, (p,), (back,))
            if nbytes <= 0:
                continue
            w = program.variable(_seconds(nbytes, link))
            for v in {v for v, _ in users}:
                program.at_least_both(w, x[(u, a)], [x[(v, b)] for vv, b in users if vv == v])


def _gradient(used: Placement, choice: Choice) -> Placement:
    """The layout of an input's gradient: partial where the op split its work over an input
    it used whole (a column-parallel projection's input, a replicated weight under split
    data), else the input's own placement."""
    split = any(not isinstance(p, Replicate) for p in choice.outputs)
    return Partial("sum") if isinstance(used, Replicate) and split else used


def _seconds(nbytes: float, link: Link) -> float:
    """Seconds of a collective moving `nbytes` per rank (latency included as bytes)."""
    return nbytes / link.bandwidth


def _nodes(
    graph: Graph, ops: Sequence[Op], mesh: Mesh, cluster: Cluster, state_bytes: float | None
) -> tuple[list[Node], dict[str, tuple[int, int]]]:
    """The nodes and, per value the layer reads, (node, output index) that makes it."""
    nodes: list[Node] = []
    node_of: dict[str, tuple[int, int]] = {}
    stream = _residual_names(graph)[:1]
    for op in ops:
        for name in op.inputs:
            if name in node_of or graph.producer(name) in ops:
                continue
            ttype = graph.type_of(name)
            is_param = graph.value(name).kind == ValueKind.PARAM
            per = (state_bytes or _state_bytes(ttype)) if is_param else 0.0
            choices = [
                Choice((), (p,), 0.0, per * math.prod(local_shape(ttype.shape, mesh, (p,))))
                for p in _placements(ttype, mesh)
            ]
            kind = "param" if is_param else "stream" if name in stream else "outside"
            node_of[name] = (len(nodes), 0)
            nodes.append(Node(name, kind, choices))
        for i, name in enumerate(op.outputs):
            node_of[name] = (len(nodes), i)
        nodes.append(Node(op.name, "op", _op_choices(graph, op, mesh, cluster), op))
    return nodes, node_of


def _op_choices(graph: Graph, op: Op, mesh: Mesh, cluster: Cluster) -> list[Choice]:
    """The rule's answers to every combination of R and S(d) at the inputs."""
    types = [graph.type_of(v) for v in op.inputs]
    outs = [graph.type_of(v) for v in op.outputs]
    seen: dict[tuple[tuple[Placement, ...], tuple[Placement, ...]], Choice] = {}
    hints: list[Placement | None] = [None]
    if len(outs) == 1:  # ask for each output placement too, a partial one included
        hints += [Partial("sum"), *_placements(outs[0], mesh)]
    for arriving, hint in itertools.product(
        itertools.product(*(_placements(t, mesh) for t in types)), hints
    ):
        specs = [DistSpec(mesh, (p,)) for p in arriving]
        try:
            result = infer(op.kind, types, specs, op.attrs, mesh,
                           output_hints=[None if hint is None else (hint,)])  # fmt: skip
        except ShardlabError:
            continue
        ins = tuple(s.placements[0] for s in result.input_specs)
        produced = tuple(s.placements[0] for s in result.output_specs)
        if (ins, produced) in seen:
            continue
        local_in = [_local(t, p, mesh) for t, p in zip(types, ins, strict=True)]
        local_out = [_local(t, p, mesh) for t, p in zip(outs, produced, strict=True)]
        flops = op_flops(op.kind, local_in, local_out, op.attrs)
        moved = op_bytes(op.kind, local_in, local_out, op.attrs)
        seconds = FORWARD_AND_BACKWARD * compute_time(
            op.kind, flops, moved, op_dtype([*local_in, *local_out]), cluster
        )
        link = cluster.intra_node
        for comm in result.inner_comms:
            seconds += 2 * comm.type.nbytes / link.bandwidth + link.latency
        kept = float(sum(t.nbytes for t in local_out))
        seen[(ins, produced)] = Choice(ins, produced, seconds, kept)
    if not seen:
        raise LayerILPError(f"op {op.name!r} ({op.kind}) has no placement on {mesh}")
    return list(seen.values())


def _price_stream(
    program: _Program,
    x: Mapping[tuple[int, int], int],
    graph: Graph,
    nodes: Sequence[Node],
    node_of: Mapping[str, tuple[int, int]],
    mesh: Mesh,
    link: Link,
) -> None:
    """The residual stream's way from the layer's last add into the next layer, which reads
    it as this layer's input (forward and gradient)."""
    stream = _residual_names(graph)
    if len(stream) < 2 or stream[0] not in node_of or stream[-1] not in node_of:
        return
    (u, out), (v, _) = node_of[stream[-1]], node_of[stream[0]]
    ttype = graph.type_of(stream[0])
    for a, ca in enumerate(nodes[u].choices):
        for b, cb in enumerate(nodes[v].choices):
            src, dst = ca.outputs[out], cb.outputs[0]
            back = Replicate() if isinstance(src, Partial) else src
            nbytes = reshard_cost(ttype, mesh, (src,), (dst,))
            nbytes += reshard_cost(ttype, mesh, (dst,), (back,))
            if nbytes > 0:
                w = program.variable(_seconds(nbytes, link))
                program.at_least_both(w, x[(u, a)], [x[(v, b)]])


def _residual_names(graph: Graph) -> list[str]:
    """The residual stream through the first layer: the value it enters by, then the
    outputs of the layer's adds whose first input is the stream."""
    adds = [op for op in graph.ops if op.kind == "add" and op.scope == LAYER]
    if not adds:
        return []
    names = [adds[0].inputs[0]]
    for op in adds:
        if op.inputs[0] == names[-1]:
            names.append(op.outputs[0])
    return names


def _placements(ttype: TensorType, mesh: Mesh) -> list[Placement]:
    n = mesh.shape[0]
    out: list[Placement] = [Replicate()]
    out += [Shard(d) for d, extent in enumerate(ttype.shape) if extent % n == 0 and extent >= n]
    return out


def _local(ttype: TensorType, p: Placement, mesh: Mesh) -> TensorType:
    return ttype.with_shape(local_shape(ttype.shape, mesh, (p,)))


def _state_bytes(ttype: TensorType) -> float:
    """Bytes per element of a parameter with its gradient and optimizer state."""
    return float(STATE_BYTES_16 if DTYPE_BYTES[ttype.dtype] == 2 else STATE_BYTES_32)


def _layer_count(graph: Graph) -> int:
    config = graph.meta.get("config")
    if isinstance(config, Mapping) and "layers" in config:
        return int(config["layers"])
    found = {int(m.group(1)) for op in graph.ops if (m := re.match(r"^layers\.(\d+)", op.scope))}
    return len(found) or 1
