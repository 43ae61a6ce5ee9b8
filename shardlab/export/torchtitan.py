"""A plan as a torchtitan 0.3 run: the command-line arguments `torchtitan.train` takes.

What it is for: `shardlab export-plan --format torchtitan` writes how torchtitan should run
the plan. torchtitan 0.3 reads no TOML: a run is a config function of a model module
(`--module llama3 --config llama3_8b`) plus command-line overrides
(`--parallelism.tensor_parallel_degree 4`), parsed and checked by its own
`torchtitan.config.ConfigManager` (tyro). So the export is that argument list, one option
(with its value) per line after `#` comment lines, ready for the shell:

    torchrun --nproc_per_node=8 -m torchtitan.train $(grep -v '^#' plan_torchtitan.args)

A config function (`config_registry`) would need Python that builds torchtitan's model
and trainer configs, which changes between its releases; the overrides are what its own
scripts and tests pass (`./run_train.sh --parallelism.tensor_parallel_degree 2`), and a test
parses every export with ConfigManager itself. The argument values are torchtitan's
vocabulary only (degrees, sizes, schedule and module names): user text (model, value and
axis names) reaches the file only in comments (`literals.comment_text`), and every
argument is quoted by `literals.sh_arg` all the same.

What is written, from the per-axis roles the DTensor export decides
(`export.dtensor.derive_export`, read off the plan's placements):

- `--module llama3` and the config whose model has the plan's shape (`LLAMA3_CONFIGS`:
  layers, hidden, heads, kv heads, ffn, vocab); a Llama-family model of another shape gets
  `llama3_debugmodel` and a note (torchtitan 0.3 takes the shape from the config function,
  not from the command line). Other models are refused: torchtitan has no module for GPT-2
  or Megatron's GPT, and an imported graph does not say which torchtitan module holds it.
- `--training.local_batch_size` (per data-parallel rank and accumulation step),
  `--training.global_batch_size` (the plan's batch: torchtitan accumulates gradients over
  global / (local x data-parallel ranks) steps, the plan's accumulated micro-batches),
  `--training.seq_len`, `--training.mixed_precision_param` (the parameters' dtype; 16-bit
  parameters without float32 masters: `--training.dtype bfloat16`).
- `--parallelism.data_parallel_replicate_degree` (data axes), `data_parallel_shard_degree`
  (the FSDP axis), `tensor_parallel_degree`, `enable_sequence_parallel` (a boolean flag:
  `--parallelism.no_enable_sequence_parallel` when the plan keeps activations replicated),
  `context_parallel_degree 1`, `pipeline_parallel_degree`; on a `pp` axis
  `pipeline_parallel_schedule` (`GPipe`, `1F1B`, `Interleaved1F1B`),
  `pipeline_parallel_microbatch_size` and `module_fqns_per_model_part`, in torchtitan's
  llama3 module names (`tok_embeddings`, `layers.<i>`, `norm`, `lm_head`: the plan's
  embedding, layers, final norm and head, matched by what reads their parameters, never by
  their names), and `--training.disable_cuda_graphs` (ConfigManager refuses pipeline
  parallelism with CUDA graphs, which 0.3 enables by default).
- the activation-checkpointing subcommand, last: `activation-checkpoint:none`, `:full`, or
  `:selective` (torchtitan's per-op selective checkpointing; the config functions default
  to it, so it is always written).

Mapped, with a note (`TorchtitanRun.notes`): data parallelism without FSDP (DDP, also beside
tensor parallelism) is `data_parallel_replicate_degree` with shard degree 1, which torchtitan
0.3 runs as `fully_shard` over a size-1 shard axis: parameters replicated, gradients
all-reduced over the replicate axis, as DDP does; ZeRO-1/2 on an axis is
`data_parallel_shard_degree` with `--parallelism.fsdp_reshard_after_forward never` (one
parameter gather per step and a gradient reduce-scatter, as ZeRO-2 moves them; the
parameters are sharded between steps where the plan keeps them whole). Said in notes too:
torchtitan's loss is vocab-parallel under tensor parallelism, and it reduces gradients in
float32. Refused (`ExportError`): two sharding axes (FSDP and ZeRO), a batch that does not
divide.
"""

from __future__ import annotations

import math
from typing import Any

from shardlab.export.arguments import ArgumentFile
from shardlab.export.dtensor import (
    DATA,
    FSDP,
    TENSOR,
    ZERO_STATE_ONLY,
    DTensorExport,
    derive_export,
)
from shardlab.export.parameters import EMBEDDING, LINEAR, NORM, PIPELINE_AXIS, ExportError
from shardlab.ir import ValueKind
from shardlab.plan import Plan

