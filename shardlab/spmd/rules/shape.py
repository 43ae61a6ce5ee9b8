"""Rules for shape ops: `reshape` (a dedicated rule) and the einsum-style data movers.

transpose / permute permute the letters; split and slice keep the cut dim whole (`split`
has one output per piece); concat keeps the joined dim whole and is affine (all inputs
partial together). These ops only move data, so every partial op passes through.

reshape follows PyTorch's `view_groups`: input dims and output dims are cut into groups
whose sizes multiply to the same number (a merge `[H, D] -> [H*D]`, a split `[H*D] -> [H, D]`,
or both). A sharding of the first (outermost) input dim of a group carries to the first
output dim of that group when the total shard count divides that output dim: both hold the
same contiguous run of the group's elements. A sharding of an inner dim of a merge is moved
to the group's outer dim first (one all_to_all of the block, where a gather would move n
blocks; PyTorch keeps such a layout as a `_StridedShard`, which we do not have). A sharding
that cannot carry is dropped (the input is required replicated on that mesh axis).
Uneven blocks (a dim the shards do not divide) carry only through a kept dim (the same size
in and out): splitting a hidden dim into heads the shards do not divide would cut a head
apart on some rank, so that sharding is dropped.
The local kernel reshapes each block to its local output shape (`reshape_local`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from shardlab.ops import attach
from shardlab.ops.base import attr_int, attr_ints, normalize_dim
from shardlab.placement import DistSpec, Partial, Placement, Replicate, Shard
from shardlab.spmd.cost import reshard_cost
from shardlab.spmd.einsum import Signature, solve
from shardlab.spmd.result import AxisChoice, RuleContext, RuleResult

LETTERS = "abcdefgh"
#: Data movement commutes with every elementwise reduction of partial values.
ALL_PARTIALS = frozenset({"sum", "avg", "max", "min"})
Group = tuple[tuple[int, ...], tuple[int, ...]]


def view_groups(src: Sequence[int], dst: Sequence[int]) -> list[Group]:
    """(input dims, output dims) groups of equal element count, left to right.

    A size-1 dim facing a larger one forms a group alone (`((i,), ())` or `((), (o,))`), as in
    PyTorch's `view_groups`; otherwise the side with the smaller product grows until they agree.
    """
    assert math.prod(src) == math.prod(dst), (src, dst)
    groups: list[Group] = []
    i = o = 0
    while i < len(src) or o < len(dst):
        ins = [i] if i < len(src) else []
        outs = [o] if o < len(dst) else []
        f = src[i] if ins else 1
        t = dst[o] if outs else 1
        i, o = i + len(ins), o + len(outs)
        if f == 1 and t != 1:
            o, outs = o - len(outs), []
        elif f != 1 and t == 1:
            i, ins = i - len(ins), []
        else:
            while f != t:
                if f < t:
                    f, i = f * src[i], i + 1
                    ins.append(i - 1)
                else:
                    t, o = t * dst[o], o + 1
                    outs.append(o - 1)
        groups.append((tuple(ins), tuple(outs)))
    return groups


def _group_text(group: Group, src: Sequence[int], dst: Sequence[int]) -> str:
    ins, outs = group
    how = "kept" if len(ins) == len(outs) == 1 else "split" if len(ins) == 1 else "merged"
    if len(ins) > 1 and len(outs) > 1:
        how = "regrouped"
    sizes_in = [src[d] for d in ins]
    sizes_out = [dst[d] for d in outs]
    return f"{how}: dims {list(ins)} {sizes_in} -> dims {list(outs)} {sizes_out}"


def _from_hint(ctx: RuleContext, groups: list[Group]) -> tuple[Placement, ...]:
    """Input placements that produce the output hint where that is a simple carry."""
    x = ctx.input_types[0]
    first_in = {outs[0]: ins[0] for ins, outs in groups if ins and outs}
    parts: dict[int, int] = {}
    out: list[Placement] = []
    for k in range(ctx.mesh.ndim):
        p = ctx.hint_at(0, k)
        d = first_in.get(p.dim) if isinstance(p, Shard) else None
        if d is not None and x.shape[d] % (parts.get(d, 1) * ctx.mesh.shape[k]) == 0:
            parts[d] = parts.get(d, 1) * ctx.mesh.shape[k]
            out.append(Shard(d))
        else:
            out.append(p if isinstance(p, Partial) else Replicate())
    return tuple(out)


def reshape_rule(ctx: RuleContext) -> RuleResult:
    """Carry the sharding of each group's outermost input dim; move an inner dim's sharding
    to its group's outer dim where that costs less than dropping it; drop the others."""
    moved = _reshape(ctx, move=True)
    if moved.input_specs == (dropped := _reshape(ctx, move=False)).input_specs:
        return moved
    return moved if moved.cost < dropped.cost else dropped


