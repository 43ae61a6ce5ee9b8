"""Where the data-parallel passes put what they move: local steps on the compute stream, the
second step of a cross-stream chain left in place; and that this avoids the stream stalls
that once made fusion slow the llama3-8b dp=8,tp=8 plan down."""

from __future__ import annotations

import dataclasses

from shardlab.cost.clusters import load_cluster
from shardlab.cost.model import cost_program
from shardlab.ir import OpRole
from shardlab.models import build_model
from shardlab.passes.data_parallel import dp_fuse_allreduce, dp_overlap
from shardlab.passes.dp_streams import (
    COMPUTE_STREAM,
    is_local_step,
    local_on_compute,
    waits_on_other_comm_stream,
)
from shardlab.placement import Partial, Replicate, Shard
from shardlab.plan import build_plan
from shardlab.program import DistOp
from shardlab.reshard import CommStep
from shardlab.strategy import Strategy


def _comm(name: str, kind: str, axis: str, inputs: tuple[str, ...]) -> DistOp:
    step = CommStep(kind, axis, None, Partial("sum"), Replicate(), 8.0, "test")  # type: ignore[arg-type]
    return DistOp(name, kind, inputs, (f"{name}.out",), f"comm:{axis}", OpRole.COMM, comm=step)


def test_local_steps_go_to_the_compute_stream_and_nothing_else_does() -> None:
    local = _comm("slice", "local_slice", "tp", ("g",))
    collective = _comm("ar", "all_reduce", "dp", ("g",))
    compute = DistOp("mm", "matmul", ("a", "b"), ("c",), COMPUTE_STREAM, OpRole.BACKWARD)
    assert is_local_step(local) and not is_local_step(collective) and not is_local_step(compute)
    assert local_on_compute(local) == dataclasses.replace(local, stream=COMPUTE_STREAM)
    assert local_on_compute(collective) is collective and local_on_compute(compute) is compute


def test_a_step_that_reads_a_collective_of_another_stream_waits_on_it() -> None:
    first = _comm("rs", "reduce_scatter", "dp", ("g",))
    made_by = {
        "rs.out": first,
        "g": DistOp("mk", "matmul", (), ("g",), COMPUTE_STREAM, OpRole.BACKWARD),
    }
    assert waits_on_other_comm_stream(_comm("ar", "all_reduce", "tp", ("rs.out",)), made_by)
    assert not waits_on_other_comm_stream(_comm("ag", "all_gather", "dp", ("rs.out",)), made_by)
    assert not waits_on_other_comm_stream(_comm("ar2", "all_reduce", "tp", ("g",)), made_by)
    local = _comm("slice", "local_slice", "tp", ("g",))
    assert not waits_on_other_comm_stream(_comm("ar3", "all_reduce", "dp", ("slice.out",)),
                                          {**made_by, "slice.out": local})  # fmt: skip


def test_the_passes_move_tensor_parallel_gradient_slices_onto_the_compute_stream() -> None:
    graph = build_model("llama3-8b", {"layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2,
                                      "ffn": 128, "vocab": 64, "seq": 8, "batch": 8})  # fmt: skip
    plan = build_plan(graph, Strategy.build("dp=2,tp=2", ["dp", "megatron_tp"]), passes=False)
    lowered = {op.name: op for op in plan.program.ops if is_local_step(op)}
    for fn in (dp_fuse_allreduce, dp_overlap):
        program = fn(plan.program, plan.training, {}).program
        for op in program.ops:
            if op.name in lowered and op.attrs.get("consumer") in ("adamw", "sgd"):
                assert op.stream == COMPUTE_STREAM, (fn.__name__, op.name)
            elif op.name in lowered:  # forward / backward slices stay where lowering put them
                assert op.stream == lowered[op.name].stream


def test_gradient_slices_on_a_comm_stream_would_stall_it() -> None:
    """The diagnosis, as a regression test: the fused program of a dp x tp + sp plan costs no
    more with its moved gradient slices on the compute stream than back on `comm:tp`."""
    graph = build_model("llama3-8b", {"layers": 2, "batch": 8})
    strategy = Strategy.build("dp=2,tp=4", ["dp", "megatron_tp", "sequence_parallel"])
    plan = build_plan(graph, strategy, passes=False)
    fused = dp_fuse_allreduce(plan.program, plan.training, {}).program
    moved = [op for op in fused.ops if is_local_step(op) and op.stream == COMPUTE_STREAM]
    on_tp = [
        dataclasses.replace(op, stream=f"comm:{op.comm.axis}") if op in moved and op.comm else op
        for op in fused.ops
    ]
    cluster = load_cluster("h100-sxm-1x8")
    ours = cost_program(fused, plan.training, cluster).step_time
    stalled = cost_program(dataclasses.replace(fused, ops=on_tp), plan.training, cluster)
    assert ours <= stalled.step_time
    assert all(isinstance(op.comm.dst if op.comm else None, Shard | Replicate) for op in moved)
