"""Elementwise ops: binary arithmetic with numpy broadcasting, unary math, scale and cast."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from shardlab.errors import ExecutionError, OpSignatureError
from shardlab.ir import DTYPE_BYTES, FLOAT_DTYPES, TensorType
from shardlab.ops.base import (
    Array,
    Attrs,
    NumpyFn,
    OpDef,
    attr_float,
    attr_str,
    broadcast_shapes,
    register,
    require_float,
    same_dtype,
)

_erf = np.vectorize(math.erf, otypes=[np.float64])


def gelu(x: Array, approximate: str = "none") -> Array:
    """GELU, exact (erf) or with the tanh approximation used by GPT-2."""
    if approximate == "tanh":
        inner = math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)
        return np.asarray(0.5 * x * (1.0 + np.tanh(inner)))
    return np.asarray(0.5 * x * (1.0 + _erf(x / math.sqrt(2.0))).astype(x.dtype))


def sigmoid(x: Array) -> Array:
    return np.asarray(0.5 * (1.0 + np.tanh(0.5 * x)))


def _binary_infer(kind: str) -> Callable[[Sequence[TensorType], Attrs], list[TensorType]]:
    def infer(ins: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
        dtype = same_dtype(ins, kind)
        if dtype == "bool" or (kind == "div" and not ins[0].is_float):
            need = "floating-point" if kind == "div" else "numeric"
            raise OpSignatureError(f"{kind} needs {need} inputs, got {ins[0]}")
        return [TensorType(broadcast_shapes(ins[0].shape, ins[1].shape, kind), dtype)]

    return infer


def _per_element(cost: int) -> Callable[[Sequence[TensorType], Sequence[TensorType], Attrs], int]:
    def flops(ins: Sequence[TensorType], outs: Sequence[TensorType], attrs: Attrs) -> int:
        return cost * outs[0].numel

    return flops


_BINARY: dict[str, tuple[Callable[[Array, Array], Array], str]] = {
    "add": (np.add, "a + b"),
    "sub": (np.subtract, "a - b"),
    "mul": (np.multiply, "a * b"),
    "div": (np.divide, "a / b"),
}


def _binary_np(fn: Callable[[Array, Array], Array]) -> NumpyFn:
    return lambda xs, attrs: [np.asarray(fn(xs[0], xs[1]))]


for _kind, (_fn, _doc) in _BINARY.items():
    register(
        OpDef(
            kind=_kind,
            family="elementwise",
            doc=f"{_doc}, numpy broadcasting, inputs of one dtype.",
            min_inputs=2,
            max_inputs=2,
            infer=_binary_infer(_kind),
            numpy_impl=_binary_np(_fn),
            flops=_per_element(1),
        )
    )


def _unary_infer(kind: str) -> Callable[[Sequence[TensorType], Attrs], list[TensorType]]:
    def infer(ins: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
        if kind != "neg":
            require_float(ins[0], kind)
        if kind == "gelu":
            attr_str(attrs, "approximate", ("none", "tanh"), "none")
        return [ins[0]]

    return infer


#: kind -> (numpy function of (x, attrs), FLOPs per element, doc)
_UNARY: dict[str, tuple[Callable[[Array, Attrs], Array], int, str]] = {
    "neg": (lambda x, a: -x, 1, "-x"),
    "relu": (lambda x, a: np.maximum(x, 0), 1, "max(x, 0)"),
    "gelu": (
        lambda x, a: gelu(x, str(a.get("approximate", "none"))),
        8,
        "GELU; attr approximate: 'none' (erf) or 'tanh'",
    ),
    "silu": (lambda x, a: x * sigmoid(x), 4, "x * sigmoid(x)"),
    "sigmoid": (lambda x, a: sigmoid(x), 4, "1 / (1 + exp(-x))"),
    "tanh": (lambda x, a: np.tanh(x), 4, "tanh(x)"),
    "exp": (lambda x, a: np.exp(x), 1, "exp(x)"),
    "log": (lambda x, a: np.log(x), 1, "natural log"),
    "square": (lambda x, a: x * x, 1, "x * x"),
    "sqrt": (lambda x, a: np.sqrt(x), 1, "square root"),
    "rsqrt": (lambda x, a: 1.0 / np.sqrt(x), 2, "1 / sqrt(x)"),
}


def _unary_np(fn: Callable[[Array, Attrs], Array]) -> NumpyFn:
    return lambda xs, attrs: [np.asarray(fn(xs[0], attrs))]


for _kind, (_ufn, _cost, _doc) in _UNARY.items():
    register(
        OpDef(
            kind=_kind,
            family="elementwise",
            doc=_doc,
            min_inputs=1,
            max_inputs=1,
            infer=_unary_infer(_kind),
            numpy_impl=_unary_np(_ufn),
            flops=_per_element(_cost),
        )
    )


def _scale_infer(ins: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    require_float(ins[0], "scale")
    attr_float(attrs, "factor")
    return [ins[0]]


register(
    OpDef(
        kind="scale",
        family="elementwise",
        doc="x * factor (attr factor: a number).",
        min_inputs=1,
        max_inputs=1,
        infer=_scale_infer,
        numpy_impl=lambda xs, attrs: [xs[0] * float(attrs["factor"])],
        flops=_per_element(1),
    )
)


def _cast_infer(ins: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    dtype = attr_str(attrs, "dtype", tuple(DTYPE_BYTES))
    return [TensorType(ins[0].shape, dtype)]


def _cast_np(xs: Sequence[Array], attrs: Attrs) -> list[Array]:
    """Float-to-float casts keep the runtime's compute dtype; others convert for real."""
    x, dtype = xs[0], str(attrs["dtype"])
    if dtype in FLOAT_DTYPES:
        target = x.dtype if x.dtype.kind == "f" else np.float64
        return [x.astype(target)]
    if x.dtype.kind == "f" and dtype != "bool" and not np.all(np.isfinite(x)):
        raise ExecutionError(f"cast to {dtype}: input holds non-finite values")
    return [x.astype({"int64": np.int64, "int32": np.int32, "bool": np.bool_}[dtype])]


register(
    OpDef(
        kind="cast",
        family="elementwise",
        doc="convert to attr dtype.",
        min_inputs=1,
        max_inputs=1,
        infer=_cast_infer,
        numpy_impl=_cast_np,
    )
)
