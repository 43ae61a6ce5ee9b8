"""A model's headline figures: parameters, FLOPs, layers, ops by kind."""

from __future__ import annotations

from typing import Any

from shardlab.ir import Graph, ValueKind
from shardlab.repeats import layer_indices


def count_layers(graph: Graph) -> int:
    """Number of distinct numbered layers: `layers.N` in presets, `model.layers.N` or
    `transformer.h.N` in imported models (0 for a model without them)."""
    return max((len(indices) for indices in layer_indices(graph).values()), default=0)


def model_summary(graph: Graph) -> dict[str, Any]:
    """The figures `shardlab show` and the API report for a graph."""
    return {
        "name": graph.name,
        "params": graph.num_params(),
        "param_bytes": sum(
            v.type.nbytes
            for v in graph.values_of_kind(ValueKind.PARAM)
            if not graph.producer(v.name)
        ),
        "flops_forward": graph.flops(),
        "layers": count_layers(graph),
        "ops": len(graph.ops),
        "values": len(graph.values),
        "ops_by_kind": graph.ops_by_kind(),
        "inputs": {v.name: str(v.type) for v in graph.values_of_kind(ValueKind.INPUT)},
        "outputs": list(graph.outputs),
        "config": graph.meta.get("config", {}),
    }


def human(n: float, unit: str = "") -> str:
    """1234567 -> '1.23M' (SI prefixes up to peta); bytes (`unit` "B") in binary units, as
    the UI shows them (`human_bytes`)."""
    if unit == "B":
        return human_bytes(n)
    for prefix, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.3g}{'B' if prefix == 'G' and not unit else prefix}{unit}"
    return f"{n:g}{unit}"


def human_bytes(n: float, signed: bool = False) -> str:
    """Bytes in binary units, four digits: 79999999999 -> '74.51 GiB', 8192 -> '8 KiB'."""
    sign = "+" if signed and n > 0 else ""
    for name, scale in (("PiB", 1 << 50), ("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20),
                        ("KiB", 1 << 10)):  # fmt: skip
        if abs(n) >= scale:
            return f"{sign}{n / scale:.4g} {name}"
    return f"{sign}{n:.0f} B"
