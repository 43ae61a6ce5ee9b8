"""`opaque(*inputs)`: an op the catalog does not know, described by what it declares.

Attrs:
- `output_types` (required): a non-empty list of {"shape": [...], "dtype": "..."}; shape
  inference returns exactly these, so the graph validator compares them with the declared
  output values.
- `name`: the foreign op's name (for messages and views).
- `flops`: its FLOP count (an integer >= 0, default 0).
- `reference`: a numpy stand-in for running it, one of "identity", "tanh", "sigmoid",
  "relu", "square" (applied to input 0) or "sum_inputs" (all inputs added, broadcasting).
  Only a single output is supported with a reference. Without one, executing the op raises
  `ExecutionError`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import numpy as np

from shardlab.errors import ExecutionError, OpSignatureError
from shardlab.ir import DTYPE_BYTES, TensorType
from shardlab.ops.base import (
    Array,
    Attrs,
    OpDef,
    attr_int,
    attr_str,
    broadcast_shapes,
    register,
)
from shardlab.ops.elementwise import sigmoid

#: reference name -> its numpy function of all inputs.
REFERENCES: dict[str, Callable[[Sequence[Array]], Array]] = {
    "identity": lambda xs: np.array(xs[0]),
    "tanh": lambda xs: np.tanh(xs[0]),
    "sigmoid": lambda xs: sigmoid(xs[0]),
    "relu": lambda xs: np.maximum(xs[0], 0),
    "square": lambda xs: xs[0] * xs[0],
    "sum_inputs": lambda xs: functools.reduce(np.add, xs),
}


def _output_type(i: int, spec: object) -> TensorType:
    where = f"opaque: attribute 'output_types' entry {i}"
    if not isinstance(spec, dict) or set(spec) != {"shape", "dtype"}:
        raise OpSignatureError(
            f"{where} must be an object with keys 'shape' and 'dtype', got {spec!r}",
            attr="output_types",
        )
    shape, dtype = spec["shape"], spec["dtype"]
    if not isinstance(shape, list) or any(
        isinstance(d, bool) or not isinstance(d, int) or d <= 0 for d in shape
    ):
        raise OpSignatureError(
            f"{where} has shape {shape!r}; it must be a list of positive integers",
            attr="output_types",
        )
    if dtype not in DTYPE_BYTES:
        raise OpSignatureError(
            f"{where} has unknown dtype {dtype!r}; expected one of {', '.join(DTYPE_BYTES)}",
            attr="output_types",
        )
    return TensorType(tuple(shape), dtype)


def _infer(ins: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    specs = attrs.get("output_types")
    if not isinstance(specs, list) or not specs:
        raise OpSignatureError(
            "opaque: attribute 'output_types' must be a non-empty list of "
            '{"shape": [...], "dtype": "..."}',
            attr="output_types",
        )
    outs = [_output_type(i, spec) for i, spec in enumerate(specs)]
    name = attrs.get("name")
    if name is not None and not isinstance(name, str):
        raise OpSignatureError(f"opaque: attribute 'name' must be a string, got {name!r}")
    if attr_int(attrs, "flops", 0) < 0:
        raise OpSignatureError("opaque: attribute 'flops' must be >= 0", attr="flops")
    if attrs.get("reference") is not None:
        _check_reference(ins, outs, attrs)
    return outs


def _check_reference(ins: Sequence[TensorType], outs: list[TensorType], attrs: Attrs) -> None:
    ref = attr_str(attrs, "reference", sorted(REFERENCES))
    if len(outs) != 1:
        raise OpSignatureError(
            f"opaque: attribute 'reference' supports one output, but 'output_types' has "
            f"{len(outs)}",
            attr="reference",
        )
    if not ins:
        raise OpSignatureError(f"opaque: reference {ref!r} needs at least one input")
    shape = ins[0].shape
    if ref == "sum_inputs":
        for t in ins[1:]:
            shape = broadcast_shapes(shape, t.shape, "opaque: reference 'sum_inputs'")
    if shape != outs[0].shape:
        raise OpSignatureError(
            f"opaque: reference {ref!r} gives shape {list(shape)} but 'output_types' "
            f"declares {list(outs[0].shape)}",
            attr="reference",
        )


def _flops(ins: Sequence[TensorType], outs: Sequence[TensorType], attrs: Attrs) -> int:
    return int(attrs.get("flops", 0))


def _numpy(xs: Sequence[Array], attrs: Attrs) -> list[Array]:
    label = f"opaque op {attrs['name']!r}" if attrs.get("name") else "an opaque op"
    ref = attrs.get("reference")
    if ref is None:
        raise ExecutionError(
            f"{label} has no reference implementation; set its attribute 'reference' to one "
            f"of {', '.join(map(repr, REFERENCES))}, or replace it with catalog ops"
        )
    out = np.asarray(REFERENCES[str(ref)](xs))
    want = tuple(attrs["output_types"][0]["shape"])
    if out.shape != want:
        raise ExecutionError(
            f"{label}: reference {ref!r} gives shape {list(out.shape)} but 'output_types' "
            f"declares {list(want)}"
        )
    return [out]


register(
    OpDef(
        kind="opaque",
        family="opaque",
        doc="an op the catalog does not know: declared output_types, optional name, flops "
        "and numpy reference.",
        min_inputs=0,
        max_inputs=None,
        infer=_infer,
        numpy_impl=_numpy,
        flops=_flops,
    )
)
