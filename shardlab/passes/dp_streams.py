"""Which stream the data-parallel passes put the ops they move on, and which they leave.

Why: ops of one stream run in program order, so an op that waits for a late dependency
holds every op queued behind it on its stream (CUDA streams do the same). On llama3-8b
dp=8,tp=8 with sequence parallelism (h100-sxm-8x8) the lowered step was 2608.5 ms; fusion
made it 2872.4 ms and overlap 2844.2 ms (exposed comm 383 -> 648 ms). Not because of
pack/unpack (views of one gradient buffer: they move no data) nor of coarser buckets (with
buckets of 1 to 256 MiB fusion gave 2865 to 2883 ms alike), but of two stream stalls:

- the `local_slice` steps that cut a tensor-parallel gradient before its dp all-reduce sit
  on the `comm:tp` stream; moved up to right after their gradient, each held that stream
  until the gradient existed, and the sequence-parallel all-gathers that the backward needs
  next (issued early until then) queued behind it: +0.7 ms per all-gather, 302 ms per step.
  A local step talks to nobody (a kernel or a view of the rank's own block; no framework
  issues it on its NCCL stream), so the steps these passes move run on the compute stream;
- `dp_overlap` moved up every step of a gradient's reshard chain, including the second step
  of `reduce_scatter` on dp -> `all_reduce` on tp -> `all_gather` on dp (the norm weights'
  gradients, partial on both axes): the tp all-reduce then held `comm:tp` until the dp
  stream reached its reduce-scatter, behind whole buckets (+100 ms). A step that reads the
  output of a collective on another comm stream now stays where lowering put it.

With the first fix fusion gives 2595.7 ms (25 MiB buckets); with both, overlap then gives
2516.8 ms (exposed comm 383 -> 288 ms).
The pass manager's cost guard (`passes.guard`) declines any pass that still makes a costed
plan slower and picks `bucket_mb` by cost when the user sets none.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from shardlab.program import DistOp

#: Comm steps that talk to nobody: each rank cuts or rescales its own block.
LOCAL_STEPS = frozenset({"local_slice", "local_partial"})
COMPUTE_STREAM = "compute"


def is_local_step(op: DistOp) -> bool:
    """True for a comm step that talks to nobody (`local_slice`, `local_partial`)."""
    return op.comm is not None and op.comm.kind in LOCAL_STEPS


def local_on_compute(op: DistOp) -> DistOp:
    """A local step the passes move next to its gradient runs on the compute stream.

    It is a slice of the rank's own block (a kernel or a view), not communication; left on
    its axis's comm stream after moving up, it would hold that in-order stream until its
    gradient exists and stall the unrelated all-gathers queued behind it (module docstring).
    """
    return replace(op, stream=COMPUTE_STREAM) if is_local_step(op) else op


def waits_on_other_comm_stream(op: DistOp, made_by: Mapping[str, DistOp]) -> bool:
    """True when a comm step reads the output of a collective on another comm stream (the
    second step of a chain such as reduce_scatter on dp -> all_reduce on tp): moved up, it
    would hold its own stream until the other stream's queue reaches that collective."""
    if op.comm is None:
        return False
    for v in op.inputs:
        src = made_by.get(v)
        if src is not None and src.is_collective and src.stream != op.stream:
            return True
    return False
