"""Local kernels: what one rank computes for an op, given its local blocks.

Rules (`shardlab.spmd`) name the kernel they need in `RuleResult.kernel`; this module
implements them.

Most rules promise that the op's own numpy kernel on the local blocks gives the local blocks
of the outputs (`default`). A few need to know where their block sits in the global tensor,
or to combine partial statistics with the other ranks mid-op:

- `replicated`: compute from whole inputs, then keep this rank's part of each output (the
  fallback, and ops without inputs such as `rope_cache`);
- `embedding_vocab_parallel`: look up only the ids inside this rank's rows of the table;
- `embedding_grad_vocab_parallel`: scatter-add only the ids inside this rank's rows;
- `cross_entropy_vocab_parallel`: all-reduce the max, the sum of exponentials and the
  target logit over the vocab-sharding axes (declared as `InnerComm`s): a whole loss;
- `cross_entropy_grad_sharded`: the softmax of a block of the vocab from the forward's
  log-sum-exp, the one-hot where the block holds the target, a mean over all tokens;
- `attention_query_offset`: causal attention whose query block starts at a global offset;
- `attention_head_offset` / `attention_grad_head_offset`: grouped-query attention whose
  query heads are sharded while the k/v heads are whole (there are fewer kv heads than
  ranks): each local query head reads its kv head by its global index; the grad's dk and dv
  are partial sums over the ranks that share a kv head;
- `masked_softmax_query_offset`: the same for eager attention's causal masked softmax;
- `dropout_global_index`: dropout of a block, its mask built from the block's global indices;
- `reshape_local`: reshape to this rank's local output shape (attr `shape` is global);
- `shape_attr_local`: run the op with its `shape` attr replaced by the local output shape
  (broadcast_to);
- `global_mean` (and `<kernel>+global_mean`): a mean whose reduced dims are sharded into
  uneven blocks: the local mean (output 0; the cross entropy's log-sum-exp per label is
  left as it is) times the rank's share of the reduced elements, a partial sum of the
  global mean (equal blocks keep `Partial(avg)` and the plain kernel).

Uneven shards (a dim that does not divide its mesh axes) give ranks blocks of different
sizes: every local shape here is the rank's own (`placement.local_shape_on`), every offset
its own range (`index_ranges`); `unpack` cuts its buffer into this rank's member blocks.

A kernel returns its outputs, or is a generator that yields `CollectiveRequest`s and receives
each reduced array back (the runtime fulfils them: in lockstep on the simulated mesh, with
torch.distributed on real ranks).
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Callable, Generator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass

import numpy as np

from shardlab.ir import TensorType
from shardlab.mesh import Mesh
from shardlab.ops import get_op
from shardlab.ops.attention import attention
from shardlab.ops.autodiff_ops import attention_backward
from shardlab.ops.base import Array, Attrs
from shardlab.ops.dropout import block_index, dropout_block
from shardlab.ops.reduce import reduce_dims
from shardlab.ops.softmax import masked_softmax
from shardlab.placement import (
    DistSpec,
    Replicate,
    Shard,
    check_no_empty_blocks,
    index_ranges,
    local_shape_on,
)
from shardlab.runtime.distribute import to_local


@dataclass(frozen=True, slots=True)
class LocalContext:
    """Where this rank's blocks sit: mesh, rank, and the global types and specs."""

    mesh: Mesh
    rank: int
    input_types: tuple[TensorType, ...]
    output_types: tuple[TensorType, ...]
    input_specs: tuple[DistSpec, ...]
    output_specs: tuple[DistSpec, ...]

    def input_range(self, i: int) -> tuple[tuple[int, int], ...]:
        spec = self.input_specs[i]
        return index_ranges(self.input_types[i].shape, self.mesh, spec.placements, self.rank)

    def output_range(self, j: int) -> tuple[tuple[int, int], ...]:
        spec = self.output_specs[j]
        return index_ranges(self.output_types[j].shape, self.mesh, spec.placements, self.rank)

    def output_shape(self, j: int) -> tuple[int, ...]:
        """The shape of this rank's block of output j."""
        spec = self.output_specs[j]
        return local_shape_on(self.output_types[j].shape, self.mesh, spec.placements, self.rank)

    def axes_sharding(self, i: int, dim: int) -> tuple[str, ...]:
        """Mesh axes that shard dim `dim` of input `i`."""
        spec = self.input_specs[i]
        return tuple(
            spec.mesh.axis_names[k]
            for k, p in enumerate(spec.placements)
            if isinstance(p, Shard) and p.dim == dim
        )


@dataclass(frozen=True, slots=True)
class CollectiveRequest:
    """A collective a kernel needs mid-op: reduce `data` over the ranks along `axes`."""

    op: str  # sum | max
    axes: tuple[str, ...]
    data: Array


