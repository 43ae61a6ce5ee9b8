"""Communication time: how long a collective takes on a cluster (latency-bandwidth ring model).

`size` S is the NCCL-tests message size: for all_reduce the buffer, for all_gather the gathered
output, for reduce_scatter the input before scattering, for all_to_all each rank's buffer, for
send/recv the message. On n ranks over one `Link` a flat ring takes

    t = link.latency * steps(kind, n) + factor(kind, n) * S / link.bandwidth

with factor all_reduce 2(n-1)/n, all_gather, reduce_scatter and all_to_all (n-1)/n, send/recv 1,
and steps all_reduce 2(n-1), all_gather, reduce_scatter and all_to_all n-1, send/recv 1. Local
kinds (`local_slice`, `local_partial`) and groups of one rank cost 0.

Where the group's ranks sit (rank r is device r, on node `cluster.node_of(r)`) picks the link:

- all ranks on one node: flat ring on `intra_node`;
- m > 1 nodes with k ranks on each (k = 1 is the flat ring on `inter_node`), hierarchical,
  with `ring(kind, S, n, link)` the flat ring above:
    all_reduce     = ring(reduce_scatter, S, k, intra) + ring(all_reduce, S/k, m, inter)
                     + ring(all_gather, S, k, intra)
    all_gather     = ring(all_gather, S/k, m, inter) + ring(all_gather, S, k, intra)
                     (each rank first gathers the m pieces of its local index across nodes,
                     S/k in all, so only S/k crosses the slow link; then the node gathers S)
    reduce_scatter = ring(reduce_scatter, S, k, intra) + ring(reduce_scatter, S/k, m, inter)
                     (the mirror image: reduce within the node first, then across nodes);
  the k inter-node rings run in parallel, one per local index, since bandwidth is per device;
- all_to_all and send/recv across nodes, and groups with unequal ranks per node: flat ring on
  `inter_node`, the slowest hop.

A calibrated cluster (`shardlab calibrate`) may carry two more figures, both absent (no
change) on the GPU presets: `comm_scale[kind]` multiplies `collective_time` of that kind (a
collective inside a training step against the same one timed alone), and `op_overhead` is
added to every reshard step (`step_time`, local steps included: the rank runs them as ops).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType

from shardlab.cost.clusters import Cluster, Link
from shardlab.mesh import Mesh
from shardlab.reshard import CommStep

#: Ring bytes factor by kind, as a function of the group size n: a rank moves factor * S.
FACTORS: Mapping[str, Callable[[int], float]] = MappingProxyType(
    {
        "all_reduce": lambda n: 2 * (n - 1) / n,
        "all_gather": lambda n: (n - 1) / n,
        "reduce_scatter": lambda n: (n - 1) / n,
        "all_to_all": lambda n: (n - 1) / n,
        "send": lambda n: 1.0,
        "recv": lambda n: 1.0,
        "local_slice": lambda n: 0.0,
        "local_partial": lambda n: 0.0,
    }
)
#: Ring steps by kind (each pays the link latency once), as a function of the group size n.
STEPS: Mapping[str, Callable[[int], int]] = MappingProxyType(
    {
        "all_reduce": lambda n: 2 * (n - 1),
        "all_gather": lambda n: n - 1,
        "reduce_scatter": lambda n: n - 1,
        "all_to_all": lambda n: n - 1,
        "send": lambda n: 1,
        "recv": lambda n: 1,
        "local_slice": lambda n: 0,
        "local_partial": lambda n: 0,
    }
)
#: Kinds that split into an intra-node and an inter-node phase when a group spans nodes.
HIERARCHICAL = frozenset({"all_reduce", "all_gather", "reduce_scatter"})


def _known(kind: str) -> None:
    if kind not in FACTORS:
        raise ValueError(f"unknown communication kind {kind!r}; known kinds: {', '.join(FACTORS)}")


def factor(kind: str, n: int) -> float:
    """Bytes a rank moves per byte of message size S, for `kind` on a ring of n ranks."""
    _known(kind)
    return FACTORS[kind](n)


def steps(kind: str, n: int) -> int:
    """Ring steps of `kind` on n ranks: how many times the link latency is paid."""
    _known(kind)
    return STEPS[kind](n)


def ring_time(kind: str, size: float, n: int, link: Link) -> float:
    """Seconds for `kind` of message size `size` on a flat ring of n ranks over `link`."""
    if size < 0:
        raise ValueError(f"message size must be non-negative, got {size!r}")
    if n <= 1:
        _known(kind)
        return 0.0
    return link.latency * steps(kind, n) + factor(kind, n) * size / link.bandwidth


def ranks_per_node(group: Sequence[int], cluster: Cluster) -> Counter[int]:
    """How many of the group's ranks sit on each node (a rank outside the cluster is named
    by `cluster.node_of`); one pass of integer division, for groups of a million ranks."""
    if group:
        cluster.node_of(min(group))
        cluster.node_of(max(group))
    per_node = cluster.devices_per_node
    return Counter([rank // per_node for rank in group])


def link_for(group: Sequence[int], cluster: Cluster) -> Link:
    """`intra_node` when every rank of the group sits on one node, else `inter_node`."""
    nodes = ranks_per_node(group, cluster)
    return cluster.intra_node if len(nodes) <= 1 else cluster.inter_node


def collective_time(kind: str, size: float, group: Sequence[int], cluster: Cluster) -> float:
    """Seconds for `kind` of message size `size` on the ranks `group` (module docstring),
    times the cluster's `comm_scale` of `kind` when it names it."""
    scale = cluster.comm_scale.get(kind, 1.0) if cluster.comm_scale else 1.0
    return _collective_time(kind, size, group, cluster) * scale


def _collective_time(kind: str, size: float, group: Sequence[int], cluster: Cluster) -> float:
    n = len(group)
    per_node = ranks_per_node(group, cluster)
    if len(per_node) <= 1:
        return ring_time(kind, size, n, cluster.intra_node)
    counts = set(per_node.values())
    if kind not in HIERARCHICAL or len(counts) != 1:
        return ring_time(kind, size, n, cluster.inter_node)
    m, k = len(per_node), counts.pop()
    intra, inter = cluster.intra_node, cluster.inter_node
    if kind == "all_reduce":
        return (
            ring_time("reduce_scatter", size, k, intra)
            + ring_time("all_reduce", size / k, m, inter)
            + ring_time("all_gather", size, k, intra)
        )
    if kind == "all_gather":
        return ring_time("all_gather", size / k, m, inter) + ring_time("all_gather", size, k, intra)
    return ring_time("reduce_scatter", size, k, intra) + ring_time(
        "reduce_scatter", size / k, m, inter
    )


def step_time(step: CommStep, group: Sequence[int], cluster: Cluster) -> float:
    """Seconds for one reshard step (a `DistOp.comm`) on the ranks `group`.

    `step.bytes_per_rank` is the flat-ring traffic factor(kind, n) * S (see `shardlab.reshard`),
    so S = bytes_per_rank / factor; local steps and groups of one rank cost 0, plus the
    cluster's `op_overhead` (0 on the presets) like every step.
    """
    f = factor(step.kind, len(group))
    if f == 0.0:
        return cluster.op_overhead
    return collective_time(step.kind, step.bytes_per_rank / f, group, cluster) + cluster.op_overhead


def comm_op_group(mesh: Mesh, rank: int, axis: str | int) -> tuple[int, ...]:
    """The ranks a comm op on mesh axis `axis` runs with, seen from `rank`."""
    return mesh.group_of(rank, axis)
