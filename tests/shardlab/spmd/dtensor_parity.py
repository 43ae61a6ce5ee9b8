"""Bytes moved by our sharding rules against PyTorch DTensor's sharding propagation, op by op.

For an op of our catalog (`dtensor_parity_cases`) and every combination of arriving input
placements on a (2, 2) mesh (per input and mesh axis: R, S(d) for each dim, P(sum) for float
inputs), one `Record` holds both answers:

- ours: `shardlab.spmd.infer`'s required input specs and output spec, and the bytes per rank
  of the reshards from arriving to required (`plan_transition` + `total_bytes`);
- theirs: the redistributions DTensor's propagator decides for the same inputs, and its
  output placements. Most ops run on DTensors over a fake process group (no communication)
  under `DebugMode`, which records every redistribute decision (arriving -> target spec,
  per aten op DTensor sees, decompositions included); ops whose DTensor strategy belongs to
  a GPU-only fused kernel (`_fused_rms_norm`, `_scaled_dot_product_flash_attention`) are
  asked directly with `ShardingPropagator.propagate_op_sharding(OpSchema)`. Each decided
  redistribution is costed by the same ring formulas, with the cheaper of our planner and
  DTensor's own plan (`_gen_transform_infos`), so a difference measures the choice and not
  the planner; DTensor's own plan is kept next to it (`theirs_plan_bytes`).

A Partial output is a deferred reduction: `*_resolve` is the all-reduce that resolving it
would cost and `*_total` adds it. `worse` (ours moves more both ways) is the failure; a case
worse on input bytes only is DTensor deferring a reduction (`deferral`). `reason` sorts the
failures (`REASONS`): (a) gathers where an all_to_all would do, (b) all-reduces a partial
where a reduce-scatter would do, (c) reshape gathers where DTensor keeps a strided shard,
(d) an axis nothing arrives sharded on stays replicated where DTensor shards it for free,
(e) the rules' per-axis estimate misprices ours or DTensor's reshard, (f) fewer
collectives: worse in bytes only, not under our alpha-beta cost, (g) two inputs partial on
different axes, which DTensor multiplies and we do not.
Records are cached in-process (`evaluate`).
"""

from __future__ import annotations

import contextlib
import itertools
import math
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, _redistribute
from torch.distributed.tensor import Partial as TPartial
from torch.distributed.tensor import Replicate as TReplicate
from torch.distributed.tensor import Shard as TShard
from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
from torch.distributed.tensor._op_schema import OpSchema
from torch.testing._internal.distributed.fake_pg import FakeStore
from torch.utils._debug_mode import DebugMode

from shardlab.errors import PlacementError
from shardlab.ir import DTYPE_BYTES, TensorType
from shardlab.mesh import Mesh
from shardlab.ops import infer_types
from shardlab.placement import (
    DistSpec,
    Partial,
    Placement,
    Replicate,
    Shard,
    format_placements,
    local_shape,
)
from shardlab.reshard import COLLECTIVES, plan_transition, total_bytes
from shardlab.spmd import infer
from shardlab.spmd.cost import LATENCY_BYTES, axis_cost, local_bytes

MESH = Mesh((2, 2), ("dp", "tp"))
INT = "int64"
TOL = 1e-6  # bytes: closer than this, two byte counts are equal
REASONS = {
    "a": "gathers an input the op cannot keep sharded where an all_to_all onto another dim "
    "would do",
    "b": "resolves a Partial input (all-reduce) where a reduce-scatter, or keeping it partial, "
    "would do",
    "c": "reshape moves a merged inner dim's shard to the group's outer dim (one all_to_all) "
    "where DTensor keeps a _StridedShard (no comm), a placement we do not have",
    "d": "a mesh axis that no input arrives sharded or partial on stays replicated (by policy: "
    "spmd/einsum.py, step 1); DTensor shards a dim on it (free local slices, which also "
    "shrink what the other axis moves) and hands its consumers a layout they did not ask for",
    "e": "the rules' per-axis cost estimate (spmd/cost.py axis_cost) misprices a reshard: "
    "it prices every axis on the arriving block, so it misses that nested shards of one dim "
    "must move and that slicing on another axis first shrinks a gather or all_to_all",
    "f": "fewer collectives: worse in bytes, but not under our alpha-beta cost (LATENCY_BYTES "
    "per collective outweighs the bytes of these small tensors)",
    "g": "a product of two inputs partial on different mesh axes is partial on both (rank "
    "(i, j) computes a_i b_j); our rules keep at most one input partial and resolve the other",
    "other": "none of the above",
}