KernelResult = list[Array] | Generator[CollectiveRequest, Array, list[Array]]
Kernel = Callable[[str, Sequence[Array], Attrs, LocalContext], KernelResult]


#: Reductions without an identity: a rank cannot reduce an empty block of their dims.
NO_IDENTITY = frozenset({"max"})


def check_reducible(kind: str, attrs: Attrs, ctx: LocalContext) -> None:
    """Raise PlacementError (value, dim, size, mesh axes) when this rank would reduce an
    empty block of a reduction without identity (a max over a dim split into DTensor's
    blocks with an empty tail). The rules never choose that split (`einsum`); this names
    the layout instead of failing inside numpy or torch if some other path asks for it."""
    if kind not in NO_IDENTITY or not ctx.input_types:
        return
    t, spec = ctx.input_types[0], ctx.input_specs[0]
    dims = reduce_dims(len(t.shape), attrs, kind)
    ranges = ctx.input_range(0)
    if not any(ranges[d][0] == ranges[d][1] for d in dims):
        return
    kept = tuple(
        p if isinstance(p, Shard) and p.dim in dims else Replicate() for p in spec.placements
    )
    why = f"a {kind} over dims {list(dims)} has no value on an empty block"
    check_no_empty_blocks(t.shape, ctx.mesh, kept, f"input 0 of {kind}", why)


def default_kernel(kind: str, xs: Sequence[Array], attrs: Attrs, ctx: LocalContext) -> KernelResult:
    check_reducible(kind, attrs, ctx)
    impl = get_op(kind).numpy_impl
    assert impl is not None, kind
    if kind == "unpack" and "block_shapes" in attrs:  # this rank's blocks (uneven shards)
        blocks = [list(ctx.output_shape(j)) for j in range(len(ctx.output_types))]
        attrs = {**attrs, "block_shapes": blocks}
    return impl(xs, attrs)


def replicated_kernel(
    kind: str, xs: Sequence[Array], attrs: Attrs, ctx: LocalContext
) -> KernelResult:
    """Whole inputs in, this rank's part of each output out."""
    impl = get_op(kind).numpy_impl
    assert impl is not None, kind
    full = impl(xs, attrs)
    return [
        to_local(np.asarray(y), spec, ctx.rank)
        for y, spec in zip(full, ctx.output_specs, strict=True)
    ]


def embedding_vocab_parallel(
    kind: str, xs: Sequence[Array], attrs: Attrs, ctx: LocalContext
) -> KernelResult:
    """Rows of the table outside this rank's block contribute zeros (a partial sum)."""
    ids, table = xs
    if not table.shape[0]:  # an empty block of rows (DTensor's layout): no id is inside it
        return [np.zeros((*ids.shape, table.shape[1]), dtype=table.dtype)]
    start, stop = ctx.input_range(1)[0]
    inside = (ids >= start) & (ids < stop)
    rows = table[np.where(inside, ids - start, 0)]
    return [np.where(inside[..., None], rows, 0.0)]


def embedding_grad_vocab_parallel(
    kind: str, xs: Sequence[Array], attrs: Attrs, ctx: LocalContext
) -> KernelResult:
    """Scatter-add only the rows of dy whose ids fall inside this rank's rows of the table."""
    ids, dy = xs
    start, stop = ctx.output_range(0)[0]
    out = np.zeros((stop - start, dy.shape[-1]), dtype=dy.dtype)
    flat, rows = ids.reshape(-1), dy.reshape(ids.size, dy.shape[-1])  # dy may be empty
    inside = (flat >= start) & (flat < stop)
    np.add.at(out, flat[inside] - start, rows[inside])
    return [out]


def cross_entropy_vocab_parallel(
    kind: str, xs: Sequence[Array], attrs: Attrs, ctx: LocalContext
) -> Generator[CollectiveRequest, Array, list[Array]]:
    """The vocab-parallel cross entropy of torch's loss_parallel() and Megatron-LM: the max
    logit, the sum of exponentials and the target logit per label all-reduced over the
    vocab axes (`cost.kernel_comm.MIDOP_REDUCTIONS`), so the loss (and, attr `lse`, the
    log-sum-exp per label the backward reads) is whole on every rank of the group."""
    logits, labels = xs
    axes = ctx.axes_sharding(0, logits.ndim - 1)
    start, stop = ctx.input_range(0)[-1]
    peak = yield CollectiveRequest("max", axes, _row_max(logits))
    sum_exp = yield CollectiveRequest("sum", axes, np.sum(np.exp(logits - peak[..., None]), -1))
    lse = peak + np.log(sum_exp)
    inside = (labels >= start) & (labels < stop)
    local = np.where(inside, labels - start, 0)
    picked = yield CollectiveRequest("sum", axes, np.where(inside, _pick(logits, local), 0.0))
    return _loss_outputs(lse, lse - picked, attrs)


