"""A plan as torchtitan configuration for releases before 0.3: the `[parallelism]` and
`[activation_checkpoint]` TOML.

What it is for: `shardlab export-plan --format torchtitan-toml` writes the part of a
torchtitan job config (`--job.config_file`, torchtitan 0.1/0.2; 0.3 reads no TOML:
`export.torchtitan` writes its command line) that says how to parallelize, from the same
per-axis roles the DTensor export decides (`export.dtensor.derive_export`, read off the
plan's placements):

- `data_parallel_shard_degree`: the FSDP axis's size (1 without one);
  `data_parallel_replicate_degree`: the data axes' sizes multiplied (HSDP with both);
  `tensor_parallel_degree`: the tensor-parallel axis's size (torchtitan applies sequence
  parallelism with it; a plan without it says so in a comment); `disable_loss_parallel`:
  whether the plan gathers the logits before the loss (else the loss is vocab-parallel);
- `pipeline_parallel_degree`, `pipeline_parallel_schedule` (`GPipe`, `1F1B`,
  `Interleaved1F1B`), `pipeline_parallel_microbatch_size` (the local batch over the
  micro-batches) and `module_fqns_per_model_part` (each model chunk's modules, the plan's
  FQNs) on a mesh with a `pp` axis;
- `[activation_checkpoint] mode`: the plan's recomputation (`none`, `selective` with
  `selective_ac_option = "op"`, `full`);
- `[training] local_batch_size` and `seq_len` from the model's token input.

Comments carry what torchtitan cannot say (ZeRO-1/2, an idle axis, a mesh order other than
torchtitan's `pp, dp_replicate, dp_shard, tp`). Text only: no torch, no toml library.
"""

from __future__ import annotations

import math

from shardlab.export.dtensor import IDLE, derive_export
from shardlab.export.literals import comment_text, toml_str
from shardlab.export.parameters import PIPELINE_AXIS, ExportError
from shardlab.export.torchtitan import (
    SCHEDULE_NAMES,
    TORCHTITAN_ORDER,
    batch_and_seq,
    mesh_out_of_order,
    microbatch_size,
    model_parts,
)
from shardlab.plan import Plan


def _toml(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, str):
        return toml_str(value)
    return str(value)


def render_torchtitan_toml(plan: Plan) -> str:
    """The TOML sections (module docstring), ending in one newline."""
    export = derive_export(plan)
    sizes = dict(zip(export.mesh_axes, export.mesh_shape, strict=True))
    shard = sizes[export.fsdp_axis] if export.fsdp_axis else 1
    replicate = math.prod(sizes[a] for a in export.data_axes)
    tp = sizes[export.tp_axis] if export.tp_axis else 1
    pp = sizes.get(PIPELINE_AXIS, 1)
    batch, seq = batch_and_seq(plan)
    if batch % (shard * replicate):
        raise ExportError(
            f"the global batch {batch} does not divide over the {shard * replicate} "
            "data-parallel ranks",
            batch=batch,
        )
    local = batch // (shard * replicate)
    # user text (annotation globs, value and axis names) only through `comment_text`
    comments = [f"# Shardlab plan: {comment_text(plan.strategy.describe())}",
                *(f"# {comment_text(n)}." for n in export.notes)]  # fmt: skip
    roles = {a: r for a, r in export.roles.items()}
    comments += [f"# mesh axis {comment_text(repr(a))} is idle (no placement uses it)."
                 for a, r in roles.items() if r == IDLE]  # fmt: skip
    if mesh_out_of_order(export, TORCHTITAN_ORDER, inner_first=False):
        comments.append(
            f"# the plan's mesh order ({comment_text(', '.join(export.mesh_axes))}) differs "
            "from torchtitan's "
            "(pp, dp_replicate, dp_shard, tp): ranks are grouped differently."
        )
    if export.tp_axis is not None and not export.sequence_parallel:
        comments.append(
            "# torchtitan's tensor parallelism includes sequence parallelism; this plan has none."
        )
    par: list[tuple[str, object]] = [
        ("data_parallel_replicate_degree", replicate),
        ("data_parallel_shard_degree", shard),
        ("tensor_parallel_degree", tp),
        ("disable_loss_parallel", export.loss_gathered),
        ("pipeline_parallel_degree", pp),
    ]
    if plan.pipeline is not None:
        options = plan.pipeline.options
        micro = microbatch_size(local, options.microbatches)
        par += [
            ("pipeline_parallel_schedule", SCHEDULE_NAMES[options.schedule]),
            ("pipeline_parallel_microbatch_size", micro),
            ("module_fqns_per_model_part", model_parts(plan, export)),
        ]
    lines = [*comments, "", "[training]", f"local_batch_size = {local}"]
    if seq is not None:
        lines.append(f"seq_len = {seq}")
    lines += ["", "[parallelism]", *(f"{k} = {_toml(v)}" for k, v in par), ""]
    lines += ["[activation_checkpoint]", f"mode = {_toml(export.recompute)}"]
    if export.recompute == "selective":
        lines.append('selective_ac_option = "op"')
    return "\n".join(lines) + "\n"