@dataclass(frozen=True)
class Operand:
    """An op input: global shape, dtype, and its torch layout (torch dim i is our dim
    `perm[i]`; e.g. linear's weight is [in, out] for us and [out, in] for torch)."""

    shape: tuple[int, ...]
    dtype: str = "float32"
    perm: tuple[int, ...] | None = None
    #: Placements to enumerate (texts); None: every combination.
    only: tuple[str, ...] | None = None
    #: Index of an earlier operand whose arriving placements this one copies.
    tie: int | None = None

    def torch_shape(self) -> tuple[int, ...]:
        return self.shape if self.perm is None else tuple(self.shape[d] for d in self.perm)

    def torch_dim(self, dim: int) -> int:
        return dim if self.perm is None else self.perm.index(dim)

    def placements(self) -> list[tuple[Placement, ...]]:
        """Every placement tuple on MESH that shards evenly (Partial only for floats)."""
        per: list[Placement] = [Replicate(), *(Shard(d) for d in range(len(self.shape)))]
        if self.dtype != INT:
            per.append(Partial("sum"))
        out = []
        for combo in itertools.product(per, repeat=MESH.ndim):
            parts: dict[int, int] = {}
            for k, p in enumerate(combo):
                if isinstance(p, Shard):
                    parts[p.dim] = parts.get(p.dim, 1) * MESH.shape[k]
            even = all(self.shape[d] % n == 0 for d, n in parts.items())
            if even and (self.only is None or format_placements(combo) in self.only):
                out.append(combo)
        return out


#: Direct propagation: (aten op, DTensor specs of the operands -> args of the op).
Direct = tuple[Any, Callable[[list[DTensorSpec]], tuple[Any, ...]]]


@dataclass(frozen=True)
class ParityCase:
    """One op of our catalog and the torch code that computes it on DTensors."""

    name: str  # unique; a record's id is name(arriving placements)
    family: str  # grouping for tests and reports
    kind: str
    operands: tuple[Operand, ...]
    attrs: Mapping[str, Any] = field(default_factory=dict)
    #: Run mode: the torch function of the op on DTensors (in torch layout).
    torch_fn: Callable[..., Any] | None = None
    #: Direct mode, for fused GPU kernels that CPU DTensors never dispatch.
    direct: Direct | None = None
    #: Torch layout of the output (as `Operand.perm`), to report DTensor's output in ours.
    out_perm: tuple[int, ...] | None = None
    #: Run on meta local tensors (nothing computed); False where an op has no meta kernel.
    meta: bool = True

    def combos(self) -> Iterator[tuple[tuple[Placement, ...], ...]]:
        """Every combination of arriving placements (tied operands copy theirs)."""
        free = [i for i, o in enumerate(self.operands) if o.tie is None]
        for picked in itertools.product(*(self.operands[i].placements() for i in free)):
            chosen = dict(zip(free, picked, strict=True))
            yield tuple(chosen[i if o.tie is None else o.tie] for i, o in enumerate(self.operands))


@dataclass(frozen=True)
class Step:
    """One redistribution DTensor decided: aten op, its arg, arriving -> target (torch
    layout of that arg), bytes and the collectives (`kind@axis`) of the cheaper plan."""

    op: str
    arg: int
    src: str
    dst: str
    bytes: float  # the cheaper of our planner and DTensor's plan
    plan_bytes: float  # DTensor's own plan
    comms: tuple[str, ...] = ()
    estimate: float = 0.0  # what our rules' per-axis estimate (spmd/cost.py) says it costs

    def __str__(self) -> str:
        return f"{self.op}#{self.arg}: {self.src}->{self.dst} ({human(self.bytes)})"