def _reshape(ctx: RuleContext, move: bool) -> RuleResult:
    """The reshape's specs, moving inner-dim shardings (`move`) or dropping them; its cost is
    the input's reshard (`reshard_cost`, free where that copy exists already)."""
    mesh, x, y = ctx.mesh, ctx.input_types[0], ctx.output_types[0]
    groups = view_groups(x.shape, y.shape)
    spec = ctx.input_specs[0]
    base = spec.placements if spec is not None else _from_hint(ctx, groups)
    # an input hint (the layout the forward op read a saved tensor in) decides where given
    arriving = tuple(
        h if (h := ctx.input_hint_at(0, k)) is not None else p for k, p in enumerate(base)
    )
    driver = 0 if spec is not None else None
    parts: dict[int, int] = {}  # output dim -> shards so far
    need: list[Placement] = []
    made: list[Placement] = []
    notes: list[str] = []
    for k, (axis, p) in enumerate(zip(mesh.axis_names, arriving, strict=True)):
        n = mesh.shape[k]
        if isinstance(p, Partial):
            need.append(p)
            made.append(p)
            notes.append(f"{axis}: stays {p} (reshape only moves data)")
            continue
        if isinstance(p, Replicate):
            need.append(p)
            made.append(p)
            notes.append(f"{axis}: replicated (the input is not sharded on it)")
            continue
        group = next(g for g in groups if p.dim in g[0])
        what = _group_text(group, x.shape, y.shape)
        o = group[1][0] if group[1] else None
        outer = group[0][0]
        shards = parts.get(o, 1) * n if o is not None else n
        if o is not None and not _same_cut(x.shape[outer], y.shape[o], shards):
            why = (
                f"output dim {o} (size {y.shape[o]}) does not divide into {shards} shards "
                f"cut where input dim {outer} (size {x.shape[outer]}) is cut"
            )
        elif o is None:
            why = f"input dim {p.dim} has no output dim to carry to ({what})"
        elif outer == p.dim:
            parts[o] = parts.get(o, 1) * n
            need.append(p)
            made.append(Shard(o))
            notes.append(f"{axis}: input dim {p.dim} sharded carries to output dim {o} ({what})")
            continue
        elif move and _fits_shard([*need, *arriving[k:]], x.shape, mesh.shape, k, outer):
            parts[o] = parts.get(o, 1) * n
            need.append(Shard(outer))
            made.append(Shard(o))
            notes.append(
                f"{axis}: input dim {p.dim} is an inner dim of its group ({what}); moved to "
                f"dim {outer} (an all_to_all of the block, where a gather moves n blocks), "
                f"which carries to output dim {o}"
            )
            continue
        else:
            why = f"input dim {p.dim} is not the outermost dim of its group ({what})"
        need.append(Replicate())
        made.append(Replicate())
        notes.append(f"{axis}: replicated, sharding dropped: {why} (a reshard)")
    placements = tuple(need)
    cost = 0.0
    if spec is not None and not ctx.available(0, placements):
        cost = reshard_cost(x, mesh, spec.placements, placements)
    choices = tuple(
        AxisChoice(axis, str(p), driver, cost)
        for axis, p in zip(mesh.axis_names, made, strict=True)
    )
    sharded = any(isinstance(p, Shard) for p in made)
    return RuleResult(
        input_specs=(DistSpec(mesh, placements),),
        output_specs=(DistSpec(mesh, tuple(made)),),
        reason=f"reshape {list(x.shape)} -> {list(y.shape)}: " + "; ".join(notes),
        kernel="reshape_local" if sharded else "default",
        choices=choices,
        cost=cost,
    )


def _same_cut(size_in: int, size_out: int, shards: int) -> bool:
    """True when cutting a group's outer input dim (`size_in`) and its first output dim
    (`size_out`) into `shards` blocks gives every rank the same run of the group's elements:
    both divide evenly, or (uneven blocks, DTensor's layout) the two dims are the same dim,
    kept, and no smaller than the shards (as `einsum._divides`)."""
    if size_in % shards == 0 and size_out % shards == 0:
        return True
    return size_in == size_out and size_out >= shards


def _fits_shard(
    placements: Sequence[Placement],
    shape: Sequence[int],
    mesh_shape: Sequence[int],
    k: int,
    dim: int,
) -> bool:
    """True when input dim `dim` divides into its shards with mesh axis k added to them."""
    shards = mesh_shape[k]
    for a, p in enumerate(placements):
        if a != k and isinstance(p, Shard) and p.dim == dim:
            shards *= mesh_shape[a]
    return shape[dim] % shards == 0


def _letters(ctx: RuleContext) -> str:
    return LETTERS[: ctx.input_types[0].rank]


def _dim(ctx: RuleContext, key: str = "dim") -> int:
    rank = ctx.input_types[0].rank
    return normalize_dim(attr_int(ctx.attrs, key), rank, f"{ctx.kind}: attribute {key!r}")


def _moves(ctx: RuleContext, out: str, whole: str = "", affine: bool = False) -> RuleResult:
    """Solve a data-moving op: each input is `_letters`, each output `out`."""
    n_in, n_out = len(ctx.input_types), len(ctx.output_types)
    sig = Signature(
        inputs=(_letters(ctx),) * n_in,
        outputs=(out,) * n_out,
        whole=frozenset(whole),
        linearity="affine" if affine else "multilinear",
        passthrough=ALL_PARTIALS,
    )
    return solve(ctx, sig)


def transpose_rule(ctx: RuleContext) -> RuleResult:
    letters = list(_letters(ctx))
    d0, d1 = _dim(ctx, "dim0"), _dim(ctx, "dim1")
    letters[d0], letters[d1] = letters[d1], letters[d0]
    return _moves(ctx, "".join(letters))


def permute_rule(ctx: RuleContext) -> RuleResult:
    letters = _letters(ctx)
    return _moves(ctx, "".join(letters[p] for p in attr_ints(ctx.attrs, "perm")))


def cut_rule(ctx: RuleContext) -> RuleResult:
    """split / slice / concat: the cut or joined dim stays whole, the others follow."""
    letters = _letters(ctx)
    return _moves(ctx, letters, whole=letters[_dim(ctx)], affine=ctx.kind == "concat")


attach("reshape", spmd_rule=reshape_rule)
attach("transpose", spmd_rule=transpose_rule)
attach("permute", spmd_rule=permute_rule)
for _kind in ("split", "slice", "concat"):
    attach(_kind, spmd_rule=cut_rule)