#: Shardlab's pipeline schedules -> torchtitan's (torch.distributed.pipelining) names.
SCHEDULE_NAMES = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved": "Interleaved1F1B"}
#: torchtitan's mesh order, outer to inner.
TORCHTITAN_ORDER = ("pp", DATA, FSDP, TENSOR)
MODULE = "llama3"
#: torchtitan 0.3's llama3 config functions -> the model shape each builds
#: (layers, hidden, heads, kv heads, ffn, vocab); a test reads them off torchtitan itself
LLAMA3_CONFIGS: dict[str, tuple[int, int, int, int, int, int]] = {
    "llama3_8b": (32, 4096, 32, 8, 14336, 128256),
    "llama3_70b": (80, 8192, 64, 8, 28672, 128256),
    "llama3_405b": (126, 16384, 128, 8, 53248, 128256),
}
#: the config a Llama of another shape starts from (its shape is torchtitan's debug model)
DEBUG_CONFIG = "llama3_debugmodel"
#: torchtitan's llama3 module names of the modules around the layers, by what they are
TORCHTITAN_NAMES = {EMBEDDING: "tok_embeddings", NORM: "norm", LINEAR: "lm_head"}
#: recomputation policy -> torchtitan's activation-checkpointing subcommand
AC_SUBCOMMANDS = {
    "none": "activation-checkpoint:none",
    "full": "activation-checkpoint:full",
    "selective": "activation-checkpoint:selective",
}
_HALF = ("bfloat16", "float16")


#: the run's argument file (`export.arguments`)
TorchtitanRun = ArgumentFile


def mesh_out_of_order(export: DTensorExport, order: tuple[str, ...], inner_first: bool) -> bool:
    """Whether the plan's mesh axes, by role (`pp` for the pipeline axis), run in another
    order than a framework's `order` (outer to inner, or `inner_first`): its ranks are then
    grouped otherwise than the plan's."""
    roles = [PIPELINE_AXIS if a == PIPELINE_AXIS else export.roles[a] for a in export.mesh_axes]
    ranked = [r for r in (reversed(roles) if inner_first else roles) if r in order]
    return ranked != sorted(ranked, key=order.index)


def microbatch_size(local: int, microbatches: int) -> int:
    """Sequences per micro-batch of a rank's `local` batch, or an ExportError naming the
    micro-batches it does not divide into."""
    if local % microbatches:
        raise ExportError(
            f"the local batch {local} does not divide into {microbatches} micro-batches",
            microbatches=microbatches,
        )
    return local // microbatches


def batch_and_seq(plan: Plan) -> tuple[int, int | None]:
    """(global batch, sequence length or None) from the model's first batched input."""
    for v in plan.model.values_of_kind(ValueKind.INPUT):
        if v.type.rank >= 1:
            return v.type.shape[0], (v.type.shape[1] if v.type.rank >= 2 else None)
    raise ExportError(f"model {plan.model.name!r} has no batched input: no batch size to export")


def model_parts(plan: Plan, export: DTensorExport) -> list[list[str]]:
    """Each model chunk's top-level modules and layers (the plan's names), in chunk order."""
    assert plan.pipeline is not None
    chunks = plan.pipeline.assignment.chunks
    layered = set(export.fsdp_units)
    prefix = export.fsdp_units[0].rsplit(".", 1)[0] if export.fsdp_units else "layers"
    modules = []  # top-level modules outside the layers, in graph order
    for p in export.params:
        top = p.module.split(".")[0] if p.module else p.name
        if not any(p.name.startswith(u + ".") for u in layered) and top not in modules:
            modules.append(top)
    first = [m for m in modules if m in plan.pipeline.assignment.pre_modules]
    last = [m for m in modules if m not in first]
    parts = [[f"{prefix}.{i}" for i in range(start, stop)] for start, stop in chunks]
    parts[0] = first + parts[0]
    parts[-1] = parts[-1] + last
    return parts


