"""Optimization passes over a lowered `DistProgram`, run in order by `passes.manager`.

A pass is a pure function `(program, training graph, options) -> PassResult`: a new program
(the input is never changed) and a summary of what it changed: counts before and after, which
values, why, and a one-line `message` the UI shows next to the timing delta of the pass.

- `data_parallel` (seed 002): `dp_grad_scaling` folds gradient scale ops into the loss
  gradient, `dp_fuse_allreduce` fuses gradient all-reduces into buckets (pack -> all_reduce
  -> unpack), `dp_overlap` issues them as soon as their gradients are ready.
- `pipeline` (seed 001): stages, schedules, send / wait.
"""

from shardlab.passes.data_parallel import dp_fuse_allreduce, dp_grad_scaling, dp_overlap

__all__ = ["dp_fuse_allreduce", "dp_grad_scaling", "dp_overlap"]
