"""The DTensor export issues exactly the collectives the plan priced (issue 34, item 9).

Gloo ranks apply the generated module to the tiny Llama (`dtensor_ranks.TinyLlama`, the
preset's FQNs) and run one training step (forward, backward, SGD) under a dispatch mode
that records every collective torch issues (`dtensor_ranks.count_job`): DTensor's
functional collectives (`_c10d_functional::*`, also those DTensor issues inside an op) and
FSDP2's c10d calls (`c10d::_allgather_base_`, `_reduce_scatter_base_`, `allreduce_`).
`torch.distributed.tensor.debug.CommDebugMode` would see DTensor's only.

The plan's side (`priced`) is its program's comm ops (what `shardlab plan` prints as
"communication: ...") plus the all-reduces its vocab-parallel cross entropy issues inside
the op (`cost.kernel_comm.MIDOP_REDUCTIONS`). Both sides are tallied per (kind, mesh axis):
count and bytes, the bytes being what one rank moves in a ring (an all-gather's output
x (n-1)/n, a reduce-scatter's input x (n-1)/n, an all-reduce's input x 2(n-1)/n), as the
plan prices them (`reshard._step_bytes`). One unit is grouped: FSDP2 gathers (and
reduce-scatters) all parameters of an FSDP unit in one collective, where the plan prices
one per parameter; the plan's parameter collectives on the data axes are counted once per
(unit, forward or backward), the bytes summed. Counts and bytes must be equal: no
tolerance is needed, every parameter of the tiny model divides over the ranks (FSDP2 pads
nothing).

The model runs in bfloat16 as the plan's (tensor parallelism), or holds float32 masters
that the module's `MixedPrecisionPolicy` gathers and reduces in bfloat16 (FSDP), as the
plan gathers its bf16 parameters and reduces bf16 gradients.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pytest

from shardlab.cost.kernel_comm import midop_bytes
from shardlab.export.dtensor import DTensorExport, derive_export, render_dtensor
from shardlab.ir import OpRole
from shardlab.models import build_model
from shardlab.plan import Plan, build_plan
from shardlab.reshard import COLLECTIVES
from shardlab.strategy import Strategy

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed")

from tests.shardlab.export.dtensor_ranks import TinyConfig, count_job  # noqa: E402

CFG = TinyConfig()
TINY = {"layers": CFG.layers, "hidden": CFG.hidden, "heads": CFG.heads,
        "kv_heads": CFG.kv_heads, "ffn": CFG.ffn, "vocab": CFG.vocab, "seq": CFG.seq,
        "batch": CFG.batch}  # fmt: skip

Tally = dict[tuple[str, str], list[float]]  # (kind, axis) -> [count, bytes]


def _unit(export: DTensorExport, scope: str) -> str:
    """The FSDP unit (or replicate's one unit) a parameter's module belongs to."""
    if export.fsdp_axis is None:
        return ""
    for unit in (*export.fsdp_units, *export.fsdp_tail):
        if scope == unit or scope.startswith(unit + "."):
            return unit if unit in export.fsdp_units else "tail"
    return "root"


def priced(plan: Plan, export: DTensorExport, loss: bool = False) -> tuple[Tally, list[str]]:
    """The plan's comm ops per (kind, axis), parameter collectives on the data axes once
    per (FSDP unit, pass); `loss`: the all-reduces inside its vocab-parallel cross entropy
    instead; and each one's line (for the failure message)."""
    program = plan.program
    data = {*export.data_axes, *([export.fsdp_axis] if export.fsdp_axis else [])}
    modules = {p.name: p.module for p in export.params}
    params = set(modules)
    first_backward = next(i for i, op in enumerate(program.ops) if op.role == OpRole.BACKWARD)
    out: Tally = defaultdict(lambda: [0, 0.0])
    seen: set[tuple[str, str, str, bool]] = set()
    lines = []
    for i, op in enumerate(program.ops):
        if op.comm is not None and op.comm.kind in COLLECTIVES and not loss:
            key = (op.comm.kind, op.comm.axis)
            moves = op.inputs[0].split("@")[0].split(".grad")[0].split("~")[0]
            group = (*key, _unit(export, modules.get(moves, op.scope)), i > first_backward)
            if op.comm.axis in data and moves in params and group in seen:
                out[key][1] += op.comm.bytes_per_rank
            else:
                seen.add(group)
                out[key][0] += 1
                out[key][1] += op.comm.bytes_per_rank
            lines.append(f"  {op.comm.kind} {op.comm.axis} {op.comm.bytes_per_rank:.0f} "
                         f"{op.attrs.get('from')}->{op.attrs.get('to')} {op.name}")  # fmt: skip
        for axes, size in midop_bytes(program, op) if loss else []:
            (axis,) = axes  # one vocab axis in these cases
            n = program.mesh.axis_size(axis)
            out[("all_reduce", axis)][0] += 1
            out[("all_reduce", axis)][1] += 2 * (n - 1) / n * size
            lines.append(f"  all_reduce {axis} {size:.0f} B in {op.kernel} {op.name}")
    return dict(out), lines


def issued(calls: list[dict[str, Any]], loss: bool = False) -> tuple[Tally, list[str]]:
    """Rank 0's collectives per (kind, axis), bytes as the plan prices a ring: those of the
    cross entropy's forward (`loss`; torch's loss_parallel backward issues none), or all
    others."""
    out: Tally = defaultdict(lambda: [0, 0.0])
    lines = []
    for c in calls:
        if (c["phase"] == "loss") != loss:
            continue
        n, b = c["size"], c["bytes"]
        ring = 2 * (n - 1) / n * b if c["kind"] == "all_reduce" else (n - 1) / n * b
        out[(c["kind"], c["axis"])][0] += 1
        out[(c["kind"], c["axis"])][1] += ring
        lines.append(f"  {c['phase']} {c['kind']} {c['axis']} {ring:.0f}")
    return dict(out), lines


def run_counts(mesh: str, templates: list[str], masters: bool = False,
               loss: bool = False) -> tuple[Tally, Tally, str]:  # fmt: skip
    from shardlab.runtime.torch_launch import spawn

    plan = build_plan(build_model("llama3-8b", TINY), Strategy.build(mesh, templates),
                      optimizer="sgd", lr=0.1, passes=False)  # fmt: skip
    export = derive_export(plan)
    batch_axes = [a for a in export.mesh_axes if a in export.data_axes or a == export.fsdp_axis]
    common = {"source": render_dtensor(plan), "cfg": CFG, "batch_axes": batch_axes,
              "bf16": not masters}  # fmt: skip
    ranks = spawn(count_job, common, [None] * plan.strategy.mesh.size, timeout_s=180)
    want, plan_lines = priced(plan, export, loss)
    got, torch_lines = issued(ranks[0], loss)
    report = "\n".join(["plan:", *plan_lines, "torch (rank 0):", *torch_lines])
    return want, got, report


def _rounded(tally: Tally) -> dict[tuple[str, str], tuple[int, int]]:
    return {k: (int(c), round(b)) for k, (c, b) in sorted(tally.items())}


#: Under sequence parallelism both sides gather each column-parallel input again in backward
#: for the weight gradient (Megatron-LM's: the plan keeps the sequence-sharded input, and the
#: export's saved-tensor hooks have autograd keep it too). Under fsdp x megatron_tp both
#: keep the embedding gradient vocab-sharded, and reduce a sequence-parallel norm's weight
#: gradient over tp (whole) before reduce-scattering it over dp, as FSDP2 does.
#: (name, mesh, templates, float32 masters with the module's bf16 mixed precision, xfail)
CASES = [
    ("tp", "tp=2", ["megatron_tp"], False, None),
    ("tp_sp", "tp=2", ["megatron_tp", "sequence_parallel"], False, None),
    ("fsdp", "dp=2", ["fsdp"], True, None),
    ("dp_tp", "dp=2,tp=2", ["dp", "megatron_tp"], True, None),
    ("fsdp_tp", "dp=2,tp=2", ["fsdp", "megatron_tp", "sequence_parallel"], False, None),
    ("hsdp", "dpr=2,dps=2", ["dp:dpr", "fsdp:dps"], True, None),
]  # fmt: skip


@pytest.mark.parametrize(
    ("mesh", "templates", "masters"),
    [pytest.param(m, t, f, id=n, marks=[pytest.mark.xfail(strict=True, reason=why)] if why else [])
     for n, m, t, f, why in CASES],
)  # fmt: skip
def test_the_export_issues_the_plans_collectives(
    mesh: str, templates: list[str], masters: bool
) -> None:
    """Every collective of the step but the cross entropy's: equal count and bytes per kind
    and mesh axis."""
    want, got, report = run_counts(mesh, templates, masters)
    assert _rounded(got) == _rounded(want), report


def test_the_vocab_parallel_loss_issues_the_plans_all_reduces() -> None:
    """torch's loss_parallel() all-reduces the max and the sum of exp (float32) and the
    target logit (bf16) in forward and nothing in backward, as the plan prices it."""
    want, got, report = run_counts("tp=2", ["megatron_tp"], loss=True)
    assert _rounded(got) == _rounded(want), report
