"""Verifying a plan in its own mixed precision (bf16 with fp32 masters) against one device.

What it is for: `shardlab verify --dtype bfloat16 --backend torch` runs every rank in the
dtypes the graph declares (`runtime.torch_device`, precision "graph": a bfloat16 model's
params, activations and gradients in bfloat16, its master weights and Adam moments in
float32), as a bf16 training run does. numpy has no bfloat16, so the single-device
reference runs in float32 from the same starting point, and the comparison must tell the
rounding of bfloat16 (eps 2^-8 per op, about 1% after a few layers) from a broken plan
(errors of order one):

- `reference_env`: the reference's sources are drawn in float32 and every source declared
  16-bit is rounded to that dtype first (a master weight stays its rounded param's copy),
  so both sides start from the very same values;
- every op (forward, backward, optimizer) is compared with itself computed exactly in
  float32 on the run's own inputs (`local_outputs`, `check_local`, `LOCAL_RTOL`): the
  difference is that one op's rounding, so a broken kernel shows at its op;
- the loss of the whole step is compared with the float32 reference's (`check_end_to_end`,
  `MIXED_RTOL`).
Both comparisons are NORMWISE, `||got - want||_2 <= rtol * ||want||_2`
(`compare_normwise`): elementwise tolerances do not fit bfloat16, where a sum that cancels
(a key bias's gradient, zero in exact arithmetic) has no correct digit and is harmless.

The tolerances are measured, not guessed: `tests/shardlab/runtime/test_mixed_precision.py`
runs tiny GPT and Llama plans (dp, tp, tp+sp, fsdp, zero2, pp) in bf16 and finds their
largest op-local error below half of `LOCAL_RTOL`, and a kernel 2% off above it.
"""

from __future__ import annotations

import numpy as np

from shardlab.errors import ExecutionError
from shardlab.ir import Graph, Op, TensorType
from shardlab.ops.base import Array
from shardlab.program import DistOp
from shardlab.runtime.reference import make_feeds, run_op, run_reference

#: The verification compute dtype meaning "the graph's own mixed precision".
MIXED_DTYPE = "bfloat16"
#: The dtype the single-device reference runs in for a mixed-precision verification.
REFERENCE_DTYPE = "float32"
#: Normwise relative tolerance of one op of a bf16 run against the same op computed exactly
#: on the run's own inputs (module doc): a few roundings of its output (2^-9 each).
LOCAL_RTOL = 1e-2
#: Normwise relative tolerance of the loss of a bf16 step against the float32 reference's.
MIXED_RTOL = 2e-2


def precision_of(compute_dtype: str | None) -> str:
    """The precision the torch backend's ranks run in for a verification's or measurement's
    `compute_dtype` (`runtime.torch_device`: "graph" for bfloat16, else "compute")."""
    return "graph" if compute_dtype == MIXED_DTYPE else "compute"


def check_mixed(graph: Graph, backend: str) -> None:
    """ExecutionError unless a mixed-precision verification can run: the torch backend
    (numpy has no bfloat16) and a graph that declares 16-bit floats to run in."""
    if backend != "torch":
        raise ExecutionError(
            f"compute dtype {MIXED_DTYPE!r} runs the graph's own mixed precision on real ranks: "
            f"use --backend torch (the {backend!r} backend computes in numpy float64/float32)",
            dtype=MIXED_DTYPE,
            backend=backend,
        )
    if not any(v.type.dtype in ("bfloat16", "float16") for v in graph.values.values()):
        raise ExecutionError(
            f"compute dtype {MIXED_DTYPE!r} runs the dtypes the graph declares, and graph "
            f"{graph.name!r} declares no 16-bit floats: build it in bfloat16 (for a preset, "
            "--set dtype=bfloat16) or verify in float32",
            dtype=MIXED_DTYPE,
            graph=graph.name,
        )


def round_to(x: Array, dtype: str) -> Array:
    """float32 `x` rounded to the nearest value of `dtype` (bfloat16: round half to even on
    the upper 16 bits; float16 through numpy), still as float32."""
    x = np.asarray(x, dtype=np.float32)
    if dtype == "float16":
        return x.astype(np.float16).astype(np.float32)
    if dtype != "bfloat16":
        return x
    bits = x.view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return rounded.astype(np.uint32).view(np.float32).reshape(x.shape)


def reference_env(graph: Graph, seed: int) -> dict[str, Array]:
    """Every value of `graph` on one device in float32, from sources rounded to their
    declared 16-bit dtypes (module doc)."""
    feeds = make_feeds(graph, seed, REFERENCE_DTYPE)
    for name, data in feeds.items():
        feeds[name] = round_to(data, graph.value(name).type.dtype)
    for master, param in graph.meta.get("master_weights", {}).items():
        feeds[master] = feeds[param].copy()
    return run_reference(graph, feeds, seed=seed, compute_dtype=REFERENCE_DTYPE)


def compare_normwise(
    got: Array, want: Array, rtol: float = MIXED_RTOL
) -> tuple[float, float, bool]:
    """(largest abs error, normwise relative error, ok) of `got` against `want` (module doc)."""
    g, w = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    diff = g - w
    max_abs = float(np.max(np.abs(diff), initial=0.0))
    scale = float(np.linalg.norm(w))
    error = float(np.linalg.norm(diff))
    rel = error / scale if scale > 0 else (0.0 if error == 0 else float("inf"))
    return max_abs, rel, bool(error <= rtol * scale)


def local_outputs(op: Op | DistOp, inputs: list[Array], out_types: list[TensorType]) -> list[Array]:
    """`op` on one device in float32, applied to the distributed run's own inputs: what its
    outputs would be if this op alone ran exactly (module doc, `check_local`)."""
    args = [np.asarray(x, dtype=np.float32) if np.asarray(x).dtype.kind == "f" else x
            for x in inputs]  # fmt: skip
    return run_op(op, args, out_types, REFERENCE_DTYPE)  # type: ignore[arg-type]


def check_local(got: Array, local: Array) -> tuple[float, float, bool]:
    """(largest abs error, normwise relative error, ok) of an op's output in the bf16 run
    against the same op computed exactly on the run's own inputs (`LOCAL_RTOL`)."""
    return compare_normwise(got, local, LOCAL_RTOL)


def check_end_to_end(got: Array, want: Array) -> tuple[float, float, bool]:
    """(largest abs error, normwise relative error, ok) of a value after the whole bf16 step
    (the loss) against the float32 reference's (`MIXED_RTOL`)."""
    return compare_normwise(got, want, MIXED_RTOL)
