"""Verification: one training step of a plan on the simulated mesh against one device.

Builds the plan (training graph, completion, lowering) unless given one, runs it on the
simulated mesh from the same seeded sources as the single-device reference, and compares the
loss, every gradient and every updated parameter with dtype-aware tolerances. On a mismatch
it names the first serial op (in program order) whose output diverges: since every value is
compared, the first failing one in topological order is where the bisection lands.

A strategy whose mesh has a `pp` axis is verified as a pipeline
(`runtime.pipeline_exec.verify_pipeline`) with the strategy option `pipeline` (schedule,
micro-batches, virtual stages; `passes.pipeline_schedule.PipelineOptions`, whose defaults
are the engine's: 1f1b, one micro-batch per stage); the model must then be a preset, rebuilt
at the micro-batch size. Both backends run pipelines.

Tolerances, with `(rtol, atol) = TOLERANCES[compute_dtype]`:

- the loss, activations and gradients: elementwise `|got - want| <= atol + rtol * |want|`.
- the outputs of an optimizer step (new parameters, moments, master weights): as the UPDATE
  `new - old` against the reference's update, to the accuracy the gradient check allows.
  The gradient passed when it is within `tau = atol + rtol * |g|` of the reference's, so the
  step may legitimately move by `spread`, the largest change of its output when the
  reference's gradient moves by `+-tau` (the optimizer re-run in float64; its other inputs are
  the same sources on both sides). An output passes when `|got - want| <= spread +
  rtol * |want - old| + 4 * eps * |want|` (`eps` of the compute dtype: the rounding of the
  final `old - step`). For SGD `spread = lr * tau`; for AdamW it is tiny where the gradient is
  resolved and about `lr` where the gradient is at rounding-noise level (a gradient zero in
  exact arithmetic, e.g. a key bias, which `m / (sqrt(v) + eps)` amplifies to a +-lr step of
  arbitrary sign). A wrong update of a resolved gradient fails even at 1e-3 of the step:
  `rtol` applies to the step, not to `atol`. Their `max_rel` is relative to the reference's
  largest update of the tensor.

Compute dtype "bfloat16" (torch backend only) runs the ranks in the graph's own mixed
precision, bf16 with fp32 masters, on CPU or on GPUs (`device`): every op is compared with
itself computed exactly on the run's own inputs, and the loss with a float32 reference,
normwise (`runtime.mixed_precision`); the rules above do not apply.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from shardlab.errors import ExecutionError
from shardlab.ir import Graph, Op, OpRole, TensorType, ValueKind
from shardlab.ops import get_op
from shardlab.ops.base import Array
from shardlab.passes.pipeline_schedule import PipelineOptions
from shardlab.plan import Plan, build_plan
from shardlab.program import DistOp
from shardlab.rebatch import model_at_batch, model_batch
from shardlab.runtime import mixed_precision as mixed
from shardlab.runtime.backends import run_backend
from shardlab.runtime.reference import check_compute_dtype, run_reference, source_values
from shardlab.runtime.simulated import global_view
from shardlab.strategy import Strategy

#: (rtol, atol) by compute dtype ("bfloat16" has its own checks: `runtime.mixed_precision`).
TOLERANCES = {"float64": (1e-10, 1e-10), "float32": (1e-5, 1e-5)}
#: Machine epsilon by compute dtype (the rounding of an optimizer's final subtraction).
EPSILON = {"float64": float(np.finfo(np.float64).eps), "float32": float(np.finfo(np.float32).eps)}

#: Where the distributed side runs (`runtime/backends.py`). "simulated": every rank in this
#: process (`runtime/simulated.py`, numpy); "torch": one process per rank, real
#: torch.distributed collectives over gloo on CPU (`runtime/torchdist.py`).
BACKENDS = ("simulated", "torch")


@dataclass(frozen=True, slots=True)
class TensorCheck:
    """Max abs / rel error of one compared tensor."""

    name: str
    kind: str  # loss | grad | param | activation
    max_abs: float
    max_rel: float
    ok: bool


@dataclass
class VerifyReport:
    """Outcome of a verification run."""

    ok: bool
    compute_dtype: str
    checks: list[TensorCheck]
    first_divergence: str | None = None
    summary: dict[str, Any] = field(default_factory=dict)

    def failed(self) -> list[TensorCheck]:
        return [c for c in self.checks if not c.ok]

    def to_json(self) -> dict[str, Any]:
        """The report as the service stores it and `shardlab.check` judges it."""
        return {
            "ok": self.ok,
            "compute_dtype": self.compute_dtype,
            "first_divergence": self.first_divergence,
            "summary": self.summary,
            "failed": len(self.failed()),
            "checks": [
                {"name": c.name, "kind": c.kind, "max_abs": c.max_abs, "max_rel": c.max_rel,
                 "ok": c.ok}
                for c in self.checks
            ],
        }  # fmt: skip


def _compare(name: str, kind: str, got: np.ndarray, want: np.ndarray, dtype: str) -> TensorCheck:
    if dtype == mixed.MIXED_DTYPE:
        return TensorCheck(name, kind, *mixed.check_end_to_end(got, want))
    rtol, atol = TOLERANCES[dtype]
    diff = np.abs(got.astype(np.float64) - want.astype(np.float64))
    max_abs = float(np.max(diff, initial=0.0))
    scale = np.maximum(np.abs(want.astype(np.float64)), 1e-30)
    max_rel = float(np.max(diff / scale, initial=0.0))
    ok = bool(np.all(diff <= atol + rtol * np.abs(want)))
    return TensorCheck(name, kind, max_abs, max_rel, ok)


def value_kind(graph: Graph, name: str) -> str:
    """How value `name` of a training graph is reported: loss, grad, param or activation."""
    value = graph.value(name)
    if name == str(graph.meta.get("loss", graph.outputs[0])):
        return "loss"
    if value.kind == ValueKind.GRAD:
        return "grad"
    if value.kind in (ValueKind.PARAM, ValueKind.STATE):
        return "param"
    return "activation"


#: The gradient's position among an optimizer op's inputs (param, grad, state...).
GRAD_INPUT = 1


def update_spread(op: Op, env: Mapping[str, Array], dtype: str) -> list[Array]:
    """How far each output of optimizer op `op` moves (elementwise, float64) when its
    gradient moves by the gradient tolerance `+-tau` around the reference's (module doc)."""
    impl = get_op(op.kind).numpy_impl
    assert impl is not None, op.kind
    rtol, atol = TOLERANCES[dtype]
    args = [np.asarray(env[v], dtype=np.float64) for v in op.inputs]
    grad = args[GRAD_INPUT]
    tau = atol + rtol * np.abs(grad)
    center = [np.asarray(y, dtype=np.float64) for y in impl(args, op.attrs)]
    spread = [np.zeros_like(y) for y in center]
    for moved_grad in (grad + tau, grad - tau):
        moved = impl([*args[:GRAD_INPUT], moved_grad, *args[GRAD_INPUT + 1 :]], op.attrs)
        spread = [
            np.maximum(s, np.abs(np.asarray(m) - c))
            for s, m, c in zip(spread, moved, center, strict=True)
        ]
    return spread


