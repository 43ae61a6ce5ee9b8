"""What a sharding rule answers for one op: `RuleResult`.

A rule receives the specs in which the op's inputs arrive (None for a value whose placement
is still free) and answers the specs it needs them in (a difference is a reshard), the specs
its outputs come out in, whether it is the replicated fallback, and why. Rules whose local
computation is not simply the op's kernel on local shards (vocab-parallel embedding, causal
attention over a sharded query sequence, ...) name a local kernel and list the collectives
it performs inside the op.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from shardlab.ir import TensorType
from shardlab.mesh import Mesh
from shardlab.placement import DistSpec, Placement


@dataclass(frozen=True, slots=True)
class InnerComm:
    """A collective a local kernel performs inside the op (e.g. vocab-parallel softmax)."""

    kind: str  # all_reduce
    op: str  # sum | max
    axes: tuple[str, ...]
    type: TensorType  # global type of the reduced tensor
    reason: str


@dataclass(frozen=True, slots=True)
class AxisChoice:
    """The decision a rule took for one mesh axis, kept for explanations."""

    axis: str
    choice: str  # a letter, "R", or "P(op)"
    driver: int | None  # the input whose placement suggested it, if any
    cost: float  # estimated cost (bytes, latency and compute) of the op's whole choice
    #: Other choices for this axis and the cheapest whole choice that makes each.
    alternatives: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True, slots=True)
class RuleResult:
    """Required input specs, produced output specs, fallback flag and the reason."""

    input_specs: tuple[DistSpec, ...]
    output_specs: tuple[DistSpec, ...]
    reason: str
    fallback: bool = False
    kernel: str = "default"
    inner_comms: tuple[InnerComm, ...] = ()
    choices: tuple[AxisChoice, ...] = ()
    #: Estimated cost of the choice (`shardlab.spmd.cost`), for rules that solve several
    #: forms and keep the cheaper.
    cost: float = 0.0

    def reshards(self, arriving: Sequence[DistSpec | None]) -> list[int]:
        """Indices of inputs whose arriving spec differs from the required one."""
        return [
            i
            for i, (have, need) in enumerate(zip(arriving, self.input_specs, strict=True))
            if have is not None and have != need
        ]


@dataclass(frozen=True, slots=True)
class RuleContext:
    """Everything a rule may look at."""

    kind: str
    mesh: Mesh
    input_types: tuple[TensorType, ...]
    output_types: tuple[TensorType, ...]
    input_specs: tuple[DistSpec | None, ...]
    attrs: dict[str, Any] = field(default_factory=dict)
    #: Per output, the placement per mesh axis it should preferably come out in (from
    #: annotations); None where free.
    output_hints: tuple[tuple[Placement | None, ...] | None, ...] = ()
    #: For each output, the index of the input it overwrites in place (state updates), or None.
    inplace: tuple[int | None, ...] = ()
    #: Per input, the placement per mesh axis it must be used in where that is decided
    #: elsewhere (None where free): the annotation of a pinned source (a tensor-parallel
    #: weight is never gathered), or the spec in which the forward op read a tensor that its
    #: backward reads again (autograd's saved tensors keep their forward layout). Rules honour
    #: them when some choice can; `honours_hints` says whether a choice does.
    input_hints: tuple[tuple[Placement | None, ...] | None, ...] = ()
    #: Per output, True when every consumer is a sum that takes partial inputs together (a
    #: sum of gradient contributions, a residual add): its reduction is then counted once,
    #: where it happens, not estimated here.
    deferrable: tuple[bool, ...] = ()
    #: Per input, other placements it is already available in: an earlier consumer of the
    #: same phase had it resharded so, and the lowering reuses that copy (free to read).
    input_versions: tuple[frozenset[tuple[Placement, ...]], ...] = ()

    def hint_at(self, output: int, axis: int) -> Placement | None:
        """The preferred placement of output `output` on mesh axis `axis`, if any."""
        if output >= len(self.output_hints) or self.output_hints[output] is None:
            return None
        hint = self.output_hints[output]
        assert hint is not None
        return hint[axis]

    def defers(self, output: int) -> bool:
        """True when output `output`'s consumers all reduce partial inputs together."""
        return output < len(self.deferrable) and self.deferrable[output]

    def available(self, i: int, placements: tuple[Placement, ...]) -> bool:
        """True when input i already exists in `placements` (arriving, or a reused copy)."""
        spec = self.input_specs[i]
        if spec is not None and spec.placements == placements:
            return True
        return i < len(self.input_versions) and placements in self.input_versions[i]

    def input_hint_at(self, i: int, axis: int) -> Placement | None:
        """The placement input `i` must be used in on mesh axis `axis`, if decided."""
        if i >= len(self.input_hints) or self.input_hints[i] is None:
            return None
        hint = self.input_hints[i]
        assert hint is not None
        return hint[axis]

    def hint(self, output: int) -> DistSpec | None:
        """The preferred spec of an output when every axis has a preference."""
        if output >= len(self.output_hints):
            return None
        hint = self.output_hints[output]
        if hint is None or any(p is None for p in hint):
            return None
        return DistSpec(self.mesh, tuple(p for p in hint if p is not None))
