"""`GraphEmitter`: the values and ops an importer writes, named the way presets name theirs.

An op is named `<module path>.<local>` (`model.layers.0.self_attn.q_proj.linear`), with a
counter per module path (`add`, `add_1`, ...), so that every repeated layer names its ops
alike and `shardlab.repeats` folds them. Its single output value has the op's name.

Constants an imported program computes from shapes alone (rotary tables, scalars) become
catalog ops placed before every other op under the scope `constants` (`constants.fill`), so
they sit outside the layers, are made once and read by every layer under the same name
(`constants`). A constant no catalog op reproduces becomes an opaque op (see `opaque`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from shardlab.ir import Graph, Op, OpRole, TensorType, Value, ValueKind
from shardlab.models.builder import output_value_names
from shardlab.ops import get_op, infer_types

CONSTANT_SCOPE = "constants"


@dataclass
class OpaqueUse:
    """An op the importer could not map: where it is and what it was."""

    op: str
    target: str
    reason: str


@dataclass
class GraphEmitter:
    """Accumulates a forward graph; `build` checks and returns it."""

    name: str
    values: dict[str, Value] = field(default_factory=dict)
    ops: list[Op] = field(default_factory=list)
    constant_ops: list[Op] = field(default_factory=list)
    opaque: list[OpaqueUse] = field(default_factory=list)
    #: what a reviewer of the import should know (a dropout not modelled)
    notes: set[str] = field(default_factory=set)
    _counters: dict[str, int] = field(default_factory=dict)
    _constants: dict[Any, str] = field(default_factory=dict)

    def type_of(self, value: str) -> TensorType:
        return self.values[value].type

    def source(self, name: str, ttype: TensorType, kind: ValueKind) -> str:
        """A value no op makes: a parameter, an input, a buffer."""
        self.values[name] = Value(name, ttype, kind)
        return name

    def fresh(self, scope: str, local: str) -> str:
        """`<scope>.<local>`, with `_1`, `_2`, ... when the scope already has one."""
        base = f"{scope}.{local}" if scope else local
        n = self._counters.get(base, 0)
        self._counters[base] = n + 1
        name = base if n == 0 else f"{base}_{n}"
        while name in self.values:  # a source value already holds the name
            n = self._counters[base]
            self._counters[base] = n + 1
            name = f"{base}_{n}"
        return name

    def emit(
        self,
        kind: str,
        inputs: Sequence[str],
        attrs: dict[str, Any] | None,
        scope: str,
        local: str,
        *,
        role: OpRole = OpRole.FORWARD,
        output_names: Sequence[str] | None = None,
        constant: bool = False,
    ) -> list[str]:
        """Append an op; its output types come from the catalog (checked there)."""
        attrs = dict(attrs or {})
        out_types = infer_types(kind, [self.type_of(v) for v in inputs], attrs)
        op_name = self.fresh(scope, local)
        outs = output_value_names(op_name, len(out_types), output_names)
        for out, ttype in zip(outs, out_types, strict=True):
            self.values[out] = Value(out, ttype, ValueKind.ACTIVATION)
        op = Op(op_name, kind, tuple(inputs), tuple(outs), attrs, scope, role)
        (self.constant_ops if constant else self.ops).append(op)
        return outs

    def one(self, kind: str, inputs: Sequence[str], attrs: dict[str, Any] | None,
            scope: str, local: str, **kw: Any) -> str:  # fmt: skip
        (out,) = self.emit(kind, inputs, attrs, scope, local, **kw)
        return out

    def emit_opaque(
        self, inputs: Sequence[str], out_types: Sequence[TensorType], scope: str, local: str,
        target: str, reason: str, *, constant: bool = False,
    ) -> list[str]:  # fmt: skip
        """An opaque op with the export's output types; recorded so the import reports it."""
        attrs = {
            "name": target,
            "output_types": [{"shape": list(t.shape), "dtype": t.dtype} for t in out_types],
        }
        outs = self.emit("opaque", inputs, attrs, scope, local, constant=constant)
        self.opaque.append(OpaqueUse(outs[0].rsplit(".", 1)[0] if len(outs) > 1 else outs[0],
                                     target, reason))  # fmt: skip
        return outs

    # -- constants -------------------------------------------------------------------

    def scalar(self, value: float, dtype: str) -> str:
        """A rank-0 constant (an eps, a `1 +`), made once per (value, dtype)."""
        return self.full((), value, dtype)

    def full(self, shape: Sequence[int], value: float, dtype: str) -> str:
        key = ("fill", tuple(shape), float(value), dtype)
        if key not in self._constants:
            attrs = {"shape": list(shape), "value": float(value), "dtype": dtype}
            self._constants[key] = self.one("fill", [], attrs, CONSTANT_SCOPE, "fill",
                                            constant=True)  # fmt: skip
        return self._constants[key]

    def constant(self, array: npt.NDArray[Any], dtype: str, label: str) -> str:
        """A constant tensor as catalog ops: a fill when every element is equal, a rotary
        table (`rope_cache`, halves repeated, broadcast) when it is one; else an opaque op."""
        shape = tuple(int(d) for d in array.shape)
        if array.size and np.all(array == array.flat[0]):
            return self.full(shape, float(array.flat[0]), dtype)
        rope = _rope_table(array, dtype)
        if rope is not None:
            return self._rope_constant(shape, dtype, *rope)
        key = ("opaque", label)
        if key not in self._constants:
            self._constants[key] = self.emit_opaque(
                [], [TensorType(shape, dtype)], CONSTANT_SCOPE, "constant", label,
                "a constant tensor no catalog op reproduces", constant=True,
            )[0]  # fmt: skip
        return self._constants[key]

    def _rope_constant(self, shape: tuple[int, ...], dtype: str, which: str, theta: float) -> str:
        seq, dim = shape[-2], shape[-1]
        key = ("rope", shape, dtype, which, theta)
        if key in self._constants:
            return self._constants[key]
        cache_key = ("rope_cache", seq, dim, theta, dtype)
        if cache_key not in self._constants:
            attrs = {"seq": seq, "head_dim": dim, "theta": theta, "dtype": dtype}
            cos, _ = self.emit("rope_cache", [], attrs, CONSTANT_SCOPE, "rope",
                               output_names=["cos", "sin"], constant=True)  # fmt: skip
            self._constants[cache_key] = cos
        half = self._constants[cache_key]
        if which == "sin":
            half = half[: -len("cos")] + "sin"
        s = CONSTANT_SCOPE
        full = self.one("concat", [half, half], {"dim": 1}, s, f"rope_{which}", constant=True)
        lead = [1] * (len(shape) - 2)
        out = self.one("reshape", [full], {"shape": [*lead, seq, dim]}, s, f"rope_{which}_view",
                       constant=True)  # fmt: skip
        if any(d != 1 for d in shape[:-2]):
            out = self.one("broadcast_to", [out], {"shape": list(shape)}, s,
                           f"rope_{which}_expand", constant=True)  # fmt: skip
        self._constants[key] = out
        return out

    def build(self, outputs: Sequence[str], meta: dict[str, Any]) -> Graph:
        return Graph(self.values.values(), [*self.constant_ops, *self.ops], name=self.name,
                     outputs=outputs, meta=meta)  # fmt: skip