def _loss_outputs(lse: Array, terms: Array, attrs: Attrs) -> list[Array]:
    """The reduced loss of the per-label `terms`, and `lse` where attr `lse` asks for it."""
    total = np.sum(terms) if attrs.get("reduction", "mean") == "sum" else np.mean(terms)
    return [np.asarray(total), lse] if attrs.get("lse", False) else [np.asarray(total)]


def _row_max(logits: Array) -> Array:
    """The max over the last dim; -inf for an empty block of the vocab (the all-reduced max
    comes from the ranks that hold some)."""
    if logits.shape[-1]:
        return np.asarray(np.max(logits, axis=-1))
    return np.full(logits.shape[:-1], -np.inf, dtype=logits.dtype)


def _pick(logits: Array, local: Array) -> Array:
    """`logits[..., local]` per row; zeros for an empty block of the vocab (no label is
    inside it, and the callers mask what is outside)."""
    if logits.shape[-1]:
        return np.asarray(np.take_along_axis(logits, local[..., None], axis=-1)[..., 0])
    return np.zeros(local.shape, dtype=logits.dtype)


def attention_query_offset(
    kind: str, xs: Sequence[Array], attrs: Attrs, ctx: LocalContext
) -> KernelResult:
    """Causal attention for a block of queries that starts at a global offset."""
    offset = ctx.input_range(0)[1][0]
    scale = attrs.get("scale")
    q, k, v = xs
    causal = bool(attrs.get("causal", True))
    return [attention(q, k, v, causal, None if scale is None else float(scale), offset)]


def masked_softmax_query_offset(
    kind: str, xs: Sequence[Array], attrs: Attrs, ctx: LocalContext
) -> KernelResult:
    """Causal masked softmax of a block of query rows that starts at a global offset."""
    offset = ctx.input_range(0)[-2][0]
    causal = bool(attrs.get("causal", False))
    return [masked_softmax(xs[0], float(attrs.get("scale", 1.0)), causal, offset)]


def dropout_global_index(
    kind: str, xs: Sequence[Array], attrs: Attrs, ctx: LocalContext
) -> KernelResult:
    """(y, mask) of this rank's block: the mask of the block's global element indices."""
    index = block_index(ctx.output_types[0].shape, ctx.output_range(0))
    return dropout_block(xs[0], attrs, index)


