"""Losses: `cross_entropy` and `mse_loss`, each a scalar of the prediction's dtype.

Attr `reduction`: "mean" (default) or "sum" of the per-element loss terms.

- cross_entropy(logits, labels): logits [..., V] float, labels [...] int64/int32 (logits'
  leading shape) holding classes in [0, V); the term per label is
  logsumexp(logits) - logits[label], computed stably. FLOPs: 5 per logit. Attr `lse`
  (default false; the training graph sets it, `autodiff`): also output each label's
  log-sum-exp [...] in float32, which `cross_entropy_grad` reads so that its backward needs
  no statistics of the whole vocabulary again (torch's loss_parallel and Megatron-LM keep
  theirs from the forward too).
- mse_loss(pred, target): same shape and dtype; terms (pred - target)^2. FLOPs: 3 per element.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from shardlab.errors import ExecutionError, OpSignatureError
from shardlab.ir import INT_DTYPES, TensorType
from shardlab.ops.base import (
    Array,
    Attrs,
    OpDef,
    attr_bool,
    attr_str,
    register,
    require_float,
    same_dtype,
)

_REDUCTIONS = ("mean", "sum")
#: The dtype of cross_entropy's per-label log-sum-exp (attr `lse`), kept in float32 whatever
#: the logits' dtype, as the frameworks keep their softmax statistics.
LSE_DTYPE = "float32"


def _reduce(terms: Array, attrs: Attrs) -> Array:
    if attrs.get("reduction", "mean") == "sum":
        return np.asarray(np.sum(terms))
    return np.asarray(np.mean(terms))


def _ce_infer(ins: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    logits, labels = ins
    require_float(logits, "cross_entropy", "logits")
    if logits.rank < 1:
        raise OpSignatureError(f"cross_entropy: logits must have rank >= 1 [..., V], got {logits}")
    if labels.dtype not in INT_DTYPES:
        raise OpSignatureError(f"cross_entropy: labels must be int64 or int32, got {labels}")
    if labels.shape != logits.shape[:-1]:
        raise OpSignatureError(
            f"cross_entropy: labels must have logits' leading shape "
            f"{list(logits.shape[:-1])}, got {labels}"
        )
    attr_str(attrs, "reduction", _REDUCTIONS, "mean")
    loss = TensorType((), logits.dtype)
    if attr_bool(attrs, "lse"):
        return [loss, TensorType(logits.shape[:-1], LSE_DTYPE)]
    return [loss]


def _ce_flops(ins: Sequence[TensorType], outs: Sequence[TensorType], attrs: Attrs) -> int:
    return 5 * ins[0].numel


def _ce_np(xs: Sequence[Array], attrs: Attrs) -> list[Array]:
    logits, labels = xs
    vocab = logits.shape[-1]
    if labels.size and (labels.min() < 0 or labels.max() >= vocab):
        raise ExecutionError(
            f"cross_entropy: labels hold values in [{labels.min()}, {labels.max()}], "
            f"outside the classes [0, {vocab})"
        )
    peak = np.max(logits, axis=-1, keepdims=True)
    lse = peak[..., 0] + np.log(np.sum(np.exp(logits - peak), axis=-1))
    picked = np.take_along_axis(logits, labels[..., None].astype(np.int64), axis=-1)[..., 0]
    loss = _reduce(lse - picked, attrs)
    return [loss, lse] if attrs.get("lse", False) else [loss]


register(
    OpDef(
        kind="cross_entropy",
        family="loss",
        doc="cross entropy of logits [..., V] against integer labels [...] -> scalar; "
        "attr reduction ('mean' or 'sum'); attr lse: also the per-label log-sum-exp (float32).",
        min_inputs=2,
        max_inputs=2,
        infer=_ce_infer,
        numpy_impl=_ce_np,
        flops=_ce_flops,
        index_bounds=lambda ins, attrs: {1: ins[0].shape[-1]},
    )
)


def _mse_infer(ins: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    pred, target = ins
    require_float(pred, "mse_loss", "pred")
    if target.shape != pred.shape:
        raise OpSignatureError(
            f"mse_loss: target must have pred's shape {list(pred.shape)}, got {target}"
        )
    dtype = same_dtype(ins, "mse_loss")
    attr_str(attrs, "reduction", _REDUCTIONS, "mean")
    return [TensorType((), dtype)]


def _mse_flops(ins: Sequence[TensorType], outs: Sequence[TensorType], attrs: Attrs) -> int:
    return 3 * ins[0].numel


def _mse_np(xs: Sequence[Array], attrs: Attrs) -> list[Array]:
    diff = xs[0] - xs[1]
    return [_reduce(diff * diff, attrs)]


register(
    OpDef(
        kind="mse_loss",
        family="loss",
        doc="squared error of pred and target (same shape) -> scalar; attr reduction "
        "('mean' or 'sum').",
        min_inputs=2,
        max_inputs=2,
        infer=_mse_infer,
        numpy_impl=_mse_np,
        flops=_mse_flops,
    )
)