def _llama_config(plan: Plan) -> tuple[str, str | None]:
    """(torchtitan config function, a note or None) for the plan's model; refuses models
    torchtitan 0.3 has no module for."""
    meta = plan.model.meta or {}
    config: dict[str, Any] = meta["config"] if isinstance(meta.get("config"), dict) else {}
    if meta.get("importer"):
        raise ExportError(
            f"model {plan.model.name!r} was imported ({meta['importer']}): torchtitan 0.3 "
            "builds its models from its own modules (--module llama3, qwen3, deepseek_v3, "
            "...) and Shardlab cannot tell which of them holds an imported graph; export "
            "--format dtensor and apply it to the model",
            model=plan.model.name,
        )
    family = config.get("family")
    if family != "llama" or config.get("tie_embeddings"):
        what = f"a {family} model" if family else "not a model preset Shardlab knows"
        raise ExportError(
            f"model {plan.model.name!r} is {what}: torchtitan 0.3 has a module for Llama "
            "(--module llama3) but none for GPT-2, Megatron's GPT or other models; export "
            "--format dtensor or megatron",
            model=plan.model.name,
        )
    shape = tuple(config.get(k) for k in ("layers", "hidden", "heads", "kv_heads", "ffn",
                                          "vocab"))  # fmt: skip
    for name, known in LLAMA3_CONFIGS.items():
        if shape == known:
            return name, None
    dims = ", ".join(f"{k} {v}" for k, v in zip(("layers", "hidden", "heads", "kv heads",
                                                  "ffn", "vocab"), shape, strict=True))  # fmt: skip
    return DEBUG_CONFIG, (
        f"torchtitan 0.3 takes the model's shape from its config function, and none of "
        f"llama3's ({', '.join(LLAMA3_CONFIGS)}) has this model's ({dims}): the run "
        f"starts from {DEBUG_CONFIG}; register a config function with this shape and pass "
        "it as --config"
    )


def _torchtitan_parts(plan: Plan, export: DTensorExport) -> list[str]:
    """`module_fqns_per_model_part` in torchtitan's llama3 names, each part as A,B,C."""
    kinds: dict[str, str] = {}
    for p in export.params:
        top = p.module.split(".")[0] if p.module else p.name
        kinds.setdefault(top, p.kind)
    out = []
    for part in model_parts(plan, export):
        names = []
        for module in part:
            layer = module.rsplit(".", 1)
            if module in export.fsdp_units and layer[-1].isdigit():
                names.append(f"layers.{int(layer[-1])}")
                continue
            kind = kinds.get(module.split(".")[0])
            if kind not in TORCHTITAN_NAMES:
                raise ExportError(
                    f"module {module!r} of model {plan.model.name!r} (read as {kind}) has no "
                    "counterpart in torchtitan's llama3 (tok_embeddings, layers, norm, "
                    "lm_head): no pipeline split to write",
                    module=module,
                )
            names.append(TORCHTITAN_NAMES[kind])
        out.append(",".join(names))
    return out


def _data_degrees(plan: Plan, export: DTensorExport, notes: list[str]) -> tuple[int, int, bool]:
    """(replicate degree, shard degree, ZeRO mapped to FSDP) from the data and FSDP axes."""
    sizes = dict(zip(export.mesh_axes, export.mesh_shape, strict=True))
    zero = {t.axis for t in plan.strategy.templates if t.name in ZERO_STATE_ONLY}
    zero_axes = [a for a in export.data_axes if a in zero]
    if zero_axes and (export.fsdp_axis is not None or len(zero_axes) > 1):
        shards = [*zero_axes, *([export.fsdp_axis] if export.fsdp_axis else [])]
        raise ExportError(
            f"mesh axes {', '.join(map(repr, shards))} both shard the training state (ZeRO "
            "or FSDP); torchtitan shards it on one data-parallel axis "
            "(data_parallel_shard_degree)",
            axis=shards[-1],
        )
    replicate_axes = [a for a in export.data_axes if a not in zero_axes]
    replicate = math.prod(sizes[a] for a in replicate_axes)
    shard = sizes[export.fsdp_axis] if export.fsdp_axis else 1
    if zero_axes:
        shard = sizes[zero_axes[0]]
        names = ", ".join(t.name for t in plan.strategy.templates if t.name in ZERO_STATE_ONLY)
        notes.append(
            f"{names} on mesh axis {zero_axes[0]!r} is run as torchtitan's FSDP "
            "(data_parallel_shard_degree) with fsdp_reshard_after_forward never: one "
            "parameter all-gather per step and a gradient reduce-scatter, the collectives "
            "ZeRO-2 issues; unlike the plan, the parameters stay sharded between steps"
        )
    elif replicate > 1 and export.fsdp_axis is None:
        notes.append(
            "data parallelism without FSDP is data_parallel_replicate_degree with "
            "data_parallel_shard_degree 1: torchtitan 0.3 has no DDP wrapper and runs it as "
            "fully_shard over a size-1 shard axis (parameters replicated, gradients "
            "all-reduced over the replicate axis, as DDP does)"
        )
    return replicate, shard, bool(zero_axes)