def _kv_heads_of_local_queries(ctx: LocalContext, local_heads: int) -> Array:
    """For each local query head, the global index of the kv head it reads."""
    group = ctx.input_types[0].shape[2] // ctx.input_types[1].shape[2]
    first = ctx.input_range(0)[2][0]
    return np.asarray((first + np.arange(local_heads)) // group)


def attention_head_offset(
    kind: str, xs: Sequence[Array], attrs: Attrs, ctx: LocalContext
) -> KernelResult:
    """Attention over a block of query heads (and maybe of queries) with whole k/v heads."""
    q, k, v = xs
    heads = _kv_heads_of_local_queries(ctx, q.shape[2])
    causal = bool(attrs.get("causal", True))
    offset = ctx.input_range(0)[1][0] if causal else 0
    scale = attrs.get("scale")
    out = attention(
        q, k[:, :, heads], v[:, :, heads], causal, None if scale is None else float(scale), offset
    )
    return [out]


def attention_grad_head_offset(
    kind: str, xs: Sequence[Array], attrs: Attrs, ctx: LocalContext
) -> KernelResult:
    """dq of this rank's query heads, and its partial dk, dv over the whole kv heads."""
    q, k, v, dy = xs
    heads = _kv_heads_of_local_queries(ctx, q.shape[2])
    dq, dk_local, dv_local = attention_backward(
        q, k[:, :, heads], v[:, :, heads], dy, bool(attrs.get("causal", True)), attrs.get("scale")
    )
    dk, dv = np.zeros_like(k), np.zeros_like(v)
    for j, head in enumerate(heads):
        dk[:, :, head] += dk_local[:, :, j]
        dv[:, :, head] += dv_local[:, :, j]
    return [dq, dk, dv]


def reshape_local(kind: str, xs: Sequence[Array], attrs: Attrs, ctx: LocalContext) -> KernelResult:
    """The block keeps its elements in order; only the target shape is the local one."""
    return [np.reshape(xs[0], ctx.output_shape(0))]


def shape_attr_local(
    kind: str, xs: Sequence[Array], attrs: Attrs, ctx: LocalContext
) -> KernelResult:
    """The op's `shape` attr names the global output; each rank produces its block's shape."""
    impl = get_op(kind).numpy_impl
    assert impl is not None, kind
    return impl(xs, {**attrs, "shape": list(ctx.output_shape(0))})


def cross_entropy_grad_sharded(
    kind: str, xs: Sequence[Array], attrs: Attrs, ctx: LocalContext
) -> KernelResult:
    """dlogits of a block of tokens and (vocab parallel) a block of the vocab.

    A mean-reduced loss divides by the global token count, not the local one. The softmax
    of the block is exp(logits - lse) with the log-sum-exp per label that the forward kept
    (whole over the vocab), so no all-reduce is needed; each rank subtracts the one-hot
    only where it holds the target.
    """
    logits, labels, dloss, lse = xs
    start, stop = ctx.input_range(0)[-1]
    grad = np.exp(logits - lse[..., None])
    inside = (labels >= start) & (labels < stop)
    local = np.where(inside, labels - start, 0).astype(np.int64)[..., None]
    if grad.shape[-1]:  # an empty block of the vocab holds no target
        hit = np.take_along_axis(grad, local, axis=-1) - inside[..., None]
        np.put_along_axis(grad, local, hit, axis=-1)
    n = math.prod(ctx.input_types[1].shape) if attrs.get("reduction", "mean") == "mean" else 1
    return [grad * (dloss / n)]


def _mean_share(kind: str, attrs: Attrs, ctx: LocalContext) -> float:
    """This rank's share of the elements a mean averages over: local over global count of
    the reduced dims (every dim of the labels for a loss, `dim` for a reduction)."""
    dims: Sequence[int]
    if kind in ("cross_entropy", "mse_loss"):
        ranges = ctx.input_range(1 if kind == "cross_entropy" else 0)
        dims = range(len(ranges))
    else:
        ranges = ctx.input_range(0)
        dims = reduce_dims(len(ranges), attrs, kind)
    shape = ctx.input_types[1 if kind == "cross_entropy" else 0].shape
    local = math.prod(ranges[d][1] - ranges[d][0] for d in dims)
    return local / math.prod(shape[d] for d in dims)


def global_mean(inner: Kernel) -> Kernel:
    """`inner`'s local mean scaled to a partial sum of the global mean (uneven blocks). A
    rank whose block of the reduced elements is empty (share 0) contributes zeros: its
    local mean of nothing is NaN (still computed, quietly, so that a generator kernel makes
    the same mid-op requests as its peers)."""

    def kernel(
        kind: str, xs: Sequence[Array], attrs: Attrs, ctx: LocalContext
    ) -> Generator[CollectiveRequest, Array, list[Array]]:
        share = _mean_share(kind, attrs, ctx)
        with _quiet(not share):
            out = inner(kind, xs, attrs, ctx)
        if not isinstance(out, list):
            out = yield from _quietly(out, not share)
        return [_scaled(out[0], share), *out[1:]]

    return kernel


def _scaled(y: Array, share: float) -> Array:
    """A local mean `y` times this rank's share; zeros for an empty block (share 0)."""
    return np.asarray(y * share) if share else np.zeros_like(y)


def _quiet(empty: bool) -> AbstractContextManager[object]:
    """Numpy's RuntimeWarnings (the mean of an empty block) silenced where `empty`."""
    if empty:
        return warnings.catch_warnings(action="ignore", category=RuntimeWarning)
    return contextlib.nullcontext()


def _quietly(
    gen: Generator[CollectiveRequest, Array, list[Array]], empty: bool
) -> Generator[CollectiveRequest, Array, list[Array]]:
    """`gen`, each step run under `_quiet(empty)` and every request yielded outside it (the
    simulated mesh interleaves the ranks' generators: a warnings context held across a
    yield would be restored out of order)."""
    reply: Array | None = None
    while True:
        with _quiet(empty):
            try:
                request = next(gen) if reply is None else gen.send(reply)
            except StopIteration as stop:
                return list(stop.value)
        reply = yield request


KERNELS: dict[str, Kernel] = {
    "default": default_kernel,
    "replicated": replicated_kernel,
    "embedding_vocab_parallel": embedding_vocab_parallel,
    "embedding_grad_vocab_parallel": embedding_grad_vocab_parallel,
    "cross_entropy_vocab_parallel": cross_entropy_vocab_parallel,
    "attention_query_offset": attention_query_offset,
    "attention_head_offset": attention_head_offset,
    "attention_grad_head_offset": attention_grad_head_offset,
    "masked_softmax_query_offset": masked_softmax_query_offset,
    "dropout_global_index": dropout_global_index,
    "reshape_local": reshape_local,
    "shape_attr_local": shape_attr_local,
    "cross_entropy_grad_sharded": cross_entropy_grad_sharded,
}
KERNELS["global_mean"] = global_mean(default_kernel)
KERNELS["cross_entropy_vocab_parallel+global_mean"] = global_mean(cross_entropy_vocab_parallel)