@dataclass(frozen=True)
class Record:
    """Both answers for one op application; bytes are per rank."""

    name: str
    family: str
    kind: str
    arriving: tuple[str, ...]
    sizes: tuple[int, ...] = ()  # global bytes of each operand
    ours_need: tuple[str, ...] = ()
    ours_out: str = ""
    ours_bytes: float = 0.0
    ours_resolve: float = 0.0
    ours_comms: tuple[str, ...] = ()
    ours_estimate: float = 0.0  # bytes our rule's per-axis estimate expects it to move
    steps: tuple[Step, ...] = ()
    theirs_out: str = ""
    theirs_resolve: float = 0.0
    error: str | None = None  # "ours: ..." or "DTensor: ..." when a side refused the case

    @property
    def id(self) -> str:
        return f"{self.name}({' '.join(self.arriving)})"

    @property
    def theirs_bytes(self) -> float:
        return sum(s.bytes for s in self.steps)

    @property
    def theirs_plan_bytes(self) -> float:
        return sum(s.plan_bytes for s in self.steps)

    @property
    def theirs_estimate(self) -> float:
        return sum(s.estimate for s in self.steps)

    @property
    def theirs_comms(self) -> tuple[str, ...]:
        return tuple(c for s in self.steps for c in s.comms)

    @property
    def ours_total(self) -> float:
        return self.ours_bytes + self.ours_resolve

    @property
    def theirs_total(self) -> float:
        return self.theirs_bytes + self.theirs_resolve

    @property
    def verdict(self) -> str:
        """'<', '=' or '>': our input reshard bytes against DTensor's."""
        return _cmp(self.ours_bytes, self.theirs_bytes)

    @property
    def verdict_total(self) -> str:
        """The same with each side's all-reduce of a Partial output added."""
        return _cmp(self.ours_total, self.theirs_total)

    @property
    def worse(self) -> bool:
        """We move more bytes than DTensor both ways (deferred reductions counted or not)."""
        return self.error is None and self.verdict == ">" and self.verdict_total == ">"

    @property
    def deferral(self) -> bool:
        """More input bytes only because DTensor defers a reduction we do not."""
        return self.error is None and self.verdict == ">" and self.verdict_total != ">"

    def describe(self) -> str:
        theirs = "; ".join(map(str, self.steps)) or "no redistribution"
        return (
            f"{self.id}: ours need {' '.join(self.ours_need)} -> {self.ours_out} "
            f"({human(self.ours_bytes)}, +{human(self.ours_resolve)} to resolve); DTensor "
            f"{theirs} -> {self.theirs_out} ({human(self.theirs_bytes)}, "
            f"+{human(self.theirs_resolve)})"
        )


def human(nbytes: float) -> str:
    """`512 B`, `1.5 KiB`, `3 MiB`."""
    for unit, size in (("MiB", 2.0**20), ("KiB", 2.0**10)):
        if nbytes >= size:
            return f"{nbytes / size:.3g} {unit}"
    return f"{nbytes:.3g} B"


def _cmp(a: float, b: float) -> str:
    return "<" if a < b - TOL else ">" if a > b + TOL else "="


_TOKEN = re.compile(r"SS\(\d+\)|S\(\d+\)|R|P\(\w+\)")


def tokens(text: str) -> list[str]:
    """Per mesh axis tokens of a placements text (`S(0)SS(2)` -> ['S(0)', 'SS(2)'])."""
    return _TOKEN.findall(text)


def _collectives(comms: Sequence[str], out: str) -> int:
    """Collectives launched, counting one all-reduce per partial axis of the output."""
    return len(comms) + sum(t.startswith("P") for t in tokens(out))