#: half an ulp of 1.0 (unit roundoff) of each float dtype a table may be stored in
_ROUNDOFF = {"float32": 2.0**-24, "bfloat16": 2.0**-9, "float16": 2.0**-11}


def _rope_table(array: npt.NDArray[Any], dtype: str) -> tuple[str, float] | None:
    """("cos" | "sin", theta) when `array` [..., seq, dim] is a rotary table as Hugging Face
    models make it (the `dim / 2` frequencies repeated in both halves, the same for every
    leading index), checked against the catalog's `rope_cache`: theta is estimated from the
    table, then the roundest number near the estimate that reproduces the table is taken
    (the config's `500000`, not its float32 or bf16 echo)."""
    if array.ndim < 2 or array.shape[-2] < 2 or array.shape[-1] < 4 or array.shape[-1] % 2:
        return None
    table = np.asarray(array, dtype=np.float64).reshape(-1, *array.shape[-2:])
    if not np.allclose(table, table[:1]):
        return None
    table = table[0]
    seq, dim = table.shape
    half = dim // 2
    if not np.allclose(table[:, :half], table[:, half:]):
        return None
    if np.allclose(table[0], 1.0):
        which = "cos"
    elif np.allclose(table[0], 0.0):
        which = "sin"
    else:
        return None
    estimate = _theta_estimate(table[:, :half], which, dim)
    if estimate is None:
        return None
    # torch makes the angles (position x frequency) in float32: an angle near `seq` is off
    # by up to a few of its ulps, so long tables differ from the float64 catalog by that
    # much; a bf16 model's table is then rounded to bf16 (Llama casts cos/sin to x's dtype)
    atol = max(1e-4, 8 * seq * float(np.finfo(np.float32).eps), 2 * _ROUNDOFF.get(dtype, 0.0))
    numpy_impl = get_op("rope_cache").numpy_impl
    assert numpy_impl is not None
    for digits in range(1, 7):
        theta = float(f"{estimate:.{digits}g}")
        cos, sin = numpy_impl([], {"seq": seq, "head_dim": dim, "theta": theta})
        if np.allclose(cos if which == "cos" else sin, table[:, :half], atol=atol):
            return which, theta
    return None


def _theta_estimate(table: npt.NDArray[np.float64], which: str, dim: int) -> float | None:
    """Theta of a rotary half-table [seq, dim / 2] (frequency j is theta^(-2j/dim)), read
    where it is best conditioned: the highest frequency index whose angle passes 1 radian
    (cos) or 0.5 radian (sin) within the table, at the first position it does, so the
    angle is known to a rounding of the table and divided by a large position."""
    threshold = 1.0 if which == "cos" else 0.5
    for j in range(table.shape[1] - 1, 0, -1):
        column = table[:, j]
        past = np.nonzero(column <= math.cos(threshold) if which == "cos"
                          else column >= math.sin(threshold))[0]  # fmt: skip
        if not past.size or past[0] == 0:
            continue
        position = int(past[0])
        value = float(np.clip(column[position], -1, 1))
        angle = math.acos(value) if which == "cos" else math.asin(value)
        frequency = angle / position
        if not 0 < frequency < 1:
            return None
        theta = frequency ** (-dim / (2 * j))
        return theta if math.isfinite(theta) and theta > 1 else None
    return None