def _compare_update(
    name: str, got: Array, want: Array, old: Array, spread: Array, dtype: str
) -> TensorCheck:
    """An optimizer output: its update against the reference's, within `spread` (module doc)."""
    rtol, _ = TOLERANCES[dtype]
    want64 = want.astype(np.float64)
    diff = np.abs(got.astype(np.float64) - want64)
    step = np.abs(want64 - old.astype(np.float64))
    ok = bool(np.all(diff <= spread + rtol * step + 4 * EPSILON[dtype] * np.abs(want64)))
    max_abs = float(np.max(diff, initial=0.0))
    max_rel = max_abs / max(float(np.max(step, initial=0.0)), 1e-30)
    return TensorCheck(name, "param", max_abs, max_rel, ok)


def check_outputs(
    graph: Graph, op: Op, env: Mapping[str, Array], got: Mapping[str, Array], dtype: str
) -> list[TensorCheck]:
    """A check of every output of `op` that `got` holds, against the reference `env`, by the
    rule of its kind (module doc)."""
    names = [name for name in op.outputs if name in got]
    if op.role != OpRole.OPTIMIZER or not names:
        return [_compare(n, value_kind(graph, n), got[n], env[n], dtype) for n in names]
    spread = update_spread(op, env, dtype)
    inplace = list(op.attrs.get("inplace", [0]))
    checks = []
    for j, name in enumerate(op.outputs):
        if name in got:
            old = env[op.inputs[inplace[j] if j < len(inplace) else 0]]
            checks.append(_compare_update(name, got[name], env[name], old, spread[j], dtype))
    return checks


def check_local(
    graph: Graph, op: Op, inputs: list[Array], got: Mapping[str, Array]
) -> list[TensorCheck]:
    """Mixed precision: every output of serial op `op` in the run against `op` computed
    exactly on the run's own inputs (`runtime.mixed_precision.check_local`)."""
    types = [graph.value(n).type for n in op.outputs]
    return check_local_op(graph, op, inputs, got, types)


def check_local_op(
    graph: Graph,
    op: Op | DistOp,
    inputs: list[Array],
    got: Mapping[str, Array],
    types: list[TensorType],
) -> list[TensorCheck]:
    """`check_local` of a serial op or of a compute op of a (stage) program, whose outputs
    have `types`; a value `x#m` of micro-batch m is reported as `graph`'s `x` is."""
    local = mixed.local_outputs(op, inputs, types)
    checks = []
    for n, want in zip(op.outputs, local, strict=True):
        if n in got:
            base = n.rpartition("#")[0] if "#" in n else n
            kind = value_kind(graph, base) if base in graph.values else "activation"
            checks.append(TensorCheck(n, kind, *mixed.check_local(got[n], want)))
    return checks


