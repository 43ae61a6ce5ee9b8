"""The ATen -> catalog table: one small function per ATen op (overload-free name).

Each mapping gets a `Ctx` (the emitter, the FX node, its module scope) and the node's
arguments with graph values as their names (`str`), constants as CPU tensors and the rest as
Python values; it emits catalog ops and returns the value name(s) the node stands for. A
mapping raises `Unmapped(reason)` for a case it cannot express (an attention dropout, a loss
with class weights); the walker then makes an opaque op of the node.

Conventions: `nn.Linear` weights keep PyTorch's [out, in] layout, so `linear` is a `matmul`
with `transpose_b` (plus an `add` of the bias); `addmm` (Hugging Face's `Conv1D`, [in, out])
is a catalog `linear`. Attention is `[B, H, S, D]` in PyTorch and `[B, S, H, D]` in the
catalog: q, k, v are permuted in and the output back. Scalars become `scale` (products) or
an add of a `fill` constant. A cast to the dtype a value already has is no op.
"""

from __future__ import annotations

import zlib
from typing import Any

import numpy as np

from shardlab.importers.aten_ctx import Ctx, Mapping, Unmapped, arg, is_const, tensor_arg
from shardlab.ir import OpRole

# -- identity and casts ------------------------------------------------------------------


def _identity(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return args[0]


def _to(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    x = tensor_arg(args[0], "the cast's input")
    want = ctx.out_type().dtype
    return x if ctx.type(x).dtype == want else ctx.emit("cast", [x], {"dtype": want}, "cast")


def _nothing(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return None


# -- elementwise ---------------------------------------------------------------------------


def _binary(kind: str) -> Mapping:
    def fn(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        a, b = args[0], args[1]
        alpha = float(arg(args, kwargs, 2, "alpha", 1))
        op = kind
        if op == "rsub":
            a, b, op = b, a, "sub"
        dtype = ctx.out_type().dtype
        sa, sb = ctx.scalar(a), ctx.scalar(b)
        if op == "mul" and (sa is not None or sb is not None):
            x, f = (b, sa) if sa is not None else (a, sb)
            return ctx.emit("scale", [ctx.val(x, dtype)], {"factor": f}, "mul")
        if op == "div" and sb is not None:
            return ctx.emit("scale", [ctx.val(a, dtype)], {"factor": 1.0 / sb}, "div")
        if op in ("add", "sub") and sb is not None:
            c = sb * alpha * (-1.0 if op == "sub" else 1.0)
            return ctx.emit("add", [ctx.val(a, dtype), ctx.out.scalar(c, dtype)], None, op)
        x, y = ctx.val(a, dtype), ctx.val(b, dtype)
        if alpha != 1.0:
            y = ctx.emit("scale", [y], {"factor": alpha}, "alpha")
        return ctx.emit(op, [x, y], None, kind)

    return fn


def _unary(kind: str) -> Mapping:
    def fn(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        x = ctx.val(tensor_arg(args[0], f"{kind}'s input"))
        attrs = None
        if kind == "gelu":
            attrs = {"approximate": str(arg(args, kwargs, 1, "approximate", "none"))}
        return ctx.emit(kind, [x], attrs)

    return fn


def _pow(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    x, e = tensor_arg(args[0], "pow's base"), ctx.scalar(args[1])
    if e == 1.0:
        return x
    simple = {2.0: "square", 0.5: "sqrt", -0.5: "rsqrt"}
    if e in simple:
        return ctx.emit(simple[e], [x], None, "pow")
    if e == 3.0:
        return ctx.emit("mul", [ctx.emit("square", [x], None, "pow"), x], None, "pow")
    raise Unmapped(f"pow with exponent {args[1]!r}")


def _reduce(kind: str) -> Mapping:
    def fn(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        x = tensor_arg(args[0], f"{kind}'s input")
        dims = arg(args, kwargs, 1, "dim", None)
        keep = bool(arg(args, kwargs, 2, "keepdim", False))
        if isinstance(dims, int):
            dims = [dims]
        attrs = {"dims": list(dims) if dims else None, "keepdim": keep}
        return ctx.emit(kind, [x], attrs, "amax" if kind == "max" else kind)

    return fn


def _softmax(kind: str) -> Mapping:
    def fn(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        x = tensor_arg(args[0], f"{kind}'s input")
        return ctx.emit(kind, [x], {"dim": int(arg(args, kwargs, 1, "dim", -1))}, kind)

    return fn


def _dropout(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    x = tensor_arg(args[0], "dropout's input")
    p, train = float(args[1]), bool(args[2])
    native = ctx.target == "aten.native_dropout"
    if not train or p == 0.0:
        if native:
            raise Unmapped("native_dropout outside training (its mask is all true)")
        return x
    seed = zlib.crc32(f"{ctx.scope}.{ctx.node.name}".encode())  # a mask of its own per op
    out, mask = ctx.out.emit("dropout", [x], {"p": p, "seed": seed}, ctx.scope, "dropout",
                             output_names=["out", "mask"])  # fmt: skip
    return [out, mask] if native else out


# -- shapes --------------------------------------------------------------------------------


def _view(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return ctx.reshape(tensor_arg(args[0], "the view's input"), ctx.out_type().shape)


def _expand(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    x, shape = tensor_arg(args[0], "expand's input"), ctx.out_type().shape
    if ctx.type(x).shape == shape:
        return x
    return ctx.emit("broadcast_to", [x], {"shape": list(shape)}, "expand")


def _broadcast_tensors(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    outs = []
    for i, ref in enumerate(args[0]):
        x, shape = ctx.val(ref), ctx.out_type(i).shape
        same = ctx.type(x).shape == shape
        outs.append(x if same else ctx.emit("broadcast_to", [x], {"shape": list(shape)}, "expand"))
    return outs


def _transpose(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    x = tensor_arg(args[0], "transpose's input")
    rank = ctx.type(x).rank
    d0, d1 = (0, 1) if ctx.target == "aten.t" else (int(args[1]) % rank, int(args[2]) % rank)
    if rank < 2 or d0 == d1:
        return x
    return ctx.emit("transpose", [x], {"dim0": d0, "dim1": d1})


def _permute(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    x = tensor_arg(args[0], "permute's input")
    perm = [int(d) % ctx.type(x).rank for d in args[1]]
    if perm == sorted(perm):
        return x
    return ctx.emit("permute", [x], {"perm": perm})


def _slice(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    x = tensor_arg(args[0], "slice's input")
    shape = ctx.type(x).shape
    dim = int(arg(args, kwargs, 1, "dim", 0)) % len(shape)
    start, stop, step = (arg(args, kwargs, i, k, d) for i, k, d in
                         ((2, "start", None), (3, "end", None), (4, "step", 1)))  # fmt: skip
    start, stop, step = slice(start, stop, step).indices(shape[dim])
    if (start, stop, step) == (0, shape[dim], 1):
        return x
    return ctx.emit("slice", [x], {"dim": dim, "start": start, "stop": stop, "step": step})


def _select(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    x = tensor_arg(args[0], "select's input")
    shape = ctx.type(x).shape
    dim = int(args[1]) % len(shape)
    index = int(args[2]) % shape[dim]
    one = ctx.emit("slice", [x], {"dim": dim, "start": index, "stop": index + 1}, "select")
    return ctx.reshape(one, ctx.out_type().shape)


def _cat(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    dtype = ctx.out_type().dtype
    parts = [ctx.val(t, dtype) for t in args[0] if not (is_const(t) and t.numel() == 0)]
    dim = int(arg(args, kwargs, 1, "dim", 0)) % ctx.out_type().rank
    return parts[0] if len(parts) == 1 else ctx.emit("concat", parts, {"dim": dim}, "cat")


def _split(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    x = tensor_arg(args[0], "split's input")
    shape = ctx.type(x).shape
    dim = int(arg(args, kwargs, 2, "dim", 0)) % len(shape)
    sizes = [int(t.shape[dim]) for t in ctx.node.meta["val"]]
    if len(sizes) == 1:
        return [x]
    return ctx.out.emit("split", [x], {"dim": dim, "sizes": sizes}, ctx.scope, "split")


# -- modules -------------------------------------------------------------------------------


def _linear(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    x, w = tensor_arg(args[0], "linear's input"), tensor_arg(args[1], "linear's weight")
    bias = arg(args, kwargs, 2, "bias", None)
    y = ctx.emit("matmul", [x, w], {"transpose_b": True}, "linear")
    return y if bias is None else ctx.emit("add", [y, ctx.val(bias)], None, "linear_bias")


def _addmm(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    bias, a, b = (
        args[0],
        tensor_arg(args[1], "addmm's input"),
        tensor_arg(args[2], "addmm's weight"),
    )
    beta, alpha = arg(args, kwargs, 3, "beta", 1), arg(args, kwargs, 4, "alpha", 1)
    if beta != 1 or alpha != 1:
        raise Unmapped(f"addmm with beta={beta}, alpha={alpha}")
    bias = ctx.val(bias)
    if ctx.type(bias).rank == 1:
        return ctx.emit("linear", [a, b, bias], None, "addmm")
    return ctx.emit("add", [ctx.emit("matmul", [a, b], None, "mm"), bias], None, "addmm")


def _matmul(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    a, b = ctx.val(args[0]), ctx.val(args[1])
    if ctx.type(a).rank < 2 or ctx.type(b).rank < 2:
        raise Unmapped("matmul of a vector")
    return ctx.emit("matmul", [a, b], None, "matmul")


def _embedding(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    table, ids = tensor_arg(args[0], "embedding's table"), args[1]
    if isinstance(ids, str):
        return ctx.emit("embedding", [ids, table])
    if not is_const(ids):
        raise Unmapped("embedding ids that are neither a tensor nor a constant")
    positions = ids.numpy().reshape(-1, ids.shape[-1]) if ids.ndim else None
    n = ids.shape[-1] if ids.ndim else 0
    if positions is None or not np.array_equal(
        positions, np.broadcast_to(np.arange(n), positions.shape)
    ):
        return ctx.emit("embedding", [ctx.val(ids), table])
    rows = ctx.emit("slice", [table], {"dim": 0, "start": 0, "stop": n}, "positions")
    hidden = ctx.type(table).shape[1]
    rows = ctx.reshape(rows, [*[1] * (ids.ndim - 1), n, hidden])
    shape = ctx.out_type().shape
    if ctx.type(rows).shape != shape:
        rows = ctx.emit("broadcast_to", [rows], {"shape": list(shape)}, "positions_expand")
    return rows


def _affine(ctx: Ctx, ref: Any, hidden: int, fill: float, dtype: str) -> str:
    return ctx.val(ref) if ref is not None else ctx.out.full([hidden], fill, dtype)


def _layer_norm(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    x = tensor_arg(args[0], "layer_norm's input")
    if len(args[1]) != 1:
        raise Unmapped(f"layer_norm over {len(args[1])} dims")
    hidden, dtype = ctx.type(x).shape[-1], ctx.type(x).dtype
    w = _affine(ctx, arg(args, kwargs, 2, "weight", None), hidden, 1.0, dtype)
    b = _affine(ctx, arg(args, kwargs, 3, "bias", None), hidden, 0.0, dtype)
    eps = float(arg(args, kwargs, 4, "eps", 1e-5))
    return ctx.emit("layer_norm", [x, w, b], {"eps": eps})


def _rms_norm(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    x = tensor_arg(args[0], "rms_norm's input")
    if len(args[1]) != 1:
        raise Unmapped(f"rms_norm over {len(args[1])} dims")
    hidden, dtype = ctx.type(x).shape[-1], ctx.type(x).dtype
    w = _affine(ctx, arg(args, kwargs, 2, "weight", None), hidden, 1.0, dtype)
    eps = arg(args, kwargs, 3, "eps", None)
    if eps is None:
        eps = float(np.finfo(np.float16 if dtype == "float16" else np.float32).eps)
    return ctx.emit("rms_norm", [x, w], {"eps": float(eps)})


def causal_mask(mask: Any) -> bool | None:
    """True for a causal mask (bool lower triangle, or 0 / -inf additive), False for one
    that masks nothing, None for any other."""
    m = np.asarray(mask.double().numpy() if mask.is_floating_point() else mask.numpy())
    if m.ndim < 2:
        return None
    sq, sk = m.shape[-2:]
    tril = np.tril(np.ones((sq, sk), dtype=bool))
    if m.dtype == np.bool_:
        keep = m
    elif np.all((m == 0) | (m <= -1e4)):
        keep = m == 0
    else:
        return None
    if np.all(keep):
        return False
    return True if np.all(keep == tril) else None


def _sdpa(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    q, k, v = (tensor_arg(a, "attention's q/k/v") for a in args[:3])
    mask = arg(args, kwargs, 3, "attn_mask", None)
    p = float(arg(args, kwargs, 4, "dropout_p", 0.0))
    if p != 0.0:  # as the presets' flash attention: the fused op has no dropout
        ctx.out.notes.add(f"attention dropout (p={p}) is not modelled: the catalog's fused "
                          "attention has none")  # fmt: skip
    causal = bool(arg(args, kwargs, 5, "is_causal", False))
    if mask is not None:
        found = causal_mask(mask) if is_const(mask) else None
        if found is None:
            raise Unmapped("an attention mask that is not causal (or is computed by the graph)")
        causal = causal or found
    if any(ctx.type(t).rank != 4 for t in (q, k, v)):
        raise Unmapped("attention inputs that are not [batch, heads, seq, dim]")
    heads = {"perm": [0, 2, 1, 3]}
    qt, kt, vt = (
        ctx.emit("permute", [t], heads, f"{p}_heads") for p, t in zip("qkv", (q, k, v), strict=True)
    )
    attrs: dict[str, Any] = {"causal": causal}
    scale = kwargs.get("scale")
    if scale is not None:
        attrs["scale"] = float(scale)
    out = ctx.emit("scaled_dot_product_attention", [qt, kt, vt], attrs, "sdpa")
    return ctx.emit("permute", [out], heads, "sdpa_heads")


def _cross_entropy(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    logits, labels = (
        tensor_arg(args[0], "the loss's logits"),
        tensor_arg(args[1], "the loss's labels"),
    )
    if arg(args, kwargs, 2, "weight", None) is not None:
        raise Unmapped("cross entropy with class weights")
    if float(arg(args, kwargs, 5, "label_smoothing", 0.0)) != 0.0:
        raise Unmapped("cross entropy with label smoothing")
    reduction = {1: "mean", 2: "sum"}.get(int(arg(args, kwargs, 3, "reduction", 1)))
    if reduction is None:
        raise Unmapped("cross entropy without reduction")
    rank = ctx.type(logits).rank
    if rank > 2:  # classes on dim 1 -> last
        perm = [0, *range(2, rank), 1]
        logits = ctx.emit("permute", [logits], {"perm": perm}, "classes_last")
    return ctx.emit("cross_entropy", [logits, labels], {"reduction": reduction},
                    "cross_entropy", role=OpRole.LOSS)  # fmt: skip


def _mse(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    pred, target = ctx.val(args[0]), ctx.val(args[1])
    reduction = {1: "mean", 2: "sum"}.get(int(arg(args, kwargs, 2, "reduction", 1)))
    if reduction is None:
        raise Unmapped("mse loss without reduction")
    return ctx.emit("mse_loss", [pred, target], {"reduction": reduction}, role=OpRole.LOSS)


ATEN: dict[str, Mapping] = {
    **dict.fromkeys(
        ("aten.alias", "aten.clone", "aten.contiguous", "aten.detach", "aten.lift_fresh_copy"),
        _identity,
    ),
    **dict.fromkeys(("aten.to", "aten._to_copy", "aten.type_as"), _to),
    "aten._assert_tensor_metadata": _nothing,
    **{f"aten.{k}": _binary(k) for k in ("add", "sub", "mul", "div", "rsub")},
    **{
        f"aten.{k}": _unary(k)
        for k in ("neg", "relu", "gelu", "silu", "sigmoid", "tanh", "exp", "log", "sqrt", "rsqrt")
    },
    "aten.pow": _pow,
    "aten.sum": _reduce("sum"),
    "aten.mean": _reduce("mean"),
    "aten.amax": _reduce("max"),
    **dict.fromkeys(("aten.softmax", "aten._softmax"), _softmax("softmax")),
    **dict.fromkeys(("aten.log_softmax", "aten._log_softmax"), _softmax("log_softmax")),
    **dict.fromkeys(("aten.dropout", "aten.native_dropout"), _dropout),
    **dict.fromkeys(
        (
            "aten.view",
            "aten.reshape",
            "aten._unsafe_view",
            "aten.unsqueeze",
            "aten.squeeze",
            "aten.flatten",
            "aten.unflatten",
        ),
        _view,
    ),
    "aten.expand": _expand,
    "aten.broadcast_tensors": _broadcast_tensors,
    **dict.fromkeys(("aten.transpose", "aten.t"), _transpose),
    "aten.permute": _permute,
    "aten.slice": _slice,
    "aten.select": _select,
    "aten.cat": _cat,
    **dict.fromkeys(("aten.split", "aten.split_with_sizes", "aten.chunk"), _split),
    "aten.linear": _linear,
    "aten.addmm": _addmm,
    **dict.fromkeys(("aten.mm", "aten.bmm", "aten.matmul"), _matmul),
    "aten.embedding": _embedding,
    "aten.layer_norm": _layer_norm,
    "aten.rms_norm": _rms_norm,
    "aten.scaled_dot_product_attention": _sdpa,
    "aten.cross_entropy_loss": _cross_entropy,
    "aten.mse_loss": _mse,
}
