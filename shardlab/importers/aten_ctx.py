"""What every ATen mapping shares: the `Ctx` of one FX node, `Unmapped`, dtype helpers.

A mapping (`aten_ops`) reads its node's arguments with graph values as their names (`str`),
constants as CPU tensors and the rest as Python values; `Ctx` turns constants into catalog
ops (`Ctx.val`), names ops after the node's module scope and makes opaque ops of what
cannot be mapped (`Ctx.opaque`). Nothing here imports torch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from shardlab.errors import ModelImportError
from shardlab.importers.emit import GraphEmitter
from shardlab.ir import TensorType

DTYPES = {
    "torch.float32": "float32",
    "torch.float16": "float16",
    "torch.bfloat16": "bfloat16",
    "torch.int64": "int64",
    "torch.int32": "int32",
    "torch.bool": "bool",
}
#: Ops that read a tensor only for its shape and dtype (evaluated as constants).
METADATA_OPS = frozenset({"aten.new_ones", "aten.new_zeros", "aten.new_full", "aten.new_empty",
                          "aten.ones_like", "aten.zeros_like", "aten.full_like",
                          "aten.empty_like", "aten.sym_size", "aten.sym_numel"})  # fmt: skip


class Unmapped(Exception):
    """This node cannot be written with catalog ops (the reason says why)."""


def packet_name(target: Any) -> str:
    """`aten.add` for the overload `aten.add.Tensor`; the callable's name otherwise."""
    overload = getattr(target, "_overloadpacket", None)
    if overload is not None:
        return f"{overload._qualified_op_name.replace('::', '.')}"
    return getattr(target, "__name__", str(target))


def is_metadata_op(target: str) -> bool:
    return target in METADATA_OPS


def shardlab_dtype(dtype: Any, where: str) -> str:
    """The Shardlab dtype of a torch dtype; ModelImportError naming `where` otherwise."""
    out = DTYPES.get(str(dtype))
    if out is None:
        raise ModelImportError(
            f"{where} has dtype {dtype}, which Shardlab does not support; use one of "
            f"{', '.join(d.removeprefix('torch.') for d in DTYPES)}",
            value=where,
        )
    return out


def tensor_type(val: Any, where: str) -> TensorType:
    return TensorType(tuple(int(d) for d in val.shape), shardlab_dtype(val.dtype, where))


def is_const(ref: Any) -> bool:
    """A constant tensor (a CPU torch tensor) rather than a graph value or a Python value."""
    return hasattr(ref, "numpy") and hasattr(ref, "shape")


@dataclass
class Ctx:
    """What a mapping needs to emit the ops of one FX node."""

    out: GraphEmitter
    node: Any
    scope: str
    target: str

    @property
    def local(self) -> str:
        return self.target.rsplit(".", 1)[-1].lstrip("_")

    def out_type(self, i: int = 0) -> TensorType:
        val = self.node.meta.get("val")
        if isinstance(val, list | tuple):
            val = val[i]
        return tensor_type(val, f"{self.scope}.{self.node.name}".lstrip("."))

    def emit(self, kind: str, inputs: Sequence[str], attrs: dict[str, Any] | None = None,
             local: str | None = None, **kw: Any) -> str:  # fmt: skip
        return self.out.one(kind, inputs, attrs, self.scope, local or self.local, **kw)

    def type(self, ref: str) -> TensorType:
        return self.out.type_of(ref)

    def scalar(self, ref: Any) -> float | None:
        """A Python number, or a one-element constant tensor, as a float; else None."""
        if isinstance(ref, bool):
            return float(ref)
        if isinstance(ref, int | float):
            return float(ref)
        if is_const(ref) and ref.numel() == 1:
            return float(ref.reshape(()).item())
        return None

    def val(self, ref: Any, dtype: str | None = None) -> str:
        """A graph value for `ref` (a constant becomes catalog ops), cast to `dtype`."""
        if isinstance(ref, str):
            name = ref
        elif is_const(ref):
            const_dtype = dtype or shardlab_dtype(ref.dtype, self.node.name)
            array = ref.detach().to("cpu").double().numpy() if ref.is_floating_point() else (
                ref.detach().to("cpu").numpy())  # fmt: skip
            label = f"{self.scope}.{self.node.name}" if self.scope else self.node.name
            name = self.out.constant(array, const_dtype, label)
        elif isinstance(ref, int | float):
            return self.out.scalar(float(ref), dtype or "float32")
        else:
            raise Unmapped(f"an argument of type {type(ref).__name__} where a tensor goes")
        if dtype is not None and self.type(name).dtype != dtype:
            name = self.emit("cast", [name], {"dtype": dtype}, "cast")
        return name

    def reshape(self, ref: str, shape: Sequence[int]) -> str:
        if tuple(shape) == self.type(ref).shape:
            return ref
        return self.emit("reshape", [ref], {"shape": list(shape)}, "view")

    def opaque(self, refs: Sequence[Any], reason: str) -> Any:
        """The node as an opaque op reading the graph values among `refs`."""
        val = self.node.meta.get("val")
        many = isinstance(val, list | tuple)
        vals = list(val) if many else [val]
        if any(v is None or not hasattr(v, "shape") for v in vals):
            raise ModelImportError(
                f"{self.target} at {self.node.name!r} ({self.scope or 'top level'}) has no "
                f"mapping ({reason}) and returns no tensor to stand in for",
                op=self.target,
            )
        types = [self.out_type(i) for i in range(len(vals))]
        inputs = list(dict.fromkeys(r for r in refs if isinstance(r, str)))
        outs = self.out.emit_opaque(inputs, types, self.scope, self.local, str(self.node.target),
                                    reason)  # fmt: skip
        return outs if many else outs[0]


Mapping = Callable[[Ctx, tuple[Any, ...], dict[str, Any]], Any]


def arg(args: Sequence[Any], kwargs: dict[str, Any], i: int, key: str, default: Any) -> Any:
    if len(args) > i:
        return args[i]
    return kwargs.get(key, default)


def tensor_arg(ref: Any, what: str) -> str:
    if not isinstance(ref, str):
        raise Unmapped(f"{what} is not a tensor the graph computes")
    return ref