def verify(
    graph: Graph | Plan,
    strategy: Strategy | None = None,
    *,
    optimizer: str = "adamw",
    lr: float = 1e-3,
    compute_dtype: str = "float64",
    seed: int = 0,
    backend: str = "simulated",
    device: str = "cpu",
) -> VerifyReport:
    """Run one training step distributed and on one device; compare what matters.

    Pass a model graph and a strategy, or a `Plan` already built (then `optimizer` and `lr`
    are the plan's). `backend` is one of `BACKENDS`; `device` ("cpu" | "cuda") is where the
    torch backend's ranks run; compute dtype "bfloat16" runs them in the graph's own mixed
    precision (module doc).
    """
    if backend not in BACKENDS:
        raise ExecutionError(
            f"unknown verification backend {backend!r}; available: {', '.join(BACKENDS)}",
            backend=backend,
        )
    if compute_dtype != mixed.MIXED_DTYPE:
        check_compute_dtype(compute_dtype)
    if isinstance(graph, Plan):
        plan = graph
    elif strategy is None:
        raise TypeError("verify(graph, strategy): a strategy is needed with a graph")
    elif strategy.pipelined:  # a pp axis, or gradient accumulation (one stage)
        return _verify_pipelined(
            graph, strategy.schedule_strategy(), optimizer, lr, compute_dtype, seed, backend,
            device,
        )  # fmt: skip
    else:
        plan = build_plan(graph, strategy, optimizer=optimizer, lr=lr)
    tg, program = plan.training, plan.program
    env = reference_env(tg, seed, compute_dtype, backend)
    sources = {v.name: env[v.name] for v in source_values(tg)}
    blocks = run_backend(backend, program, sources, seed, device=device,
                         precision=mixed.precision_of(compute_dtype))  # fmt: skip
    checks: list[TensorCheck] = []
    first: str | None = None
    views: dict[str, Array] = {}

    def view(name: str) -> Array:
        if name not in views:
            views[name] = global_view(program, blocks, program.values[name])
        return views[name]

    for op in tg.ops:
        got = {n: view(n) for n in op.outputs}
        if compute_dtype == mixed.MIXED_DTYPE:
            op_checks = check_local(tg, op, [view(v) for v in op.inputs], got)
        else:
            op_checks = check_outputs(tg, op, env, got, compute_dtype)
        for check in op_checks:
            if not check.ok and first is None:
                first = op.name
            if check.kind != "activation" or not check.ok:
                checks.append(check)
    if compute_dtype == mixed.MIXED_DTYPE:  # the whole step: its loss against float32's
        name = str(tg.meta.get("loss", tg.outputs[0]))
        checks.insert(0, _compare(name, "loss", view(name), env[name], compute_dtype))
        first = first or (None if checks[0].ok else name)
    ok = first is None
    summary = {
        "ops": len(tg.ops),
        "program_ops": len(program.ops),
        "collectives": program.summary()["collectives"],
        "compared": len(checks),
        **getattr(blocks, "summary", {}),  # the torch backend's own (torchdist.TorchBlocks)
    }
    return VerifyReport(ok, compute_dtype, checks, first, summary)


#: The mesh axis that pipelines (`passes.pipeline`).
PIPELINE_AXIS = "pp"


def reference_env(graph: Graph, seed: int, compute_dtype: str, backend: str) -> dict[str, Array]:
    """The single-device reference of a verification in `compute_dtype` on `backend`: in
    that dtype, or for "bfloat16" in float32 from sources rounded to their declared dtypes
    (`runtime.mixed_precision`, which also refuses what cannot run mixed)."""
    if compute_dtype != mixed.MIXED_DTYPE:
        return run_reference(graph, seed=seed, compute_dtype=compute_dtype)
    mixed.check_mixed(graph, backend)
    return mixed.reference_env(graph, seed)


def micro_builder(graph: Graph) -> Callable[[int], Graph]:
    """Rebuilds `graph`'s model at a batch size (`shardlab.rebatch`: presets and models
    imported from Hugging Face configs; others are refused, naming the graph)."""
    if model_batch(graph) is None:
        model_at_batch(graph, 1)  # raises, naming the graph
    return lambda batch: model_at_batch(graph, batch)


def _verify_pipelined(
    graph: Graph,
    strategy: Strategy,
    optimizer: str,
    lr: float,
    compute_dtype: str,
    seed: int,
    backend: str,
    device: str,
) -> VerifyReport:
    """`verify` of a strategy with a `pp` axis: the pipeline its option `pipeline` says."""
    from shardlab.runtime.pipeline_exec import verify_pipeline  # it imports this module

    settings = PipelineOptions.from_options(
        strategy.options, strategy.mesh.axis_size(PIPELINE_AXIS)
    )
    return verify_pipeline(
        micro_builder(graph),
        strategy,
        microbatches=settings.microbatches,
        schedule=settings.schedule,
        virtual_stages=settings.virtual_stages,
        batch=int(model_batch(graph) or 0),
        optimizer=optimizer,
        lr=lr,
        compute_dtype=compute_dtype,
        seed=seed,
        axis=PIPELINE_AXIS,
        backend=backend,
        device=device,
    )
