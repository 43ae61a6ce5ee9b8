"""Run a pipelined training step on the simulated mesh and verify it against one device.

`run_pipeline` executes every stage's program on its sub-mesh ranks (numpy, all in one
process), op by op in `execution_order`: stages take turns, a recv runs only after its
send. A send copies the blocks of every rank of its stage; the recv hands each block to the
rank at the same coordinates (on the non-pipeline axes) of the receiving stage. Graph inputs
are split along dim 0 into the micro-batches.

`run_pipeline` and `verify_pipeline` take a `backend` (`runtime.backends.run_pipeline_backend`):
"simulated" is `run_pipeline_blocks`; "torch" runs every rank in its own process with real
send/recv and collectives (`runtime.torch_pipeline`). Either gives every stage's blocks, and
the comparison below is the same.

`verify_pipeline` compares the loss (mean of the micro-batch losses), every accumulated
parameter gradient and every updated parameter and optimizer state with one device running
the full batch, with the tolerances of `runtime.verify` (an optimizer's outputs as updates,
to the accuracy their gradient's check allows).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from shardlab.autodiff import training_graph
from shardlab.errors import ExecutionError
from shardlab.ir import Graph
from shardlab.models import build_model, get_preset
from shardlab.ops.base import Array
from shardlab.passes.pipeline import PipelineProgram, build_pipeline, execution_order
from shardlab.passes.pipeline_schedule import p2p_key
from shardlab.program import DistProgram
from shardlab.runtime import mixed_precision as mixed
from shardlab.runtime.distribute import assemble, distribute
from shardlab.runtime.hazards import SYNC_KINDS
from shardlab.runtime.reference import source_values
from shardlab.runtime.simulated import execute_op
from shardlab.runtime.verify import (
    TensorCheck,
    VerifyReport,
    _compare,
    check_local_op,
    check_outputs,
    reference_env,
)
from shardlab.strategy import Strategy

Blocks = dict[str, dict[int, Array]]
#: Builds a model's forward graph for a given batch size.
ModelBuilder = Callable[[int], Graph]


def stage_feeds(
    pipeline: PipelineProgram, sources: Mapping[str, Array], seed: int = 0
) -> list[Blocks]:
    """Every stage's blocks of its fed values (inputs split into micro-batches, parameters
    and state whole), from the global full-batch sources; `seed` splits partial ones."""
    rng = np.random.default_rng(seed)
    m_count = pipeline.microbatches
    blocks: list[Blocks] = [{} for _ in pipeline.stages]
    for s, feeds in enumerate(pipeline.feeds):
        program = pipeline.stages[s]
        for name, feed in feeds.items():
            if feed.source not in sources:
                raise ExecutionError(f"no data for source {feed.source!r}", value=feed.source)
            data = np.asarray(sources[feed.source])
            if feed.microbatch is not None:
                if data.ndim == 0 or data.shape[0] % m_count:
                    raise ExecutionError(
                        f"input {feed.source!r} of shape {list(data.shape)} does not split into "
                        f"{m_count} micro-batches along dim 0",
                        value=feed.source,
                    )
                data = np.split(data, m_count, axis=0)[feed.microbatch]
            want = program.types[name].shape
            if data.shape != want:
                raise ExecutionError(
                    f"source {feed.source!r} gives shape {list(data.shape)} for {name!r} on "
                    f"stage {s}, which expects {list(want)}",
                    value=feed.source,
                )
            blocks[s][name] = distribute(data, program.specs[name], rng)
    return blocks


def run_pipeline_blocks(
    pipeline: PipelineProgram, sources: Mapping[str, Array], seed: int = 0
) -> list[Blocks]:
    """Every stage's blocks of every value it holds after the step (program order)."""
    blocks = stage_feeds(pipeline, sources, seed)
    mailbox: dict[tuple[int, int, str], list[Array]] = {}
    for s, op in execution_order(pipeline):
        program = pipeline.stages[s]
        if op.kind == "send":
            held = blocks[s][op.inputs[0]]
            mailbox[p2p_key(s, op)] = [held[r].copy() for r in program.mesh.ranks]
        elif op.kind == "recv":
            sent = mailbox.pop(p2p_key(s, op))
            blocks[s][op.outputs[0]] = dict(zip(program.mesh.ranks, sent, strict=True))
        elif op.kind in SYNC_KINDS:
            continue  # wait / hold / free order buffers; they compute nothing
        else:
            execute_op(program, op, blocks[s])
    return blocks


def run_pipeline(
    pipeline: PipelineProgram,
    sources: Mapping[str, Array],
    seed: int = 0,
    *,
    backend: str = "simulated",
) -> dict[str, Array]:
    """Global views after one pipelined step on `backend`, from the global (full-batch)
    source values.

    Keys: every entry of `pipeline.outputs` (accumulated gradients, new params and state),
    `<loss>#<m>` per micro-batch and the loss itself (their mean).
    """
    from shardlab.runtime.backends import run_pipeline_backend

    return pipeline_views(pipeline, run_pipeline_backend(backend, pipeline, sources, seed))


