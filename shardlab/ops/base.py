"""What an op kind declares, and the catalog that holds every kind.

An `OpDef` states, for one op kind: shape/dtype inference, FLOPs and bytes moved, a numpy
reference implementation, and which integer inputs are indices (so seeded runs draw them in
range). Two slots are filled by later stages of the pipeline rather than here:

- `vjp`: the vector-Jacobian product that `shardlab.autodiff` turns into backward ops;
- `spmd_rule`: the sharding rule that `shardlab.spmd` applies; a kind without one gets the
  generated replicated fallback.

Family modules (`linalg`, `elementwise`, ...) call `register` at import time.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from shardlab.errors import GraphError, OpSignatureError
from shardlab.ir import TensorType

Array = npt.NDArray[Any]
Attrs = Mapping[str, Any]

#: (input types, attrs) -> output types; raises OpSignatureError on a bad signature.
InferFn = Callable[[Sequence[TensorType], Attrs], list[TensorType]]
#: (input types, output types, attrs) -> a count (FLOPs or bytes).
CountFn = Callable[[Sequence[TensorType], Sequence[TensorType], Attrs], int]
#: (input arrays, attrs) -> output arrays.
NumpyFn = Callable[[Sequence[Array], Attrs], list[Array]]
#: (input types, attrs) -> {input index: exclusive upper bound of the indices it holds}.
IndexBoundsFn = Callable[[Sequence[TensorType], Attrs], dict[int, int]]


@dataclass(frozen=True, slots=True)
class OpCost:
    """Work of one op application: floating-point operations and bytes read + written."""

    flops: int
    bytes: int


def io_bytes(ins: Sequence[TensorType], outs: Sequence[TensorType], attrs: Attrs) -> int:
    """Default bytes moved: every input read once, every output written once."""
    return sum(t.nbytes for t in ins) + sum(t.nbytes for t in outs)


def no_flops(ins: Sequence[TensorType], outs: Sequence[TensorType], attrs: Attrs) -> int:
    return 0


@dataclass(frozen=True, slots=True)
class OpDef:
    """Everything the engine knows about one op kind."""

    kind: str
    family: str
    doc: str
    min_inputs: int
    max_inputs: int | None
    infer: InferFn
    numpy_impl: NumpyFn | None
    flops: CountFn = no_flops
    bytes: CountFn = io_bytes
    index_bounds: IndexBoundsFn | None = None
    #: Filled by shardlab.autodiff (issue: training graph).
    vjp: Any = None
    #: Filled by shardlab.spmd (issue: SPMD rules); None means the replicated fallback.
    spmd_rule: Any = None

    def check_arity(self, n_inputs: int) -> None:
        if n_inputs < self.min_inputs or (
            self.max_inputs is not None and n_inputs > self.max_inputs
        ):
            if self.max_inputs is None:
                want = f"at least {self.min_inputs}"
            elif self.min_inputs == self.max_inputs:
                want = str(self.min_inputs)
            else:
                want = f"{self.min_inputs} to {self.max_inputs}"
            raise OpSignatureError(f"{self.kind} takes {want} inputs, got {n_inputs}")


_CATALOG: dict[str, OpDef] = {}


def register(opdef: OpDef) -> OpDef:
    """Add an op kind to the catalog (each kind once)."""
    assert opdef.kind not in _CATALOG, f"op kind {opdef.kind} registered twice"
    _CATALOG[opdef.kind] = opdef
    return opdef


def attach(kind: str, **slots: Any) -> None:
    """Fill later-stage slots (`vjp`, `spmd_rule`) of a registered kind."""
    _CATALOG[kind] = replace(get_op(kind), **slots)


def get_op(kind: str) -> OpDef:
    """The definition of `kind`; GraphError for a kind the catalog does not know."""
    try:
        return _CATALOG[kind]
    except KeyError:
        raise GraphError(
            f"unknown op kind {kind!r}; use kind 'opaque' with declared output types for an "
            "op the catalog does not know",
            kind=kind,
        ) from None


def all_ops() -> list[OpDef]:
    """Every registered op kind, sorted by family then kind."""
    return sorted(_CATALOG.values(), key=lambda d: (d.family, d.kind))


# -- attribute helpers: each raises OpSignatureError naming the attribute ---------------


def _required(attrs: Attrs, key: str, default: Any) -> Any:
    if key not in attrs and default is None:
        raise OpSignatureError(f"attribute {key!r} is required", attr=key)
    return attrs.get(key, default)


def attr_int(attrs: Attrs, key: str, default: int | None = None) -> int:
    val = _required(attrs, key, default)
    if isinstance(val, bool) or not isinstance(val, int):
        raise OpSignatureError(f"attribute {key!r} must be an integer, got {val!r}", attr=key)
    return val


def attr_float(attrs: Attrs, key: str, default: float | None = None) -> float:
    val = _required(attrs, key, default)
    if isinstance(val, bool) or not isinstance(val, int | float):
        raise OpSignatureError(f"attribute {key!r} must be a number, got {val!r}", attr=key)
    return float(val)


def attr_bool(attrs: Attrs, key: str, default: bool = False) -> bool:
    val = attrs.get(key, default)
    if not isinstance(val, bool):
        raise OpSignatureError(f"attribute {key!r} must be true or false, got {val!r}", attr=key)
    return val


def attr_str(attrs: Attrs, key: str, choices: Sequence[str], default: str | None = None) -> str:
    val = _required(attrs, key, default)
    if val not in choices:
        raise OpSignatureError(
            f"attribute {key!r} must be one of {', '.join(map(repr, choices))}, got {val!r}",
            attr=key,
        )
    assert isinstance(val, str)
    return val


def attr_ints(attrs: Attrs, key: str, default: Sequence[int] | None = None) -> list[int]:
    val = _required(attrs, key, default)
    if not isinstance(val, list | tuple) or any(
        isinstance(v, bool) or not isinstance(v, int) for v in val
    ):
        raise OpSignatureError(
            f"attribute {key!r} must be a list of integers, got {val!r}", attr=key
        )
    return list(val)


def normalize_dim(dim: int, rank: int, what: str = "dim") -> int:
    """Map a possibly negative dim into [0, rank); error naming it when out of range."""
    if not -rank <= dim < rank:
        raise OpSignatureError(f"{what} {dim} is out of range for a rank-{rank} input")
    return dim % rank


def same_dtype(types: Sequence[TensorType], kind: str) -> str:
    dtypes = {t.dtype for t in types}
    if len(dtypes) != 1:
        raise OpSignatureError(
            f"{kind} needs inputs of one dtype, got {', '.join(str(t) for t in types)}"
        )
    return types[0].dtype


def require_float(t: TensorType, kind: str, what: str = "input") -> None:
    if not t.is_float:
        raise OpSignatureError(f"{kind} needs a floating-point {what}, got {t}")


def broadcast_shapes(a: Sequence[int], b: Sequence[int], kind: str) -> tuple[int, ...]:
    """Numpy broadcasting of two shapes, with an error naming both."""
    try:
        return tuple(np.broadcast_shapes(tuple(a), tuple(b)))
    except ValueError:
        raise OpSignatureError(f"{kind}: shapes {list(a)} and {list(b)} do not broadcast") from None
