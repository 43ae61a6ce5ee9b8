"""A plan as Megatron-LM arguments: the options of `pretrain_gpt.py` that say how to split it.

What it is for: `shardlab export-plan --format megatron` writes the options a Megatron-LM
run of the plan takes (`export.arguments.ArgumentFile`: header comments, one option a
line), to which the user adds data, tokenizer and schedule options:

    torchrun --nproc_per_node=8 pretrain_gpt.py $(grep -v '^#' plan_megatron.args) --data-path ...

What is written, from the per-axis roles the DTensor export decides
(`export.dtensor.derive_export`, read off the plan's placements):

- parallelism: `--tensor-model-parallel-size`, `--pipeline-model-parallel-size`,
  `--num-layers-per-virtual-pipeline-stage` (interleaved schedules),
  `--context-parallel-size 1`, `--sequence-parallel` (the plan keeps the norms' activations
  sequence-sharded), `--use-distributed-optimizer` (ZeRO-1, and ZeRO-2 with a note: the
  distributed optimizer reduce-scatters gradients into a full-size buffer). The
  data-parallel size is what remains of the world size, as Megatron derives it.
- batch: `--micro-batch-size` (per data-parallel rank and micro-batch) and
  `--global-batch-size` (the plan's batch; Megatron runs global / (micro x data-parallel)
  micro-batches: the pipeline's, or gradient accumulation: strategy option `microbatches`).
- recomputation: `full` -> `--recompute-granularity full --recompute-method uniform
  --recompute-num-layers 1` (every layer), `selective` -> `--recompute-granularity
  selective` (Megatron's selective recomputation is the attention core's, as Shardlab's).
- the model (presets only: `meta["config"]`): `--num-layers --hidden-size --ffn-hidden-size
  --num-attention-heads [--group-query-attention --num-query-groups] --seq-length
  --max-position-embeddings --vocab-size`, for Llama `--swiglu --normalization RMSNorm
  --position-embedding-type rope --rotary-base --untie-embeddings-and-output-weights`, and
  `--bf16` / `--fp16` from the parameters' dtype; the optimizer (`--optimizer adam|sgd`, `--lr`).

Refused (`ExportError`, naming why): FSDP (Megatron-LM shards parameters only with its own
Megatron-FSDP, which this export does not write: use `--format torchtitan` or `dtensor`),
tensor parallelism other than Megatron's (Megatron splits every attention and MLP
projection and the vocabulary; a plan that keeps one replicated cannot be said), two
tensor-parallel axes, an imported graph (no model shape to write), a batch that does not
divide. Notes: a mesh order other than Megatron's (`tp` innermost, then `cp`, `dp`, `pp`),
a pipeline split Megatron would not make, GPipe (Megatron runs 1F1B), a plan that gathers
the logits before the loss (Megatron's loss is vocab-parallel), Llama's bias-free linears.
"""

from __future__ import annotations

import math

from shardlab.export.arguments import ArgumentFile
from shardlab.export.dtensor import ZERO_STATE_ONLY, DTensorExport, derive_export
from shardlab.export.parameters import EMBEDDING, LINEAR, PIPELINE_AXIS, ExportError
from shardlab.export.torchtitan import batch_and_seq, mesh_out_of_order
from shardlab.ir import ValueKind
from shardlab.placement import Replicate
from shardlab.plan import Plan

#: Megatron-LM's rank order, inner to outer (its default `--order` tp-cp-ep-dp-pp)
MEGATRON_ORDER = ("tensor", "data", "pp")
_OPTIMIZERS = {"adamw": "adam", "adam": "adam", "sgd": "sgd"}


def _model_args(plan: Plan) -> tuple[list[list[str]], list[str]]:
    """The model's shape options and notes; refuses a model without a preset config."""
    meta = plan.model.meta or {}
    config = meta.get("config") if isinstance(meta.get("config"), dict) else None
    if meta.get("importer") or not config or config.get("family") not in ("llama", "gpt2", "gpt"):
        why = f"imported ({meta['importer']})" if meta.get("importer") else "not a GPT or Llama"
        raise ExportError(
            f"model {plan.model.name!r} is {why}: the Megatron-LM export writes the shape of "
            "the GPT-2, GPT and Llama presets (pretrain_gpt.py builds the model from it); "
            "export --format dtensor and apply it to the model",
            model=plan.model.name,
        )
    seq = int(config["seq"])
    args = [
        ["--num-layers", str(config["layers"])],
        ["--hidden-size", str(config["hidden"])],
        ["--ffn-hidden-size", str(config["ffn"])],
        ["--num-attention-heads", str(config["heads"])],
    ]
    if config["kv_heads"] != config["heads"]:
        args += [["--group-query-attention"], ["--num-query-groups", str(config["kv_heads"])]]
    positions = int(config.get("max_positions") or 0) or seq
    args += [
        ["--seq-length", str(seq)],
        ["--max-position-embeddings", str(positions)],
        ["--vocab-size", str(config["vocab"])],
    ]
    notes = []
    if config["family"] == "llama":
        args += [
            ["--swiglu"],
            ["--normalization", "RMSNorm"],
            ["--position-embedding-type", "rope"],
            ["--rotary-base", str(int(config["rope_theta"]))],
        ]
        notes.append(
            "Llama's linear layers have no bias: add your Megatron-LM's bias-off option "
            "(--disable-bias-linear)"
        )
    if not config.get("tie_embeddings"):
        args.append(["--untie-embeddings-and-output-weights"])
    return args, notes


