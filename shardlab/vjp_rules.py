"""Vector-Jacobian products of the op catalog, attached to each kind's `vjp` slot.

A VJP is `vjp(ctx, op, dys, needs) -> dxs`: given the forward `op`, the gradient value of each
output (None where an output gets none) and which inputs need a gradient, it emits backward
ops through `ctx` and returns one gradient value name (or None) per input. VJPs are composed
from catalog ops where natural; fused kinds use the kernels of `shardlab.ops.autodiff_ops`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from shardlab.ir import Op
from shardlab.ops.base import attach, get_op
from shardlab.ops.reduce import reduce_dims

if TYPE_CHECKING:
    from shardlab.autodiff import BackwardContext

Grads = list[str | None]
Vjp = Callable[["BackwardContext", Op, Sequence[str | None], Sequence[bool]], Grads]

#: Kinds without a VJP, and why (autodiff refuses them on a path from a param to the loss).
NON_DIFFERENTIABLE: dict[str, str] = {
    "rope_cache": "no inputs; its cos/sin tables are constants",
    "opaque": "its computation is unknown to the catalog",
    "fill": "no inputs; a constant",
    **{
        k: "a backward kernel; second-order gradients are not supported"
        for k in (
            "relu_grad",
            "gelu_grad",
            "silu_grad",
            "sigmoid_grad",
            "tanh_grad",
            "max_grad",
            "slice_grad",
            "layer_norm_grad",
            "rms_norm_grad",
            "attention_grad",
            "cross_entropy_grad",
            "embedding_grad",
            "dropout_grad",
            "masked_softmax_grad",
        )
    },
    "main_grad": "a gradient cast that autodiff inserts before the optimizer",
    "sgd": "an optimizer step",
    "adamw": "an optimizer step",
    **{k: "a buffer layout op that passes insert after autodiff" for k in ("pack", "unpack")},
    **{
        k: "a synchronisation or transfer op that passes insert after autodiff"
        for k in ("wait", "hold", "free", "send", "recv")
    },
}


def _vjp(*kinds: str) -> Callable[[Vjp], Vjp]:
    def deco(fn: Vjp) -> Vjp:
        for kind in kinds:
            get_op(kind)
            attach(kind, vjp=fn)
        return fn

    return deco


def _dy(dys: Sequence[str | None]) -> str:
    assert dys[0] is not None
    return dys[0]


@_vjp("add", "sub")
def _add_sub(
    ctx: BackwardContext, op: Op, dys: Sequence[str | None], needs: Sequence[bool]
) -> Grads:
    dy = _dy(dys)
    da = ctx.sum_to(dy, op.inputs[0]) if needs[0] else None
    db = ctx.sum_to(dy, op.inputs[1]) if needs[1] else None
    if db is not None and op.kind == "sub":
        db = ctx.one("neg", [db])
    return [da, db]


@_vjp("mul")
def _mul(ctx: BackwardContext, op: Op, dys: Sequence[str | None], needs: Sequence[bool]) -> Grads:
    dy, (a, b) = _dy(dys), op.inputs
    return [
        ctx.sum_to(ctx.one("mul", [dy, b]), a) if needs[0] else None,
        ctx.sum_to(ctx.one("mul", [dy, a]), b) if needs[1] else None,
    ]


@_vjp("div")
def _div(ctx: BackwardContext, op: Op, dys: Sequence[str | None], needs: Sequence[bool]) -> Grads:
    dy, (a, b), y = _dy(dys), op.inputs, op.outputs[0]
    da = ctx.sum_to(ctx.one("div", [dy, b]), a) if needs[0] else None
    db = None
    if needs[1]:
        db = ctx.one("neg", [ctx.sum_to(ctx.one("div", [ctx.one("mul", [dy, y]), b]), b)])
    return [da, db]


@_vjp("neg")
def _neg(ctx: BackwardContext, op: Op, dys: Sequence[str | None], needs: Sequence[bool]) -> Grads:
    return [ctx.one("neg", [_dy(dys)])]


@_vjp("scale")
def _scale(ctx: BackwardContext, op: Op, dys: Sequence[str | None], needs: Sequence[bool]) -> Grads:
    return [ctx.one("scale", [_dy(dys)], {"factor": op.attrs["factor"]})]


@_vjp("cast")
def _cast(ctx: BackwardContext, op: Op, dys: Sequence[str | None], needs: Sequence[bool]) -> Grads:
    return [ctx.one("cast", [_dy(dys)], {"dtype": ctx.type(op.inputs[0]).dtype})]


@_vjp("relu", "gelu", "silu", "sigmoid", "tanh")
def _act(ctx: BackwardContext, op: Op, dys: Sequence[str | None], needs: Sequence[bool]) -> Grads:
    attrs = {"approximate": op.attrs.get("approximate", "none")} if op.kind == "gelu" else {}
    return [ctx.one(f"{op.kind}_grad", [op.inputs[0], _dy(dys)], attrs)]


@_vjp("exp", "log", "square", "sqrt", "rsqrt")
def _math(ctx: BackwardContext, op: Op, dys: Sequence[str | None], needs: Sequence[bool]) -> Grads:
    dy, x, y = _dy(dys), op.inputs[0], op.outputs[0]
    if op.kind == "exp":
        return [ctx.one("mul", [dy, y])]
    if op.kind == "log":
        return [ctx.one("div", [dy, x])]
    if op.kind == "square":
        return [ctx.one("scale", [ctx.one("mul", [dy, x])], {"factor": 2.0})]
    if op.kind == "sqrt":
        return [ctx.one("scale", [ctx.one("div", [dy, y])], {"factor": 0.5})]
    cube = ctx.one("mul", [y, ctx.one("square", [y])])  # d rsqrt = -0.5 * y^3
    return [ctx.one("scale", [ctx.one("mul", [dy, cube])], {"factor": -0.5})]


@_vjp("matmul")
def _matmul(
    ctx: BackwardContext, op: Op, dys: Sequence[str | None], needs: Sequence[bool]
) -> Grads:
    dy, (a, b) = _dy(dys), op.inputs
    ta, tb = bool(op.attrs.get("transpose_a", False)), bool(op.attrs.get("transpose_b", False))
    da = db = None
    if needs[0]:
        if ta:  # a holds A^T: dA^T = B dY^T
            da = ctx.one("matmul", [b, dy], {"transpose_a": tb, "transpose_b": True})
        else:  # dA = dY B^T
            da = ctx.one("matmul", [dy, b], {"transpose_b": not tb})
        da = ctx.sum_to(da, a)
    if needs[1] and ctx.type(b).rank == 2 and ctx.type(a).rank > 2 and not ta:
        # a weight read by a batch of rows (x [..., k] @ W, PyTorch's nn.Linear as imported):
        # contract the leading dims away in one matmul, as `linear` does, rather than make a
        # weight-sized gradient per batch element and sum them
        k, n = ctx.type(a).shape[-1], ctx.type(dy).shape[-1]
        a2 = ctx.one("reshape", [a], {"shape": [-1, k]})
        dy2 = ctx.one("reshape", [dy], {"shape": [-1, n]})
        db = ctx.one("matmul", [dy2, a2] if tb else [a2, dy2], {"transpose_a": True})
    elif needs[1]:
        if tb:  # b holds B^T: dB^T = dY^T A
            db = ctx.one("matmul", [dy, a], {"transpose_a": True, "transpose_b": ta})
        else:  # dB = A^T dY
            db = ctx.one("matmul", [a, dy], {"transpose_a": not ta})
        db = ctx.sum_to(db, b)
    return [da, db]


@_vjp("linear")
def _linear(
    ctx: BackwardContext, op: Op, dys: Sequence[str | None], needs: Sequence[bool]
) -> Grads:
    dy, x, w = _dy(dys), op.inputs[0], op.inputs[1]
    n_in, n_out = ctx.type(w).shape
    out: Grads = [None] * len(op.inputs)
    if needs[0]:
        out[0] = ctx.one("matmul", [dy, w], {"transpose_b": True}) if ctx.type(x).rank > 1 else None
        if out[0] is None:  # a vector x: contract through a [1, out] view
            dy2 = ctx.one("reshape", [dy], {"shape": [1, n_out]})
            dx2 = ctx.one("matmul", [dy2, w], {"transpose_b": True})
            out[0] = ctx.one("reshape", [dx2], {"shape": [n_in]})
    if needs[1]:
        x2 = ctx.one("reshape", [x], {"shape": [-1, n_in]})
        dy2 = ctx.one("reshape", [dy], {"shape": [-1, n_out]})
        out[1] = ctx.one("matmul", [x2, dy2], {"transpose_a": True})
    if len(op.inputs) == 3 and needs[2]:
        out[2] = ctx.sum_to(dy, op.inputs[2])
    return out


@_vjp("sum", "mean")
def _sum(ctx: BackwardContext, op: Op, dys: Sequence[str | None], needs: Sequence[bool]) -> Grads:
    dy, xt = _dy(dys), ctx.type(op.inputs[0])
    dims = reduce_dims(xt.rank, op.attrs, op.kind)
    kept = [1 if i in dims else n for i, n in enumerate(xt.shape)]
    g = ctx.one(
        "broadcast_to", [ctx.one("reshape", [dy], {"shape": kept})], {"shape": list(xt.shape)}
    )
    if op.kind == "mean":
        g = ctx.one("scale", [g], {"factor": 1.0 / math.prod(xt.shape[d] for d in dims)})
    return [g]


@_vjp("max")
def _max(ctx: BackwardContext, op: Op, dys: Sequence[str | None], needs: Sequence[bool]) -> Grads:
    attrs: dict[str, Any] = {k: op.attrs[k] for k in ("dims", "keepdim") if k in op.attrs}
    return [ctx.one("max_grad", [op.inputs[0], op.outputs[0], _dy(dys)], attrs)]


@_vjp("broadcast_to")
def _bcast(ctx: BackwardContext, op: Op, dys: Sequence[str | None], needs: Sequence[bool]) -> Grads:
    return [ctx.sum_to(_dy(dys), op.inputs[0])]


@_vjp("softmax", "log_softmax")
def _softmax(
    ctx: BackwardContext, op: Op, dys: Sequence[str | None], needs: Sequence[bool]
) -> Grads:
    dy, y = _dy(dys), op.outputs[0]
    red = {"dims": [int(op.attrs.get("dim", -1))], "keepdim": True}
    if op.kind == "softmax":  # y * (dy - sum(dy * y))
        dot = ctx.one("sum", [ctx.one("mul", [dy, y])], red)
        return [ctx.one("mul", [y, ctx.one("sub", [dy, dot])])]
    total = ctx.one("sum", [dy], red)  # dy - exp(y) * sum(dy)
    return [ctx.one("sub", [dy, ctx.one("mul", [ctx.one("exp", [y]), total])])]


@_vjp("masked_softmax")
def _masked_softmax(
    ctx: BackwardContext, op: Op, dys: Sequence[str | None], needs: Sequence[bool]
) -> Grads:
    attrs = {"scale": op.attrs.get("scale", 1.0)}  # the output alone: scores are not kept
    return [ctx.one("masked_softmax_grad", [op.outputs[0], _dy(dys)], attrs)]


@_vjp("dropout")
def _dropout(
    ctx: BackwardContext, op: Op, dys: Sequence[str | None], needs: Sequence[bool]
) -> Grads:
    return [ctx.one("dropout_grad", [_dy(dys), op.outputs[1]], {"p": op.attrs["p"]})]


@_vjp("reshape")
def _reshape(
    ctx: BackwardContext, op: Op, dys: Sequence[str | None], needs: Sequence[bool]
) -> Grads:
    return [ctx.one("reshape", [_dy(dys)], {"shape": list(ctx.type(op.inputs[0]).shape)})]


@_vjp("transpose")
def _transpose(
    ctx: BackwardContext, op: Op, dys: Sequence[str | None], needs: Sequence[bool]
) -> Grads:
    return [ctx.one("transpose", [_dy(dys)], {"dim0": op.attrs["dim0"], "dim1": op.attrs["dim1"]})]


@_vjp("permute")
def _permute(
    ctx: BackwardContext, op: Op, dys: Sequence[str | None], needs: Sequence[bool]
) -> Grads:
    perm = [int(p) for p in op.attrs["perm"]]
    return [ctx.one("permute", [_dy(dys)], {"perm": [perm.index(i) for i in range(len(perm))]})]


@_vjp("split")
def _split(ctx: BackwardContext, op: Op, dys: Sequence[str | None], needs: Sequence[bool]) -> Grads:
    parts = [
        dy if dy is not None else ctx.zeros(out) for dy, out in zip(dys, op.outputs, strict=True)
    ]
    return [ctx.one("concat", parts, {"dim": op.attrs["dim"]})]


@_vjp("concat")
def _concat(
    ctx: BackwardContext, op: Op, dys: Sequence[str | None], needs: Sequence[bool]
) -> Grads:
    dim = int(op.attrs["dim"])
    sizes = [ctx.type(x).shape[dim] for x in op.inputs]
    if len(sizes) == 1:
        return [ctx.one("reshape", [_dy(dys)], {"shape": list(ctx.type(op.inputs[0]).shape)})]
    parts = ctx.emit("split", [_dy(dys)], {"dim": dim, "sizes": sizes})
    return [p if need else None for p, need in zip(parts, needs, strict=True)]


@_vjp("slice")
def _slice(ctx: BackwardContext, op: Op, dys: Sequence[str | None], needs: Sequence[bool]) -> Grads:
    xt = ctx.type(op.inputs[0])
    dim = int(op.attrs["dim"]) % xt.rank
    return [ctx.one("slice_grad", [_dy(dys)], {**op.attrs, "size": xt.shape[dim]})]


@_vjp("embedding")
def _embedding(
    ctx: BackwardContext, op: Op, dys: Sequence[str | None], needs: Sequence[bool]
) -> Grads:
    vocab = ctx.type(op.inputs[1]).shape[0]
    return [None, ctx.one("embedding_grad", [op.inputs[0], _dy(dys)], {"vocab": vocab})]


@_vjp("rotary_embedding")
def _rotary(
    ctx: BackwardContext, op: Op, dys: Sequence[str | None], needs: Sequence[bool]
) -> Grads:
    _, cos, sin = op.inputs  # the inverse rotation: rotate by -angle
    return [ctx.one("rotary_embedding", [_dy(dys), cos, ctx.one("neg", [sin])]), None, None]


@_vjp("layer_norm", "rms_norm")
def _norm(ctx: BackwardContext, op: Op, dys: Sequence[str | None], needs: Sequence[bool]) -> Grads:
    attrs = {"eps": op.attrs["eps"]} if "eps" in op.attrs else {}
    outs = ctx.emit(f"{op.kind}_grad", [op.inputs[0], op.inputs[1], _dy(dys)], attrs)
    return [o if need else None for o, need in zip(outs, needs, strict=True)]


@_vjp("scaled_dot_product_attention")
def _sdpa(ctx: BackwardContext, op: Op, dys: Sequence[str | None], needs: Sequence[bool]) -> Grads:
    attrs: dict[str, Any] = {k: op.attrs[k] for k in ("causal", "scale") if k in op.attrs}
    outs = ctx.emit("attention_grad", [*op.inputs, _dy(dys)], attrs)
    return [o if need else None for o, need in zip(outs, needs, strict=True)]


@_vjp("cross_entropy")
def _ce(ctx: BackwardContext, op: Op, dys: Sequence[str | None], needs: Sequence[bool]) -> Grads:
    """The forward keeps its log-sum-exp per label (attr `lse`, float32: 4 bytes a token)
    for the backward, so a vocab-parallel backward needs no all-reduce of its own (torch's
    loss_parallel and Megatron-LM keep what they need from the forward too)."""
    attrs = {"reduction": op.attrs.get("reduction", "mean")}
    lse = ctx.keep_output(op, {"lse": True})
    return [ctx.one("cross_entropy_grad", [*op.inputs, _dy(dys), lse], attrs), None]


@_vjp("mse_loss")
def _mse(ctx: BackwardContext, op: Op, dys: Sequence[str | None], needs: Sequence[bool]) -> Grads:
    pred, target = op.inputs
    t = ctx.type(pred)
    n = t.numel if op.attrs.get("reduction", "mean") == "mean" else 1
    diff = ctx.one("mul", [ctx.one("sub", [pred, target]), _dy(dys)])
    dpred = ctx.one("scale", [diff], {"factor": 2.0 / n})
    return [dpred if needs[0] else None, ctx.one("neg", [dpred]) if needs[1] else None]


def differentiable_kinds() -> dict[str, Any]:
    """Every kind with a VJP, by kind."""
    from shardlab.ops import all_ops

    return {d.kind: d.vjp for d in all_ops() if d.vjp is not None}