def reason(r: Record) -> str | None:
    """Why we move more than DTensor (a key of REASONS), or None when we do not. The first
    test that matches wins, in the order of the checks below."""
    if not r.worse:
        return None
    ours, theirs = r.ours_comms, r.theirs_comms
    ours_ab = r.ours_total + LATENCY_BYTES * _collectives(ours, r.ours_out)
    if ours_ab <= r.theirs_total + LATENCY_BYTES * _collectives(theirs, r.theirs_out) + TOL:
        return "f"
    if r.family == "reshape" and "SS(" in r.theirs_out:
        return "c"
    arriving = [tokens(a) for a in r.arriving]
    partial_axes = {k for a in arriving for k, t in enumerate(a) if t.startswith("P")}
    both = [all(t.startswith("P") for t in tokens(out)) for out in (r.theirs_out, r.ours_out)]
    if len(partial_axes) > 1 and both == [True, False]:
        return "g"
    big = [i for i, size in enumerate(r.sizes) if 2 * size >= max(r.sizes)]
    for i in big:  # a large input arrives partial; we resolve it, DTensor does not
        for k, t in enumerate(arriving[i]):
            kept = tokens(r.theirs_out)[k] != "R"
            if t.startswith("P") and tokens(r.ours_need[i])[k] == "R" and kept:
                return "b"
    for k in range(MESH.ndim):
        idle = all(not a[k].startswith("S") for a in arriving)
        if idle and "S" not in tokens(r.ours_out)[k] and "S" in tokens(r.theirs_out)[k]:
            return "d"
    if r.ours_bytes > r.ours_estimate + TOL or r.theirs_estimate > r.theirs_bytes + TOL:
        return "e"

    def count(comms: Sequence[str], kind: str) -> int:
        return sum(c.startswith(kind) for c in comms)

    if count(theirs, "all_to_all") > count(ours, "all_to_all") and count(ours, "all_gather"):
        return "a"
    return "other"


# -- placements and bytes, both ways ---------------------------------------------------------


def to_torch(p: Placement, operand: Operand) -> Any:
    if isinstance(p, Shard):
        return TShard(operand.torch_dim(p.dim))
    return TPartial(p.op) if isinstance(p, Partial) else TReplicate()


def _strided(p: Any) -> bool:
    return type(p).__name__ == "_StridedShard"


def torch_text(spec: DTensorSpec, perm: Sequence[int] | None = None) -> str:
    """Our text form of a DTensor spec (dims mapped back through `perm`); `SS(d)` is a
    strided shard, a trailing `~` a non-default shard order (neither exists for us)."""
    out = []
    for p in spec.placements:
        if p.is_shard() or _strided(p):
            dim = p.dim if perm is None else perm[p.dim]
            out.append(f"SS({dim})" if _strided(p) else f"S({dim})")
        elif p.is_replicate():
            out.append("R")
        else:
            out.append(f"P({p.reduce_op})")  # _MaskPartial (embedding) is a masked sum
    default = DTensorSpec.is_default_device_order(spec.shard_order)
    return "".join(out) + ("" if default else "~")


def _ours(spec: DTensorSpec) -> tuple[Placement, ...] | None:
    """Our placements of a DTensor spec, or None where we have no equivalent."""
    if any(_strided(p) for p in spec.placements):
        return None
    if not DTensorSpec.is_default_device_order(spec.shard_order):
        return None
    return tuple(
        Shard(p.dim) if p.is_shard() else Replicate() if p.is_replicate() else Partial(p.reduce_op)
        for p in spec.placements
    )


def _block_bytes(spec: DTensorSpec, placements: Sequence[Any]) -> float:
    numel = math.prod(spec.shape)
    for k, p in enumerate(placements):
        if p.is_shard() or _strided(p):
            numel //= spec.mesh.size(k)
    return float(numel * spec.tensor_meta.dtype.itemsize)


def dtensor_plan(src: DTensorSpec, dst: DTensorSpec) -> tuple[float, tuple[str, ...]]:
    """Bytes per rank (our ring formulas) and collectives of DTensor's plan src -> dst."""
    state = list(src.placements)
    total, comms = 0.0, []
    for info in _redistribute._gen_transform_infos(src, dst):
        k, n = info.mesh_dim, src.mesh.size(info.mesh_dim)
        new = info.src_dst_placements[1]
        block = _block_bytes(src, state)
        kind = info._comm_type_key()
        if kind == "all_reduce":
            total += 2 * (n - 1) / n * block
        elif kind == "all_gather":
            total += (n - 1) / n * block * n
        elif kind in ("reduce_scatter", "all_to_all"):
            total += (n - 1) / n * block
        if kind is not None:
            comms.append(f"{kind}@{MESH.axis_names[k]}")
        state[k] = new
    return total, tuple(comms)


def _comms(steps: Sequence[Any]) -> tuple[str, ...]:
    return tuple(
        f"{s.kind}@{s.axis}" for s in steps if s.kind in COLLECTIVES and s.bytes_per_rank > 0
    )


