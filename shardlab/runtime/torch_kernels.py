"""Torch versions of the rank-aware local kernels, for the torch backend's local compute.

What it is for: `runtime.torch_rank` runs an op whose rule names a kernel of
`runtime.kernels` (`KERNELS`) with its torch version here, on the rank's tensors on its
device, instead of the numpy kernel on host copies (on a GPU, a device-host-device round
trip per op). Each kernel has exactly the semantics of its numpy counterpart: the same
formulas in the same order, the same use of the `LocalContext`; a generator kernel yields
`CollectiveRequest`s whose `data` is a tensor and receives the reduced tensor back (the
rank reduces it on its device, `RankRun.reduce_request`).
`tests/shardlab/runtime/test_torch_kernels.py` checks each against the numpy kernel.

`TORCH_KERNELS` is keyed like `KERNELS`; `torch_kernel` says whether one applies to an op:
`default`, `global_mean` and `replicated` run the kind's own torch op
(`runtime.torch_ops.TORCH_IMPLS`), so only for kinds that have one, and `replicated` only
when no output is `Partial` (those keep the numpy kernel). `reshape_local` and
`shape_attr_local` run as the torch op of their local form (`RankRun.torch_form`).
`widen` gives the kernels their inputs as the numpy kernels see them on the host: floats
in one dtype, 16-bit floats in float32.

Torch stays lazy, as everywhere in the engine: importing this module does not import it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias, cast

from shardlab.ops.base import Array, Attrs
from shardlab.placement import Partial, local_slices
from shardlab.runtime import torch_attention, torch_dropout, torch_ops
from shardlab.runtime.kernels import (
    CollectiveRequest,
    LocalContext,
    _mean_share,
    check_reducible,
)

if TYPE_CHECKING:
    from torch import Tensor

TorchResult: TypeAlias = "list[Tensor] | Generator[CollectiveRequest, Tensor, list[Tensor]]"
TorchKernel: TypeAlias = "Callable[[str, Sequence[Tensor], Attrs, LocalContext], TorchResult]"
TorchGen: TypeAlias = "Generator[CollectiveRequest, Tensor, list[Tensor]]"


def _request(op: str, axes: tuple[str, ...], data: Tensor) -> CollectiveRequest:
    """A mid-op collective whose data is a tensor (reduced on the rank's device)."""
    return CollectiveRequest(op, axes, cast(Array, data))


def widen(xs: Sequence[Tensor]) -> list[Tensor]:
    """Float tensors in their common dtype, 16-bit floats in float32 (the numpy kernels
    compute on host copies: numpy promotes mixed floats, a bfloat16 block arrives as
    float32)."""
    import torch

    floats = [x.dtype for x in xs if x.is_floating_point()]
    if not floats:
        return list(xs)
    common = floats[0]
    for dtype in floats[1:]:
        common = torch.promote_types(common, dtype)
    if common in (torch.bfloat16, torch.float16):
        common = torch.float32
    return [x.to(common) if x.is_floating_point() else x for x in xs]


def local_attrs(kind: str, attrs: Attrs, ctx: LocalContext) -> Attrs:
    """The attrs of the kind's own op on this rank's blocks: `unpack`'s `block_shapes` are
    this rank's output shapes (uneven shards), as `kernels.default_kernel` makes them."""
    if kind == "unpack" and "block_shapes" in attrs:
        blocks = [list(ctx.output_shape(j)) for j in range(len(ctx.output_types))]
        return {**attrs, "block_shapes": blocks}
    return attrs


def default_kernel(kind: str, xs: Sequence[Tensor], attrs: Attrs, ctx: LocalContext) -> TorchResult:
    check_reducible(kind, attrs, ctx)
    return torch_ops.run_tensors(kind, xs, local_attrs(kind, attrs, ctx))


def replicated_kernel(
    kind: str, xs: Sequence[Tensor], attrs: Attrs, ctx: LocalContext
) -> TorchResult:
    """Whole inputs in, this rank's part of each output out (`distribute.to_local`'s slices;
    no output is Partial, see `torch_kernel`)."""
    full = torch_ops.run_tensors(kind, xs, attrs)
    return [
        y[local_slices(tuple(y.shape), spec.mesh, spec.placements, ctx.rank)].clone()
        for y, spec in zip(full, ctx.output_specs, strict=True)
    ]


def embedding_vocab_parallel(
    kind: str, xs: Sequence[Tensor], attrs: Attrs, ctx: LocalContext
) -> TorchResult:
    """Rows of the table outside this rank's block contribute zeros (a partial sum)."""
    import torch

    ids, table = xs
    if not table.shape[0]:  # an empty block of rows (DTensor's layout): no id is inside it
        return [table.new_zeros((*ids.shape, table.shape[1]))]
    start, stop = ctx.input_range(1)[0]
    inside = (ids >= start) & (ids < stop)
    rows = table[torch.where(inside, ids - start, 0).long()]
    return [torch.where(inside[..., None], rows, rows.new_zeros(()))]


def embedding_grad_vocab_parallel(
    kind: str, xs: Sequence[Tensor], attrs: Attrs, ctx: LocalContext
) -> TorchResult:
    """Scatter-add only the rows of dy whose ids fall inside this rank's rows of the table."""
    ids, dy = xs
    start, stop = ctx.output_range(0)[0]
    out = dy.new_zeros((stop - start, dy.shape[-1]))
    flat, rows = ids.reshape(-1), dy.reshape(ids.numel(), dy.shape[-1])  # dy may be empty
    inside = (flat >= start) & (flat < stop)
    return [out.index_add_(0, (flat[inside] - start).long(), rows[inside])]


def cross_entropy_vocab_parallel(
    kind: str, xs: Sequence[Tensor], attrs: Attrs, ctx: LocalContext
) -> TorchGen:
    """The vocab-parallel cross entropy: the max logit, the sum of exponentials and the
    target logit per label all-reduced over the vocab axes; a whole loss (and, attr `lse`,
    the log-sum-exp per label), as `kernels.cross_entropy_vocab_parallel`."""
    import torch

    logits, labels = xs
    axes = ctx.axes_sharding(0, logits.dim() - 1)
    start, stop = ctx.input_range(0)[-1]
    peak = yield _request("max", axes, _row_max(logits))
    sum_exp = yield _request("sum", axes, torch.sum(torch.exp(logits - peak[..., None]), -1))
    lse = peak + torch.log(sum_exp)
    inside = (labels >= start) & (labels < stop)
    local = torch.where(inside, labels - start, 0).long()
    mine = _pick(logits, local)
    picked = yield _request("sum", axes, torch.where(inside, mine, mine.new_zeros(())))
    terms = lse - picked
    total = torch.sum(terms) if attrs.get("reduction", "mean") == "sum" else torch.mean(terms)
    return [total, lse] if attrs.get("lse", False) else [total]


def _row_max(logits: Tensor) -> Tensor:
    """The max over the last dim; -inf for an empty block of the vocab (`kernels._row_max`)."""
    import torch

    if logits.shape[-1]:
        return torch.amax(logits, dim=-1)
    return logits.new_full(logits.shape[:-1], -math.inf)


def _pick(logits: Tensor, local: Tensor) -> Tensor:
    """`logits[..., local]` per row; zeros for an empty block of the vocab."""
    import torch

    if logits.shape[-1]:
        return torch.gather(logits, -1, local[..., None])[..., 0]
    return logits.new_zeros(local.shape)


def cross_entropy_grad_sharded(
    kind: str, xs: Sequence[Tensor], attrs: Attrs, ctx: LocalContext
) -> TorchResult:
    """dlogits of a block of tokens and (vocab parallel) a block of the vocab: the softmax
    from the forward's log-sum-exp per label (no all-reduce), the one-hot subtracted only
    where this rank holds the target, a mean divided by the global token count."""
    import torch

    logits, labels, dloss, lse = xs
    start, stop = ctx.input_range(0)[-1]
    grad = torch.exp(logits - lse[..., None])
    inside = (labels >= start) & (labels < stop)
    local = torch.where(inside, labels - start, 0).long()[..., None]
    if grad.shape[-1]:  # an empty block of the vocab holds no target
        hit = torch.gather(grad, -1, local) - inside[..., None].to(grad.dtype)
        grad = grad.scatter(-1, local, hit)
    n = math.prod(ctx.input_types[1].shape) if attrs.get("reduction", "mean") == "mean" else 1
    return [grad * (dloss / n)]


def attention_query_offset(
    kind: str, xs: Sequence[Tensor], attrs: Attrs, ctx: LocalContext
) -> TorchResult:
    """Causal attention for a block of queries that starts at a global offset."""
    offset = ctx.input_range(0)[1][0]
    scale = attrs.get("scale")
    q, k, v = xs
    causal = bool(attrs.get("causal", True))
    scale = None if scale is None else float(scale)
    return [torch_attention.attention_tensors(q, k, v, causal, scale, offset)]


def masked_softmax_query_offset(
    kind: str, xs: Sequence[Tensor], attrs: Attrs, ctx: LocalContext
) -> TorchResult:
    """Causal masked softmax of a block of query rows that starts at a global offset."""
    offset = ctx.input_range(0)[-2][0]
    causal = bool(attrs.get("causal", False))
    scale = float(attrs.get("scale", 1.0))
    return [torch_attention.masked_softmax_tensor(xs[0], scale, causal, offset)]


def dropout_global_index(
    kind: str, xs: Sequence[Tensor], attrs: Attrs, ctx: LocalContext
) -> TorchResult:
    """(y, mask) of this rank's block: the mask of the block's global element indices."""
    index = torch_dropout.block_index(ctx.output_types[0].shape, ctx.output_range(0), xs[0].device)
    return torch_dropout.dropout_block(xs[0], attrs, index)


def _kv_heads_of_local_queries(ctx: LocalContext, local_heads: int) -> list[int]:
    """For each local query head, the global index of the kv head it reads."""
    group = ctx.input_types[0].shape[2] // ctx.input_types[1].shape[2]
    first = ctx.input_range(0)[2][0]
    return [(first + h) // group for h in range(local_heads)]


def attention_head_offset(
    kind: str, xs: Sequence[Tensor], attrs: Attrs, ctx: LocalContext
) -> TorchResult:
    """Attention over a block of query heads (and maybe of queries) with whole k/v heads."""
    q, k, v = xs
    heads = _kv_heads_of_local_queries(ctx, q.shape[2])
    causal = bool(attrs.get("causal", True))
    offset = ctx.input_range(0)[1][0] if causal else 0
    scale = attrs.get("scale")
    scale = None if scale is None else float(scale)
    out = torch_attention.attention_tensors(
        q, k[:, :, heads], v[:, :, heads], causal, scale, offset
    )
    return [out]


def attention_grad_head_offset(
    kind: str, xs: Sequence[Tensor], attrs: Attrs, ctx: LocalContext
) -> TorchResult:
    """dq of this rank's query heads, and its partial dk, dv over the whole kv heads."""
    import torch

    q, k, v, dy = xs
    heads = _kv_heads_of_local_queries(ctx, q.shape[2])
    dq, dk_local, dv_local = torch_attention.attention_backward(
        q, k[:, :, heads], v[:, :, heads], dy, bool(attrs.get("causal", True)), attrs.get("scale")
    )
    dk, dv = torch.zeros_like(k), torch.zeros_like(v)
    for j, head in enumerate(heads):
        dk[:, :, head] += dk_local[:, :, j]
        dv[:, :, head] += dv_local[:, :, j]
    return [dq, dk, dv]


def global_mean(inner: TorchKernel) -> TorchKernel:
    """`inner`'s local mean scaled to a partial sum of the global mean (uneven blocks); a
    rank whose block of the reduced elements is empty (share 0) contributes zeros, not its
    local mean of nothing (NaN), as `kernels.global_mean` does."""

    def kernel(kind: str, xs: Sequence[Tensor], attrs: Attrs, ctx: LocalContext) -> TorchGen:
        import torch

        out = inner(kind, xs, attrs, ctx)
        if not isinstance(out, list):
            out = yield from out
        share = _mean_share(kind, attrs, ctx)  # scales the mean (output 0) only
        return [out[0] * share if share else torch.zeros_like(out[0]), *out[1:]]

    return kernel


TORCH_KERNELS: dict[str, TorchKernel] = {
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
    "cross_entropy_grad_sharded": cross_entropy_grad_sharded,
}
TORCH_KERNELS["global_mean"] = global_mean(default_kernel)
TORCH_KERNELS["cross_entropy_vocab_parallel+global_mean"] = global_mean(
    cross_entropy_vocab_parallel
)

#: Kernels that run the kind's own torch op: they apply only to kinds that have one.
_OWN_OP = frozenset({"default", "replicated", "global_mean"})


def torch_kernel(kind: str, kernel: str, ctx: LocalContext) -> TorchKernel | None:
    """The torch version of rule kernel `kernel` for an op of `kind`, or None where the op
    keeps its numpy kernel (see the module docstring)."""
    fn = TORCH_KERNELS.get(kernel)
    if fn is None or (kernel in _OWN_OP and kind not in torch_ops.TORCH_IMPLS):
        return None
    torch_ops.load_torch()  # the kernels call its helpers directly
    if kernel == "replicated" and any(
        isinstance(p, Partial) for spec in ctx.output_specs for p in spec.placements
    ):
        return None
    return fn


def drive(out: Any, reduce: Callable[[CollectiveRequest], Any]) -> list[Any]:
    """A kernel's outputs: a generator's requests each answered by `reduce` until it
    returns; a list as it is."""
    if isinstance(out, list):
        return out
    reply: Any = None
    while True:
        try:
            request = next(out) if reply is None else out.send(reply)
        except StopIteration as stop:
            return list(stop.value)
        reply = reduce(request)
