"""`GraphBuilder`: write a forward graph the way a module's forward() reads.

Ops get their output types from the op catalog, so a built graph is valid by construction.
Names follow module paths: inside `with b.scope("layers.0"), b.scope("attn")`, the param
`weight` is `layers.0.attn.weight` and an op named `q_reshape` is `layers.0.attn.q_reshape`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from shardlab.ir import Graph, Op, OpRole, TensorType, Value, ValueKind
from shardlab.ops import infer_types


def output_value_names(op_name: str, count: int, names: Sequence[str] | None = None) -> list[str]:
    """The names of an op's outputs: `<op>` for one unnamed output, else `<op>.<names[i]>`
    (or `<op>.<i>`)."""
    if count == 1 and names is None:
        return [op_name]
    return [f"{op_name}.{s}" for s in (names or [str(i) for i in range(count)])]


class GraphBuilder:
    """Accumulates values and ops under a stack of module scopes."""

    def __init__(self, name: str, meta: dict[str, Any] | None = None) -> None:
        self.name = name
        self.meta = dict(meta or {})
        self._values: dict[str, Value] = {}
        self._ops: list[Op] = []
        self._scope: list[str] = []

    @contextmanager
    def scope(self, name: str) -> Iterator[None]:
        """Enter a sub-module; names created inside are prefixed with its path."""
        self._scope.append(name)
        try:
            yield
        finally:
            self._scope.pop()

    @property
    def path(self) -> str:
        return ".".join(self._scope)

    def _qualify(self, local: str | None) -> str:
        parts = [*self._scope, local] if local else list(self._scope)
        assert parts, "a name outside every scope needs a local part"
        return ".".join(parts)

    def _add_value(self, name: str, ttype: TensorType, kind: ValueKind) -> str:
        assert name not in self._values, f"value {name} defined twice"
        self._values[name] = Value(name, ttype, kind)
        return name

    def type_of(self, value: str) -> TensorType:
        return self._values[value].type

    def input(self, name: str, shape: Sequence[int], dtype: str = "float32") -> str:
        """A graph input, named without the scope prefix."""
        return self._add_value(name, TensorType(tuple(shape), dtype), ValueKind.INPUT)

    def param(self, local: str, shape: Sequence[int], dtype: str) -> str:
        """A trainable parameter, named `<scope>.<local>`."""
        return self._add_value(
            self._qualify(local), TensorType(tuple(shape), dtype), ValueKind.PARAM
        )

    def ops(
        self,
        kind: str,
        inputs: Sequence[str],
        name: str | None = None,
        attrs: dict[str, Any] | None = None,
        *,
        role: OpRole = OpRole.FORWARD,
        output_names: Sequence[str] | None = None,
        output_kind: ValueKind = ValueKind.ACTIVATION,
    ) -> list[str]:
        """Append an op named `<scope>.<name>` (or the scope path itself if `name` is None).

        Outputs are named after the op (`<op>` for one output, `<op>.<output_names[i]>` or
        `<op>.<i>` for several). Returns the output value names.
        """
        op_name = self._qualify(name)
        attrs = dict(attrs or {})
        out_types = infer_types(kind, [self.type_of(v) for v in inputs], attrs)
        outs = output_value_names(op_name, len(out_types), output_names)
        for out, ttype in zip(outs, out_types, strict=True):
            self._add_value(out, ttype, output_kind)
        self._ops.append(Op(op_name, kind, tuple(inputs), tuple(outs), attrs, self.path, role))
        return outs

    def op(
        self,
        kind: str,
        inputs: Sequence[str],
        name: str | None = None,
        attrs: dict[str, Any] | None = None,
        *,
        role: OpRole = OpRole.FORWARD,
    ) -> str:
        """`ops` for the common single-output case."""
        (out,) = self.ops(kind, inputs, name, attrs, role=role)
        return out

    def linear(self, x: str, module: str, n_in: int, n_out: int, *, bias: bool, dtype: str) -> str:
        """A `linear` module: params `<module>.weight` [in, out] (and `.bias` [out])."""
        with self.scope(module):
            params = [self.param("weight", (n_in, n_out), dtype)]
            if bias:
                params.append(self.param("bias", (n_out,), dtype))
            return self.op("linear", [x, *params])

    def build(self, outputs: Sequence[str]) -> Graph:
        return Graph(
            self._values.values(), self._ops, name=self.name, outputs=outputs, meta=self.meta
        )
