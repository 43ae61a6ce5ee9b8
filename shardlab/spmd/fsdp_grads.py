"""FSDP's gradients under tensor parallelism: laid out as their parameter on the tensor axes.

What it is for: torchtitan applies FSDP2 on top of tensor parallelism. A parameter that
FSDP shards (annotated with `pin=False`: the `fsdp` and `zero3` templates) is a DTensor on
the tensor-parallel mesh, and its gradient leaves autograd in the placements DTensor's rules
give it there: a sequence-parallel norm's weight gradient is `Partial(sum)` over tp, a
vocab-parallel embedding's gradient is sharded on the vocabulary. FSDP2's post-backward
first redistributes the gradient to the parameter's own placements on that mesh
(`FSDPParam._get_grad_inner_tensor`: the norm's partial gradient is all-reduced over tp,
whole), then reduce-scatters the result over its data axis. So:

- completion hints the gradient's rule with the parameter's placements on the tensor axes
  (beside the annotation on the FSDP axis), and lays the gradient out so: the embedding's
  gradient stays vocab-sharded instead of being computed for the whole vocabulary on every
  tp rank;
- the lowering reduces a gradient's tensor axes before its FSDP axis (`fsdp_stage`): the
  whole gradient is all-reduced over tp, then reduce-scattered over dp, where the cheapest
  order would reduce-scatter first and all-reduce the half it keeps.

Tensor axes are those some parameter is pinned sharded on (as `export.dtensor` tells a
tensor-parallel axis from a data axis); data-parallel axes beside FSDP (HSDP's replicate
axis) are reduced after the reduce-scatter, as before.
"""

from __future__ import annotations

from collections.abc import Mapping

from shardlab.annotation import Annotation
from shardlab.autodiff import gradient_of
from shardlab.ir import Graph, ValueKind
from shardlab.placement import DistSpec, Partial, Placement, Shard

Slot = Mapping[int, tuple[Placement, Annotation]]


def tensor_axes(graph: Graph, slots: Mapping[str, Slot]) -> frozenset[int]:
    """The mesh axes (indices) some parameter is pinned sharded on: tensor parallelism's."""
    return frozenset(
        k
        for name, slot in slots.items()
        if name in graph.values and graph.values[name].kind == ValueKind.PARAM
        for k, (placement, ann) in slot.items()
        if ann.pin and isinstance(placement, Shard)
    )


def fsdp_managed(slot: Slot | None) -> bool:
    """Whether a parameter's annotations have FSDP gather it before use (`pin=False`)."""
    return slot is not None and any(not ann.pin for _, ann in slot.values())


def fsdp_parameter(graph: Graph, name: str) -> str | None:
    """The parameter whose gradient `name` is (`<p>.grad`), else None."""
    base = gradient_of(name)
    if base is None or name not in graph.values or base not in graph.values:
        return None
    if graph.values[name].kind != ValueKind.GRAD or graph.values[base].kind != ValueKind.PARAM:
        return None
    return base


def tensor_layout(param: DistSpec, axes: frozenset[int]) -> dict[int, Placement]:
    """The parameter's placements on the tensor axes (never partial: a stored value)."""
    return {
        k: param.placements[k] for k in sorted(axes) if not isinstance(param.placements[k], Partial)
    }


def fsdp_stage(
    graph: Graph,
    slots: Mapping[str, Slot],
    axes: frozenset[int],
    name: str,
    produced: DistSpec,
    final: DistSpec,
) -> DistSpec | None:
    """The spec an FSDP parameter's gradient `name` passes through from `produced` (its
    rule's) to `final` (its completed spec): its tensor axes (`axes`) as in `final`, its
    other axes as produced (FSDP2 reduces the tensor-parallel partial first). None when the
    gradient is not one FSDP reduces, or the step would change nothing."""
    param = fsdp_parameter(graph, name)
    if not axes or param is None or not fsdp_managed(slots.get(param)):
        return None
    mid = tuple(final.placements[k] if k in axes else p for k, p in enumerate(produced.placements))
    if mid in (produced.placements, final.placements):
        return None
    return DistSpec(final.mesh, mid)
