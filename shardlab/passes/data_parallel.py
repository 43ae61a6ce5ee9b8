"""Data-parallel optimization passes (seed 002): gradient scaling, all-reduce fusion, overlap.

Under data parallelism every weight gradient leaves the backward as P(sum) on the dp mesh
axis, and lowering puts its `all_reduce` (P -> R, stream `comm:dp`) right before the optimizer
op that reads it. Each pass is a pure function `(program, training graph, options) ->
PassResult` that builds new op lists (linear in program size, overlap sorts once):

- `dp_grad_scaling`: folds `scale` ops on gradients next to their all-reduce (a loss gradient
  that averages over the local batch needs 1/dp there) into the loss gradient. Shardlab's own
  loss gradient already divides by the global token count, so lowered programs have none.
- `dp_fuse_allreduce`: groups gradient all-reduces into buckets and turns each bucket of
  several into pack -> all_reduce -> unpack; the unpack writes the reduced values the
  optimizer ops already read, so they need no change but their deps.
- `dp_overlap`: issues each gradient all-reduce (with its pack) right after the last gradient
  it needs, on its comm stream, so it runs behind the rest of the backward; the compute stream
  waits only where a reduced gradient is first read (the unpack, or the optimizer op).

The packed buffer of a bucket is a 1-D value of the members' dtype whose global length is the
members' total numel. Its placement is the members' Partial on the reduced mesh axis, and on
every other mesh axis S(0) where the members are sharded (on any dim), R where they are
replicated, or their Partial. Every member is split over the same axes by the same factor, so
a rank's block is exactly the concatenation of its flattened member blocks (`pack` on local
blocks), and the all-reduce sums blocks that sit at the same coordinates on the other axes,
i.e. the same regions of every member, element for element; `unpack` cuts the reduced block
back into the member blocks. The buffer's global view is the concatenated members in
rank-block order, a permutation nobody reads.

Streams: the local steps these passes move run on the compute stream, and `dp_overlap`
leaves the second step of a cross-stream gradient chain in place; `passes.dp_streams` says
why (these two once made the llama3-8b dp=8,tp=8 plan's predicted step slower).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from shardlab.errors import GraphError, ShardlabError
from shardlab.ir import DTYPE_BYTES, Graph, OpRole, TensorType, ValueKind
from shardlab.ops import get_op
from shardlab.passes.base import PassResult
from shardlab.passes.dp_streams import local_on_compute, waits_on_other_comm_stream
from shardlab.placement import DistSpec, Placement, Shard, local_shape
from shardlab.program import DistOp, DistProgram
from shardlab.reshard import CommStep

#: Optimizer kinds whose gradient all-reduces the passes handle (`attrs["consumer"]`).
GRAD_CONSUMERS = ("adamw", "sgd")
#: Bucket cap of `dp_fuse_allreduce` in MiB (PyTorch DDP's and Paddle's default).
DEFAULT_BUCKET_MB = 25.0
#: Bucket caps (MiB) the cost guard tries when the user sets none (`bucket_mb_candidates`).
BUCKET_MB_CANDIDATES = (1.0, 4.0, 16.0, 25.0, 64.0, 256.0)
MIB = 2**20
NO_SCALE_MESSAGE = "0 scale ops: the loss gradient already averages over the global batch"
#: The cross-entropy gradient kernel that divides by the global token count.
GLOBAL_MEAN_KERNEL = "cross_entropy_grad_sharded"


class PassOptionError(ShardlabError):
    """A pass option has a value the pass cannot use."""

    code = "invalid_pass_option"


def is_grad_all_reduce(op: DistOp) -> bool:
    """True for an all_reduce that an optimizer op asked for (a gradient all-reduce)."""
    return (
        op.comm is not None
        and op.comm.kind == "all_reduce"
        and op.attrs.get("consumer") in GRAD_CONSUMERS
    )


def _with(program: DistProgram, ops: list[DistOp], **changes: Any) -> DistProgram:
    """A new program with `ops` and copies of the tables (updated by `changes`)."""
    return DistProgram(
        program.mesh,
        ops,
        changes.get("types", dict(program.types)),
        changes.get("specs", dict(program.specs)),
        changes.get("values", dict(program.values)),
    )


def _renamed(op: DistOp, values: Mapping[str, str], ops: Mapping[str, Sequence[str]]) -> DistOp:
    """`op` reading `values[v]` for v, and depending on `ops[d]` for a removed op d."""
    ins = tuple(values.get(v, v) for v in op.inputs)
    deps = tuple(sorted({n for d in op.deps for n in ops.get(d, (d,))}))
    return op if ins == op.inputs and deps == op.deps else replace(op, inputs=ins, deps=deps)


# -- dp_grad_scaling ----------------------------------------------------------------------


def dp_grad_scaling(
    program: DistProgram, training: Graph, options: Mapping[str, Any]
) -> PassResult:
    """Fold the `scale` ops on gradients (right before or after their all-reduce) into the
    loss gradient, when every optimized gradient carries one with the same factor f.

    Gradients are linear in the loss gradient, so scaling it by f scales every parameter
    gradient exactly as the scale ops did. Where f is 1 / (the shards of the labels) and the
    cross-entropy gradient divides by the local token count (a per-rank mean, the reason for
    Paddle's 1/dp scale ops), the fold switches it to the `cross_entropy_grad_sharded` kernel,
    which divides by the global count: every value then equals one device's. Otherwise the
    seed d(loss) is multiplied by f (Paddle's scaled fill): parameter gradients are exact and
    the seed and activation gradients carry f.
    """
    ops = program.ops
    producer = {v: op for op in ops for v in op.outputs}
    readers: dict[str, list[DistOp]] = {}
    for op in ops:
        for v in op.inputs:
            readers.setdefault(v, []).append(op)
    scales = [op for op in ops if op.kind == "scale" and _beside_all_reduce(op, producer, readers)]
    n = len(scales)
    if n == 0:
        summary = {"scale_ops_before": 0, "scale_ops_after": 0, "message": NO_SCALE_MESSAGE}
        return PassResult(program, summary)
    by_name = {op.name: op for op in scales}
    factors = sorted({float(op.attrs["factor"]) for op in scales})
    loss = str(training.meta.get("loss", training.outputs[0]))
    seed_value = program.values.get(f"{loss}.grad", f"{loss}.grad")
    seed = producer.get(seed_value)
    target = _loss_gradient_target(program, seed, readers.get(seed_value, []), factors[0])
    why = _cannot_fold(ops, by_name, producer, readers, factors, target)
    grads = [_grad_name(op, producer, readers) for op in scales]
    base = {"scale_ops_before": n, "values": grads, "factors": factors}
    if why is not None or target is None:
        msg = f"{n} scale ops kept: {why}"
        return PassResult(program, {**base, "scale_ops_after": n, "message": msg})
    f = factors[0]
    if target.kind == "fill":
        how = f"seed x{f:g}"
        folded = replace(target, attrs={**target.attrs, "value": float(target.attrs["value"]) * f})
    else:
        how = f"x{f:g}: it divides by the global token count"
        folded = replace(target, kernel=GLOBAL_MEAN_KERNEL)
    folded = replace(folded, reason=f"{target.reason}; {n} gradient scale ops folded ({how})")
    alias = {op.outputs[0]: op.inputs[0] for op in scales}
    dropped = {op.name: op.deps for op in scales}
    new_ops = [
        _renamed(folded if op is target else op, alias, dropped)
        for op in ops
        if op.name not in by_name
    ]
    types = {v: t for v, t in program.types.items() if v not in alias}
    specs = {v: s for v, s in program.specs.items() if v not in alias}
    values = {k: alias.get(v, v) for k, v in program.values.items()}
    new = _with(program, new_ops, types=types, specs=specs, values=values)
    msg = f"{n} scale ops folded into the loss gradient {target.name!r} ({how})"
    summary = {**base, "scale_ops_after": 0, "folded_into": target.name, "message": msg}
    return PassResult(new, summary)


def _loss_gradient_target(
    program: DistProgram, seed: DistOp | None, seed_readers: Sequence[DistOp], factor: float
) -> DistOp | None:
    """Where a factor folds: the per-rank-mean cross-entropy gradient reading the seed when
    the factor is 1 / (shards of its labels), else the seed's fill op (None: neither)."""
    if len(seed_readers) == 1 and seed_readers[0].kind == "cross_entropy_grad":
        op = seed_readers[0]
        labels = op.inputs[1]
        t, spec = program.types[labels], program.specs[labels]
        shards = t.numel // math.prod(local_shape(t.shape, program.mesh, spec.placements))
        mean = op.attrs.get("reduction", "mean") == "mean"
        if op.kernel == "default" and mean and abs(factor * shards - 1) < 1e-12:
            return op
    return seed if seed is not None and seed.kind == "fill" else None


def _beside_all_reduce(
    op: DistOp, producer: Mapping[str, DistOp], readers: Mapping[str, list[DistOp]]
) -> bool:
    """True when `op` scales an all-reduced gradient, or a gradient its all-reduce reads."""
    made_by = producer.get(op.inputs[0])
    after = made_by is not None and is_grad_all_reduce(made_by)
    return after or any(is_grad_all_reduce(r) for r in readers.get(op.outputs[0], ()))


def _grad_name(op: DistOp, producer: Mapping[str, DistOp], readers: Mapping[str, Any]) -> str:
    """The serial gradient a gradient scale op scales (its all-reduce's `value`)."""
    made_by = producer.get(op.inputs[0])
    if made_by is not None and is_grad_all_reduce(made_by):
        return str(made_by.attrs["value"])
    return str(next(r for r in readers[op.outputs[0]] if is_grad_all_reduce(r)).attrs["value"])


def _cannot_fold(
    ops: Sequence[DistOp],
    scales: Mapping[str, DistOp],
    producer: Mapping[str, DistOp],
    readers: Mapping[str, list[DistOp]],
    factors: Sequence[float],
    target: DistOp | None,
) -> str | None:
    """Why the scale ops cannot be folded into the loss gradient, or None when they can."""
    if target is None:
        return "the loss gradient is neither a per-rank-mean cross entropy nor a fill op"
    if len(factors) > 1:
        return f"the factors differ ({', '.join(f'{f:g}' for f in factors)})"
    shared = [op.name for op in scales.values() if len(readers[op.inputs[0]]) > 1]
    if shared:
        return f"{shared[0]!r} scales a value that other ops read too"
    for op in ops:
        if op.kind not in GRAD_CONSUMERS:
            continue
        v, found = op.inputs[1], 0
        while (made_by := producer.get(v)) is not None and (
            made_by.is_comm or made_by.name in scales
        ):
            found += made_by.name in scales
            v = made_by.inputs[0]
        if found != 1:
            return f"the gradient of optimizer op {op.name!r} has {found} scale ops, not 1"
    return None


# -- dp_fuse_allreduce --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Member:
    """One gradient all-reduce in a bucket: the op, where its gradient is made, its bytes."""

    reduce: DistOp
    made_at: int
    nbytes: int


@dataclass
class _Bucket:
    """Gradient all-reduces fused into one: same axis, dtype and buffer placements."""

    axis: str
    dtype: str
    placements: tuple[Placement, ...]  # of the packed buffer (before the all-reduce)
    members: list[_Member] = field(default_factory=list)
    nbytes: int = 0
    closed_by: str = "end"

    @property
    def values(self) -> list[str]:
        """The serial gradients of the members."""
        return [str(m.reduce.attrs["value"]) for m in self.members]


def dp_fuse_allreduce(
    program: DistProgram, training: Graph, options: Mapping[str, Any]
) -> PassResult:
    """Fuse gradient all-reduces into buckets of at most `bucket_mb` MiB per rank.

    Buckets follow the order gradients are produced (backward order); a gradient joins the
    open bucket of its mesh axis, dtype and placements on the other axes unless that would
    pass the cap (a gradient larger than the cap gets a bucket of its own), and a bucket
    closes when any other op reads one of its gradients or reduced gradients, so its
    all-reduce can start once its last member is ready. Buckets of one keep their all-reduce.
    Local steps that reshard a gradient for its optimizer before its all-reduce (a slice on a
    tensor-parallel axis) first move to right after the op that makes the gradient.
    """
    mb = options.get("bucket_mb", DEFAULT_BUCKET_MB)
    if isinstance(mb, bool) or not isinstance(mb, int | float) or not mb > 0:
        raise PassOptionError(f"dp_fuse_allreduce: bucket_mb must be a positive number, got {mb!r}")
    cap = int(mb * MIB)
    local = {op.name for op in program.ops
             if op.is_comm and not op.is_collective and _moves_up(op, training)}  # fmt: skip
    if local:
        ordered = reorder(program.ops, local, set())
        program = _with(program, [local_on_compute(o) if o.name in local else o for o in ordered])
    buckets = _buckets(program, cap)
    n = sum(len(b.members) for b in buckets)
    fused = [b for b in buckets if len(b.members) > 1]
    position = {op.name: i for i, op in enumerate(program.ops)}
    before: dict[int, list[DistOp]] = {}
    removed: dict[str, tuple[str]] = {}
    types, specs = dict(program.types), dict(program.specs)
    details = []
    for k, bucket in enumerate(buckets):
        name = f"dp_bucket.{k}"
        details.append({"name": name, "axis": bucket.axis, "dtype": bucket.dtype,
                        "bytes": bucket.nbytes, "closed_by": bucket.closed_by,
                        "members": bucket.values})  # fmt: skip
        if len(bucket.members) == 1:
            continue
        pack, reduce, unpack = _fuse(program, bucket, name, types, specs)
        ready = bucket.members[-1].made_at + 1
        first_reduce = min(position[m.reduce.name] for m in bucket.members)
        before.setdefault(ready, []).append(pack)
        before.setdefault(max(ready, first_reduce), []).extend((reduce, unpack))
        removed.update({m.reduce.name: (unpack.name,) for m in bucket.members})
    ops: list[DistOp] = []
    for i, op in enumerate(program.ops):
        ops.extend(before.get(i, ()))
        if op.name not in removed:
            ops.append(_renamed(op, {}, removed))
    closed: dict[str, int] = {}
    for b in buckets:
        closed[b.closed_by] = closed.get(b.closed_by, 0) + 1
    summary = {
        "all_reduces_before": n,
        "all_reduces_after": len(buckets),
        "buckets": len(buckets),
        "fused_buckets": len(fused),
        "bucket_bytes": cap,
        "gradient_bytes": sum(b.nbytes for b in buckets),
        "closed_by": dict(sorted(closed.items())),
        "bucket_list": details,
        "message": f"{n} all-reduces fused into {len(buckets)} (buckets of up to {mb:g} MiB)",
    }
    return PassResult(_with(program, ops, types=types, specs=specs), summary)


def bucket_mb_candidates(programs: Sequence[DistProgram]) -> list[dict[str, Any]]:
    """The bucket caps the cost guard tries for `dp_fuse_allreduce`, smallest first: those of
    `BUCKET_MB_CANDIDATES` below the gradient bytes per rank (and always the default), then
    one bucket per group: a cap of all those bytes, which no bucket reaches."""
    total = max(
        (sum(_local_bytes(p, op.inputs[0]) for op in p.ops if is_grad_all_reduce(op))
         for p in programs),
        default=0,
    )  # fmt: skip
    whole = float(max(1, math.ceil(total / MIB)))
    sizes = [mb for mb in BUCKET_MB_CANDIDATES if mb < whole or mb == DEFAULT_BUCKET_MB]
    if whole > sizes[-1]:
        sizes.append(whole)
    return [{"bucket_mb": mb} for mb in sizes]


def _local_bytes(program: DistProgram, value: str) -> int:
    t, spec = program.types[value], program.specs[value]
    return math.prod(local_shape(t.shape, program.mesh, spec.placements)) * DTYPE_BYTES[t.dtype]


def _buffer_placements(spec: DistSpec, axis: int, src: Placement) -> tuple[Placement, ...]:
    """The packed buffer's placements for a member in `spec` (see the module docstring)."""
    return tuple(
        src if k == axis else Shard(0) if isinstance(p, Shard) else p
        for k, p in enumerate(spec.placements)
    )


def _buckets(program: DistProgram, cap: int) -> list[_Bucket]:
    """The buckets of the gradient all-reduces, ordered by when their last member is made.

    Only the first all-reduce of a chain counts (one whose input another gradient all-reduce
    made, e.g. a gradient partial on two axes, stays as it is and reads like any op).
    """
    made_by = {v: op for op in program.ops for v in op.outputs}
    heads = {
        op.inputs[0]: op
        for op in program.ops
        if is_grad_all_reduce(op)
        and not (op.inputs[0] in made_by and is_grad_all_reduce(made_by[op.inputs[0]]))
    }
    mesh = program.mesh
    open_: dict[tuple[Any, ...], _Bucket] = {}
    watched: dict[str, tuple[Any, ...]] = {}  # member gradients and reduced values -> bucket
    done: list[_Bucket] = []

    def close(key: tuple[Any, ...], why: str) -> None:
        bucket = open_.pop(key)
        bucket.closed_by = why
        for m in bucket.members:
            watched.pop(m.reduce.inputs[0], None)
            watched.pop(m.reduce.outputs[0], None)
        done.append(bucket)

    for i, op in enumerate(program.ops):
        own = op.inputs[0] if op.inputs and heads.get(op.inputs[0]) is op else None
        for v in op.inputs:
            if v != own and v in watched:
                close(watched[v], "reader")
        for v in op.outputs:
            reduce = heads.get(v)
            if reduce is None:
                continue
            assert reduce.comm is not None
            k = mesh.axis_index(reduce.comm.axis)
            placements = _buffer_placements(program.specs[v], k, reduce.comm.src)
            key = (reduce.comm.axis, program.types[v].dtype, placements)
            nbytes = _local_bytes(program, v)
            if key in open_ and open_[key].nbytes + nbytes > cap:
                close(key, "cap")
            bucket = open_.setdefault(key, _Bucket(key[0], key[1], placements))
            bucket.members.append(_Member(reduce, i, nbytes))
            bucket.nbytes += nbytes
            watched[v] = watched[reduce.outputs[0]] = key
    for key in list(open_):
        close(key, "end")
    return sorted(done, key=lambda b: b.members[-1].made_at)


def _fuse(
    program: DistProgram,
    bucket: _Bucket,
    name: str,
    types: dict[str, TensorType],
    specs: dict[str, DistSpec],
) -> tuple[DistOp, DistOp, DistOp]:
    """pack, all_reduce and unpack of one bucket; adds the buffers to `types` / `specs`."""
    mesh, axis = program.mesh, bucket.axis
    k = mesh.axis_index(axis)
    first = bucket.members[0].reduce
    assert first.comm is not None
    grads = tuple(m.reduce.inputs[0] for m in bucket.members)
    reduced = tuple(m.reduce.outputs[0] for m in bucket.members)
    src = DistSpec(mesh, bucket.placements)
    dst = DistSpec(
        mesh, tuple(first.comm.dst if j == k else p for j, p in enumerate(src.placements))
    )
    buf, out = name, f"{name}@{dst}"
    types[buf] = types[out] = TensorType(
        (sum(program.types[g].numel for g in grads),), bucket.dtype
    )
    specs[buf], specs[out] = src, dst
    n = mesh.shape[k]
    nbytes = 2 * (n - 1) / n * bucket.nbytes if n > 1 else 0.0
    what = f"{len(grads)} gradients, {bucket.nbytes:,} bytes per rank"
    a, b = first.comm.src, first.comm.dst
    why = f"all_reduce on mesh axis {axis!r}: {a} -> {b} (sum up the partial values of {what})"
    step = CommStep("all_reduce", axis, None, a, b, nbytes, why)
    scope = _common_scope([m.reduce.scope for m in bucket.members])
    made = tuple(sorted({d for m in bucket.members for d in m.reduce.deps}))
    pack = DistOp(f"pack:{name}", "pack", grads, (buf,), "compute", OpRole.BACKWARD, scope,
                  {"bucket": name}, reason=f"pack {what} for one fused all-reduce",
                  deps=made)  # fmt: skip
    attrs = {"value": buf, "from": str(src), "to": str(dst), "consumer": first.attrs["consumer"],
             "bucket": name, "members": bucket.values}  # fmt: skip
    reason = (
        f"{name}: {src} -> {dst}; {len(grads)} gradient all-reduces fused into one (seed 002); "
        f"{why}, {nbytes:,.0f} bytes per rank"
    )
    reduce = DistOp(f"all_reduce:{out}", "all_reduce", (buf,), (out,), f"comm:{axis}", OpRole.COMM,
                    scope, attrs, comm=step, reason=reason, deps=(pack.name,))  # fmt: skip
    shapes = [list(program.types[r].shape) for r in reduced]
    blocks = [list(local_shape(s, mesh, program.specs[r].placements))
              for s, r in zip(shapes, reduced, strict=True)]  # fmt: skip
    unpack = DistOp(f"unpack:{name}", "unpack", (out,), reduced, "compute", OpRole.BACKWARD,
                    scope, {"shapes": shapes, "block_shapes": blocks, "bucket": name},
                    reason=f"unpack the reduced {what}", deps=(reduce.name,))  # fmt: skip
    return pack, reduce, unpack


def _common_scope(scopes: Sequence[str]) -> str:
    """The longest dotted prefix every scope shares (`layers.0.attn.q`, `layers.0.mlp` ->
    `layers.0`)."""
    parts = [s.split(".") if s else [] for s in scopes]
    common: list[str] = []
    for level in zip(*parts, strict=False):
        if len(set(level)) != 1:
            break
        common.append(level[0])
    return ".".join(common)


# -- dp_overlap ---------------------------------------------------------------------------


def dp_overlap(program: DistProgram, training: Graph, options: Mapping[str, Any]) -> PassResult:
    """Issue every gradient all-reduce right after the last gradient it needs.

    Moves up, each to right after the last op it depends on: the comm steps that reshard a
    gradient for its optimizer (a local slice, the all-reduce) and the packs of fused buckets;
    they keep their `comm:<axis>` stream. Moves each unpack down to right before the first op
    that reads a reduced gradient. The compute stream synchronises only there: through a `wait`
    op right before that reader once the catalog has the kind (`has_wait_kind`), and always
    through `deps` (the unpack depends on the all-reduce, the optimizer ops on the unpack).
    Program order stays topological.
    """
    ops = program.ops
    made_by = {v: op for op in ops for v in op.outputs}
    up = {op.name for op in ops
          if _moves_up(op, training) and not waits_on_other_comm_stream(op, made_by)}  # fmt: skip
    down = {op.name for op in ops if op.kind == "unpack"}
    ordered = [local_on_compute(op) if op.name in up else op for op in reorder(ops, up, down)]
    grads = [op for op in ops if is_grad_all_reduce(op)]
    waits = has_wait_kind()
    new_ops = _with_waits(ordered, grads) if waits else ordered
    new_index = {op.name: j for j, op in enumerate(new_ops)}
    old_index = {op.name: i for i, op in enumerate(ops)}
    earlier = [old_index[op.name] - new_index[op.name] for op in grads]
    moved = sum(1 for e in earlier if e > 0)
    # every gradient comm step counts (reduce-scatters under ZeRO, slices), not only all-reduces
    steps = [op for op in ops if op.name in up and op.is_comm]
    steps_moved = sum(1 for op in steps if new_index[op.name] < old_index[op.name])
    during = [_during_backward(o, [op.name for op in grads]) for o in (ops, new_ops)]
    summary = {
        "all_reduces": len(grads),
        "moved": moved,
        "fused": sum(1 for op in grads if "bucket" in op.attrs),
        "ops_earlier_mean": sum(earlier) / len(earlier) if earlier else 0.0,
        "issued_during_backward_before": during[0],
        "issued_during_backward_after": during[1],
        "wait": "wait ops" if waits else "deps: unpack -> all_reduce, optimizer -> unpack",
        "comm_steps_moved": steps_moved,
        "message": f"{steps_moved} of {len(steps)} gradient comm ops moved up to right after "
        f"their last gradient ({moved} of {len(grads)} all-reduces); {during[1]} all-reduces "
        f"start before the backward ends (was {during[0]})",
    }
    return PassResult(_with(program, new_ops), summary)


def reorder(ops: Sequence[DistOp], up: set[str], down: set[str]) -> list[DistOp]:
    """`ops` with each op of `up` right after the last op it depends on (deps and the makers
    of its inputs) and each op of `down` right before the first op that depends on it (unless
    that one moves up); a stable sort on positions, so program order stays topological."""
    made_by = {v: op.name for op in ops for v in op.outputs}
    needs = [(*op.deps, *(made_by[v] for v in op.inputs if v in made_by)) for op in ops]
    first_user: dict[str, int] = {}
    for i, names in enumerate(needs):
        for d in names:
            first_user.setdefault(d, i)
    keys: dict[str, tuple[int, int, int]] = {}
    for i, op in enumerate(ops):
        user = first_user.get(op.name)
        if op.name in up:
            after = [keys[d] for d in needs[i]]
            keys[op.name] = (max(after)[0] if after else -1, 1, i)
        elif op.name in down and user is not None and ops[user].name not in up:
            keys[op.name] = (user, -1, i)
        else:
            keys[op.name] = (i, 0, 0)
    return sorted(ops, key=lambda op: keys[op.name])


def has_wait_kind() -> bool:
    """True once the catalog has the `wait` kind (`shardlab.ops.sync_ops`)."""
    try:
        get_op("wait")
    except GraphError:
        return False
    return True


def _with_waits(ops: Sequence[DistOp], grads: Sequence[DistOp]) -> list[DistOp]:
    """`ops` with a `wait` right before the first compute op that reads the output of each
    gradient all-reduce (inputs: the outputs waited on; deps: their all-reduces)."""
    pending = {op.outputs[0]: op.name for op in grads}
    out: list[DistOp] = []
    for op in ops:
        ready = [] if op.is_comm else list(dict.fromkeys(v for v in op.inputs if v in pending))
        if ready:
            deps = tuple(sorted({pending.pop(v) for v in ready}))
            why = f"{op.name!r} is the first op to read {', '.join(ready)}"
            wait = DistOp(f"wait:{op.name}", "wait", tuple(ready), (), "compute", op.role, op.scope)
            out.append(replace(wait, reason=why, deps=deps))
        out.append(op)
    return out


def _moves_up(op: DistOp, training: Graph) -> bool:
    """Packs of gradient buckets and the comm steps that reshard a gradient for its optimizer."""
    if op.kind == "pack":
        return "bucket" in op.attrs
    if op.comm is None or op.attrs.get("consumer") not in GRAD_CONSUMERS:
        return False
    if "bucket" in op.attrs:
        return True
    value = training.values.get(str(op.attrs.get("value")))
    return value is not None and value.kind == ValueKind.GRAD


def _during_backward(ops: Sequence[DistOp], names: Sequence[str]) -> int:
    """How many of the ops `names` come before the last backward compute op."""
    backward = (
        i
        for i, op in enumerate(ops)
        if op.role == OpRole.BACKWARD and not op.is_comm and op.kind not in ("pack", "unpack")
    )
    last = max(backward, default=-1)
    wanted = set(names)
    return sum(1 for i, op in enumerate(ops) if op.name in wanted and i < last)