def redistribute_cost(src: DTensorSpec, dst: DTensorSpec) -> dict[str, Any]:
    """Step fields for src -> dst: bytes of the cheaper of our planner and DTensor's plan,
    DTensor's plan bytes, the cheaper plan's collectives, and our per-axis estimate."""
    theirs, comms = dtensor_plan(src, dst)
    out = {"bytes": theirs, "plan_bytes": theirs, "comms": comms, "estimate": theirs}
    a, b = _ours(src), _ours(dst)
    dtype = {torch.float32: "float32", torch.int64: INT}.get(src.tensor_meta.dtype)
    if a is None or b is None or dtype is None:
        return out
    shape = tuple(src.shape)
    try:
        steps = plan_transition(shape, dtype, MESH, DistSpec(MESH, a), DistSpec(MESH, b))
    except PlacementError:  # an intermediate that does not shard evenly
        return out
    out["estimate"] = estimate_bytes(shape, dtype, DistSpec(MESH, a), DistSpec(MESH, b))
    if total_bytes(steps) < theirs - TOL:
        out.update(bytes=total_bytes(steps), comms=_comms(steps))
    return out


def resolve_bytes(block: float, partial_axes: Sequence[int]) -> float:
    """All-reduce (ring) of a block of `block` bytes over each partial mesh axis."""
    return sum(2 * (MESH.shape[k] - 1) / MESH.shape[k] * block for k in partial_axes)


# -- the two sides ---------------------------------------------------------------------------


def estimate_bytes(shape: Sequence[int], dtype: str, src: DistSpec, dst: DistSpec) -> float:
    """Bytes our rules' per-axis estimate (`spmd.cost.axis_cost`, latency left out) puts on
    src -> dst: each axis priced on the arriving block, whatever the other axes do."""
    nbytes = local_bytes(TensorType(tuple(shape), dtype), src)
    total = 0.0
    for k, (a, b) in enumerate(zip(src.placements, dst.placements, strict=True)):
        cost = axis_cost(nbytes, MESH.shape[k], a, b)
        total += max(0.0, cost - LATENCY_BYTES) if cost else 0.0
    return total


def ours_side(case: ParityCase, combo: Sequence[tuple[Placement, ...]]) -> dict[str, Any]:
    types = [TensorType(o.shape, o.dtype) for o in case.operands]
    specs = [DistSpec(MESH, p) for p in combo]
    result = infer(case.kind, types, specs, dict(case.attrs), MESH)
    plans = [
        plan_transition(t.shape, t.dtype, MESH, have, need)
        for t, have, need in zip(types, specs, result.input_specs, strict=True)
    ]
    out = result.output_specs[0]
    out_type = infer_types(case.kind, types, dict(case.attrs))[0]
    block = math.prod(local_shape(out_type.shape, MESH, out.placements))
    partial = [k for k, p in enumerate(out.placements) if isinstance(p, Partial)]
    return {
        "ours_estimate": sum(
            estimate_bytes(t.shape, t.dtype, have, need)
            for t, have, need in zip(types, specs, result.input_specs, strict=True)
        ),
        "ours_need": tuple(format_placements(s.placements) for s in result.input_specs),
        "ours_out": format_placements(out.placements),
        "ours_bytes": sum(total_bytes(p) for p in plans),
        "ours_resolve": resolve_bytes(block * DTYPE_BYTES[out_type.dtype], partial),
        "ours_comms": tuple(c for p in plans for c in _comms(p)),
    }


def _dtype(operand: Operand) -> Any:
    return torch.int64 if operand.dtype == INT else torch.float32


def _step(op: str, arg: int, have: DTensorSpec, need: DTensorSpec) -> Step:
    return Step(op, arg, torch_text(have), torch_text(need), **redistribute_cost(have, need))


def theirs_direct(case: ParityCase, combo: Sequence[tuple[Placement, ...]], dmesh: Any) -> dict:
    """DTensor's decision asked from its propagator, without running anything."""
    assert case.direct is not None
    op, make_args = case.direct
    specs = []
    for o, pl in zip(case.operands, combo, strict=True):
        shape = torch.Size(o.torch_shape())
        meta = TensorMeta(shape, torch.empty(shape, device="meta").stride(), _dtype(o))
        specs.append(DTensorSpec(dmesh, tuple(to_torch(p, o) for p in pl), tensor_meta=meta))
    schema = OpSchema(op, make_args(specs), {})
    sharding = DTensor._op_dispatcher.sharding_propagator.propagate_op_sharding(schema)
    steps = []
    if sharding.needs_redistribute and sharding.redistribute_schema is not None:
        targets = sharding.redistribute_schema.args_spec
        for i, (have, need) in enumerate(zip(schema.args_spec, targets, strict=True)):
            if have.placements != need.placements:
                steps.append(_step(op.name(), i, have, need))
    out = sharding.output_spec
    return _theirs(case, steps, out[0] if isinstance(out, tuple) else out)