def _check_tensor_parallel(export: DTensorExport) -> None:
    """Megatron's tensor parallelism splits every projection of the layers, the vocabulary
    embedding and the output layer; refuse a plan that keeps one of them replicated."""
    axis = export.tp_axis
    if axis is None:
        return
    for p in export.params:
        if p.attr != "weight" or p.kind not in (LINEAR, EMBEDDING):
            continue
        if isinstance(p.placements[axis], Replicate):
            raise ExportError(
                f"parameter {p.name!r} is replicated on tensor-parallel mesh axis {axis!r}: "
                "Megatron-LM's tensor parallelism splits every attention and MLP projection, "
                "the embedding and the output layer, and has no option to keep one whole; "
                "export --format dtensor",
                value=p.name,
                axis=axis,
            )


def _pipeline_args(plan: Plan, layers: int, notes: list[str]) -> list[list[str]]:
    assert plan.pipeline is not None
    a, options = plan.pipeline.assignment, plan.pipeline.options
    args: list[list[str]] = []
    sizes = [stop - start for start, stop in a.chunks]
    if a.virtual_stages > 1:
        if len(set(sizes)) > 1:
            raise ExportError(
                f"the plan's interleaved pipeline chunks hold {sizes} layers; Megatron-LM's "
                "virtual stages hold the same number of layers each",
                chunks=str(sizes),
            )
        args.append(["--num-layers-per-virtual-pipeline-stage", str(sizes[0])])
    elif len(set(sizes)) > 1:
        if len(sizes) > 2 and len(set(sizes[1:-1])) == 1:
            args += [["--decoder-first-pipeline-num-layers", str(sizes[0])],
                     ["--decoder-last-pipeline-num-layers", str(sizes[-1])]]  # fmt: skip
        else:
            notes.append(
                f"the plan's pipeline stages hold {sizes} layers; Megatron-LM splits "
                f"{layers} layers evenly unless told the first and last stages' counts"
            )
    if options.schedule == "gpipe":
        notes.append(
            "Megatron-LM has no GPipe schedule: it runs 1F1B, with the same bubble and fewer "
            "micro-batches' activations held"
        )
    return args


def megatron_run(plan: Plan) -> ArgumentFile:
    """The run's options, header comments and notes (module docstring)."""
    model_args, notes = _model_args(plan)
    export = derive_export(plan)
    if export.fsdp_axis is not None:
        raise ExportError(
            f"mesh axis {export.fsdp_axis!r} is FSDP (parameters sharded and gathered before "
            "use): Megatron-LM's pretrain_gpt.py keeps parameters whole on its data-parallel "
            "ranks (its distributed optimizer shards only the optimizer state), and this "
            "export does not write Megatron-FSDP; export --format torchtitan or dtensor",
            axis=export.fsdp_axis,
        )
    _check_tensor_parallel(export)
    sizes = dict(zip(export.mesh_axes, export.mesh_shape, strict=True))
    tp = sizes[export.tp_axis] if export.tp_axis else 1
    pp = sizes.get(PIPELINE_AXIS, 1)
    dp = math.prod(sizes[a] for a in export.data_axes)
    batch, _ = batch_and_seq(plan)
    micro_count = plan.pipeline.options.microbatches if plan.pipeline is not None else 1
    if batch % (dp * micro_count):
        raise ExportError(
            f"the global batch {batch} does not divide over {dp} data-parallel ranks and "
            f"{micro_count} micro-batches",
            batch=batch,
        )
    args: list[list[str]] = [
        ["--tensor-model-parallel-size", str(tp)],
        ["--pipeline-model-parallel-size", str(pp)],
        ["--context-parallel-size", "1"],
    ]
    if export.sequence_parallel:
        args.append(["--sequence-parallel"])
    if plan.pipeline is not None and pp > 1:
        args += _pipeline_args(plan, int(model_args[0][1]), notes)
    zero = [t for t in plan.strategy.templates if t.name in ZERO_STATE_ONLY]
    if zero:
        args.append(["--use-distributed-optimizer"])
        if any(t.name == "zero2" for t in zero):
            notes.append(
                "zero2 is run as Megatron-LM's distributed optimizer: gradients are "
                "reduce-scattered, but into a full-size gradient buffer on every rank"
            )
    args += [["--micro-batch-size", str(batch // (dp * micro_count))],
             ["--global-batch-size", str(batch)]]  # fmt: skip
    if export.recompute == "full":
        args += [["--recompute-granularity", "full"], ["--recompute-method", "uniform"],
                 ["--recompute-num-layers", "1"]]  # fmt: skip
    elif export.recompute == "selective":
        args.append(["--recompute-granularity", "selective"])
    args += model_args
    dtype = plan.model.values_of_kind(ValueKind.PARAM)[0].type.dtype
    if dtype in ("bfloat16", "float16"):
        args.append(["--bf16" if dtype == "bfloat16" else "--fp16"])
    args += [["--optimizer", _OPTIMIZERS.get(plan.optimizer, plan.optimizer)],
             ["--lr", repr(float(plan.lr))]]  # fmt: skip
    if tp > 1 and export.loss_gathered:
        notes.append(
            "the plan gathers the logits before the loss; Megatron-LM's loss is vocab-parallel"
        )
    if mesh_out_of_order(export, MEGATRON_ORDER, inner_first=True):
        notes.append(
            f"the plan's mesh order ({', '.join(export.mesh_axes)}) differs from Megatron-LM's "
            "(pp, dp, cp, tp from outer to inner): ranks are grouped differently"
        )
    comments = [
        f"Megatron-LM pretrain_gpt.py options of Shardlab plan: {plan.strategy.describe()}",
        "torchrun --nproc_per_node=<ranks per node> pretrain_gpt.py $(grep -v '^#' <this file>) "
        "<data and tokenizer options>",
        *(f"note: {n}." for n in notes),
    ]
    return ArgumentFile(args, comments, notes)


def render_megatron(plan: Plan) -> str:
    """The argument file (module docstring), ending in one newline."""
    return megatron_run(plan).text()