def torchtitan_run(plan: Plan) -> ArgumentFile:
    """The run's arguments, header comments and notes (module docstring)."""
    config, shape_note = _llama_config(plan)
    export = derive_export(plan)
    notes = [n for n in export.notes if not any(z in n for z in ZERO_STATE_ONLY)]
    notes += [shape_note] if shape_note else []
    sizes = dict(zip(export.mesh_axes, export.mesh_shape, strict=True))
    replicate, shard, zero = _data_degrees(plan, export, notes)
    tp = sizes[export.tp_axis] if export.tp_axis else 1
    pp = sizes.get(PIPELINE_AXIS, 1)
    batch, seq = batch_and_seq(plan)
    ranks = replicate * shard
    micro = plan.pipeline.options.microbatches if plan.pipeline is not None else 1
    if batch % ranks or (pp == 1 and batch % (ranks * micro)):
        raise ExportError(
            f"the global batch {batch} does not divide over the {ranks} data-parallel ranks"
            + (f" and {micro} accumulation steps" if pp == 1 and micro > 1 else ""),
            batch=batch,
        )
    # pp > 1: torchtitan cuts the local batch into micro-batches; pp = 1: it accumulates
    local = batch // ranks if pp > 1 else batch // (ranks * micro)
    dtype = plan.model.values_of_kind(ValueKind.PARAM)[0].type.dtype
    masters = bool((plan.training.meta or {}).get("master_weights"))
    args: list[list[str]] = [["--module", MODULE], ["--config", config]]
    args += [["--training.local_batch_size", str(local)],
             ["--training.global_batch_size", str(batch)]]  # fmt: skip
    if seq is not None:
        args.append(["--training.seq_len", str(seq)])
    if dtype in _HALF and not masters:
        args.append(["--training.dtype", "bfloat16"])
    args.append(["--training.mixed_precision_param", "bfloat16" if dtype in _HALF else "float32"])
    sp = export.sequence_parallel
    args += [
        ["--parallelism.data_parallel_replicate_degree", str(replicate)],
        ["--parallelism.data_parallel_shard_degree", str(shard)],
        ["--parallelism.tensor_parallel_degree", str(tp)],
        ["--parallelism.enable_sequence_parallel" if sp or tp == 1
         else "--parallelism.no_enable_sequence_parallel"],
        ["--parallelism.context_parallel_degree", "1"],
        ["--parallelism.pipeline_parallel_degree", str(pp)],
    ]  # fmt: skip
    if zero:
        args.append(["--parallelism.fsdp_reshard_after_forward", "never"])
    if plan.pipeline is not None and pp > 1:
        options = plan.pipeline.options
        micro = microbatch_size(local, options.microbatches)
        args += [
            ["--training.disable_cuda_graphs"],  # torchtitan 0.3: no CUDA graphs with pp
            ["--parallelism.pipeline_parallel_schedule", SCHEDULE_NAMES[options.schedule]],
            ["--parallelism.pipeline_parallel_microbatch_size", str(micro)],
            ["--parallelism.module_fqns_per_model_part", *_torchtitan_parts(plan, export)],
        ]  # fmt: skip
    args.append([AC_SUBCOMMANDS[export.recompute]])
    if tp > 1 and export.loss_gathered:
        notes.append(
            "the plan gathers the logits before the loss; torchtitan's loss is vocab-parallel "
            "under tensor parallelism (no gather, a few small all-reduces)"
        )
    if replicate * shard > 1 and dtype in _HALF:
        notes.append(
            "torchtitan reduces gradients in float32 (training.mixed_precision_reduce takes "
            f"only float32); the plan reduces them in {dtype}, half the bytes"
        )
    if mesh_out_of_order(export, TORCHTITAN_ORDER, inner_first=False):
        notes.append(
            f"the plan's mesh order ({', '.join(export.mesh_axes)}) differs from torchtitan's "
            "(pp, dp_replicate, dp_shard, tp): ranks are grouped differently"
        )
    comments = [
        f"torchtitan 0.3 run of Shardlab plan: {plan.strategy.describe()}",
        "torchrun --nproc_per_node=<ranks per node> -m torchtitan.train "
        "$(grep -v '^#' <this file>)",
        *(f"note: {n}." for n in notes),
    ]
    return ArgumentFile(args, comments, notes)


def render_torchtitan(plan: Plan) -> str:
    """The argument file (module docstring), ending in one newline."""
    return torchtitan_run(plan).text()