def theirs_run(case: ParityCase, combo: Sequence[tuple[Placement, ...]], dmesh: Any) -> dict:
    """DTensor's decisions recorded while the torch function runs on a fake process group
    (nothing is sent; with `case.meta`, nothing is computed either)."""
    return _run(case, combo, dmesh, "meta" if case.meta else "cpu")


def _run(case: ParityCase, combo: Sequence[tuple[Placement, ...]], dmesh: Any, dev: str) -> dict:
    assert case.torch_fn is not None
    xs = []
    for o, pl in zip(case.operands, combo, strict=True):
        tpl = [to_torch(p, o) for p in pl]
        shape = o.torch_shape()
        local = list(shape)
        for k, p in enumerate(tpl):
            if p.is_shard():
                local[p.dim] //= MESH.shape[k]
        data = torch.zeros(local, dtype=_dtype(o), device=dev)
        stride = torch.empty(shape, device="meta").stride()
        xs.append(DTensor.from_local(data, dmesh, tpl, run_check=False, shape=shape, stride=stride))
    with DebugMode(store_original_args=True) as mode:
        out = case.torch_fn(*xs)
    steps, op = [], "?"
    for call in mode.operators:
        kind = type(call).__name__
        if kind == "_OpCall" and call.call_depth == 0:
            op = str(call.op).removeprefix("aten.")
        elif kind == "_RedistributeCall" and isinstance(call.arg, int):  # the decision
            steps.append(_step(op, call.arg, call.src_placement, call.dst_placement))
    return _theirs(case, steps, (out[0] if isinstance(out, tuple) else out)._spec)


def _theirs(case: ParityCase, steps: list[Step], out: DTensorSpec) -> dict[str, Any]:
    partial = [k for k, p in enumerate(out.placements) if p.is_partial()]
    return {
        "steps": tuple(steps),
        "theirs_out": torch_text(out, case.out_perm),
        "theirs_resolve": resolve_bytes(_block_bytes(out, out.placements), partial),
    }


# -- running ---------------------------------------------------------------------------------

_CACHE: dict[str, list[Record]] = {}


@contextlib.contextmanager
def fake_world() -> Iterator[Any]:
    """A 4-rank fake process group (no communication) and its (2, 2) DeviceMesh."""
    if dist.is_initialized():
        raise RuntimeError("a torch.distributed process group is already initialised")
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=MESH.size)
    try:
        ranks = torch.arange(MESH.size).reshape(MESH.shape)
        yield DeviceMesh("cpu", ranks, mesh_dim_names=MESH.axis_names)
    finally:
        dist.destroy_process_group()


def _first_line(e: Exception) -> str:
    lines = [line for line in str(e).splitlines() if line.strip()]
    return f"{type(e).__name__}: {lines[0] if lines else ''}"[:300]


def evaluate(case: ParityCase, dmesh: Any) -> list[Record]:
    """Both sides for every arriving combination of `case` (cached by case name)."""
    if case.name in _CACHE:
        return _CACHE[case.name]
    records = []
    for combo in case.combos():
        head = {
            "name": case.name,
            "family": case.family,
            "kind": case.kind,
            "arriving": tuple(format_placements(p) for p in combo),
            "sizes": tuple(TensorType(o.shape, o.dtype).nbytes for o in case.operands),
        }
        try:
            ours = ours_side(case, combo)
        except Exception as e:  # a refusal is a result, reported as such
            records.append(Record(**head, error=f"ours: {_first_line(e)}"))
            continue
        try:
            with torch.no_grad():
                theirs = (theirs_direct if case.direct else theirs_run)(case, combo, dmesh)
        except Exception as e:
            records.append(Record(**head, **ours, error=f"DTensor: {_first_line(e)}"))
            continue
        records.append(Record(**head, **ours, **theirs))
    _CACHE[case.name] = records
    return records