def pipeline_views(pipeline: PipelineProgram, blocks: list[Blocks]) -> dict[str, Array]:
    """`run_pipeline`'s global views, from every stage's blocks."""

    def view(stage: int, value: str) -> Array:
        program = pipeline.stages[stage]
        return assemble(blocks[stage][value], program.specs[value], program.types[value].shape)

    out = {name: view(s, value) for name, (s, value) in pipeline.outputs.items()}
    losses = [view(s, value) for s, value in pipeline.losses]
    for (_, value), loss in zip(pipeline.losses, losses, strict=True):
        out[value] = loss
    out[pipeline.loss] = np.mean(np.stack(losses), axis=0)
    return out


def check_stages_local(
    pipeline: PipelineProgram, blocks: list[Blocks], full: Graph
) -> list[TensorCheck]:
    """Mixed precision: every compute op of every stage program (each micro-batch's forward
    and backward, the gradient sums, the optimizer) against the same op computed exactly on
    the stage's own inputs (`runtime.verify.check_local`), in the order the stages run;
    activations are kept only where they fail. Values are reported under their serial
    names' kinds (`x#3` as `x`)."""
    checks: list[TensorCheck] = []
    for s, op in execution_order(pipeline):
        program = pipeline.stages[s]
        if op.comm is not None or op.kind in SYNC_KINDS or op.kind in ("send", "recv"):
            continue

        def view(value: str, s: int = s, program: DistProgram = program) -> Array:
            return assemble(blocks[s][value], program.specs[value], program.types[value].shape)

        got = {n: view(n) for n in op.outputs}
        types = [program.types[n] for n in op.outputs]
        for check in check_local_op(full, op, [view(v) for v in op.inputs], got, types):
            if check.kind != "activation" or not check.ok:
                checks.append(check)
    return checks


def preset_builder(preset: str, overrides: Mapping[str, object] | None = None) -> ModelBuilder:
    """A `ModelBuilder` for a model preset with `overrides` (the batch is set per call)."""
    return lambda batch: build_model(preset, {**(overrides or {}), "batch": batch})


def verify_pipeline(
    model: str | ModelBuilder,
    strategy: Strategy,
    *,
    microbatches: int,
    schedule: str = "1f1b",
    virtual_stages: int | None = None,
    boundaries: Sequence[int] | None = None,
    overrides: Mapping[str, object] | None = None,
    batch: int | None = None,
    optimizer: str = "adamw",
    lr: float = 1e-3,
    compute_dtype: str = "float64",
    seed: int = 0,
    axis: str = "pp",
    transform: Callable[[PipelineProgram], PipelineProgram] | None = None,
    backend: str = "simulated",
    device: str = "cpu",
) -> VerifyReport:
    """One pipelined training step against the full batch on one device.

    `model` is a preset name (with `overrides`; the batch defaults to the preset's) or a
    function building the forward graph for a batch size (then `batch` is required). The
    report's `first_divergence` names the first failing tensor (loss, then by name); its
    summary is the pipeline's summary plus the number of compared tensors. `transform`, when
    given, rewrites the built pipeline before it runs (e.g. passes on its stage programs).
    `backend` runs the stages (`runtime.verify.BACKENDS`), the torch backend's on `device`;
    compute dtype "bfloat16" runs them in the graph's own mixed precision (`runtime.verify`).
    """
    if isinstance(model, str):
        if batch is None:
            given = (overrides or {}).get("batch")
            batch = get_preset(model).config.batch if given is None else int(str(given))
        model = preset_builder(model, overrides)
    if batch is None:
        raise TypeError("verify_pipeline: `batch` is needed with a model builder")
    if batch % microbatches:
        raise ExecutionError(
            f"batch {batch} does not split into {microbatches} equal micro-batches", batch=batch
        )
    full = training_graph(model(batch), optimizer=optimizer, lr=lr)
    pipeline = build_pipeline(
        model(batch // microbatches),
        strategy,
        microbatches=microbatches,
        schedule=schedule,
        virtual_stages=virtual_stages,
        boundaries=boundaries,
        optimizer=optimizer,
        lr=lr,
        axis=axis,
    )
    if transform is not None:
        pipeline = transform(pipeline)
    env = reference_env(full, seed, compute_dtype, backend)
    sources = {v.name: env[v.name] for v in source_values(full)}
    from shardlab.runtime.backends import run_pipeline_backend

    blocks = run_pipeline_backend(backend, pipeline, sources, seed, device=device,
                                  precision=mixed.precision_of(compute_dtype))  # fmt: skip
    got = pipeline_views(pipeline, blocks)
    loss = pipeline.loss
    outputs = {name: got[name] for name in pipeline.outputs}
    checks: list[TensorCheck] = []
    if compute_dtype == mixed.MIXED_DTYPE:
        checks = check_stages_local(pipeline, blocks, full)
    else:
        for op in full.ops:
            checks += check_outputs(full, op, env, outputs, compute_dtype)
        checks.sort(key=lambda c: c.name)
    checks.insert(0, _compare(loss, "loss", got[loss], env[loss], compute_dtype))
    failed = [c.name for c in checks if not c.ok]
    summary = {**pipeline.summary(), "compared": len(checks), "reference_ops": len(full.ops)}
    return VerifyReport(not failed, compute_dtype, checks, failed[0] if failed else None, summary)
