"""The cost model on uneven shards: collectives are charged the padded (largest-block)
message, as NCCL's equal-block collectives move it, and memory counts the largest block.

gpt2 with an odd vocab (257) on tp=4: the embedding table's blocks are 65, 65, 65, 62 rows;
a batch of 6 on dp=4: 2, 2, 2, 0 sequences (DTensor's torch.chunk layout).
"""

from __future__ import annotations

import math

import pytest

from shardlab.cost.memory import memory_profile
from shardlab.ir import DTYPE_BYTES, ValueKind
from shardlab.mesh import Mesh
from shardlab.models import build_model
from shardlab.placement import DistSpec, is_even, local_shape, local_shape_on
from shardlab.plan import build_plan
from shardlab.reshard import plan_transition
from shardlab.strategy import Strategy

GPT2 = {"layers": 1, "hidden": 32, "heads": 4, "seq": 8, "batch": 6, "vocab": 257}


def test_an_uneven_all_gather_is_charged_the_padded_message() -> None:
    mesh = Mesh((4,), ("tp",))
    src, dst = DistSpec.parse("S(0)", mesh), DistSpec.replicated(mesh)
    (step,) = plan_transition((257, 32), "float32", mesh, src, dst)
    padded = 65 * 32 * 4  # every rank sends the largest block: 65 rows
    assert step.bytes_per_rank == pytest.approx(3 / 4 * 4 * padded)
    assert step.bytes_per_rank > 3 / 4 * 257 * 32 * 4  # more than the real rows would move
    (scatter,) = plan_transition((257, 32), "float32", mesh, DistSpec.parse("P(sum)", mesh), src)
    assert scatter.bytes_per_rank == pytest.approx(3 / 4 * 257 * 32 * 4)  # the full input


def test_every_uneven_collective_of_a_plan_is_priced_on_the_largest_block() -> None:
    # the batch annotated as the dp template would (the template refuses an uneven batch)
    batch = ["tokens=S(0)", "labels=S(0)"]
    plan = build_plan(build_model("gpt2", GPT2), Strategy.build("dp=4", [], batch))
    program = plan.program
    gathers = [
        op for op in program.ops
        if op.comm is not None and op.comm.kind == "all_gather"
        and not is_even(program.types[op.inputs[0]].shape, program.mesh,
                        program.specs[op.inputs[0]].placements)
    ]  # fmt: skip
    assert gathers
    for op in gathers:
        t, spec = program.types[op.inputs[0]], program.specs[op.inputs[0]]
        block = (
            math.prod(local_shape(t.shape, program.mesh, spec.placements)) * DTYPE_BYTES[t.dtype]
        )
        assert op.comm is not None
        assert op.comm.bytes_per_rank == pytest.approx(3 / 4 * 4 * block)


def test_memory_counts_the_largest_block_on_every_rank() -> None:
    plan = build_plan(build_model("gpt2", GPT2), Strategy.build("tp=4", ["megatron_tp"]))
    program, training = plan.program, plan.training
    first, last = memory_profile(program, training, 0), memory_profile(program, training, 3)
    assert first.model_state == last.model_state
    table = next(v for v in training.values if training.type_of(v).shape == (257, 32)
                 and training.value(v).kind == ValueKind.PARAM)  # fmt: skip
    t, spec = program.types[table], program.specs[table]
    assert str(spec) == "S(0)"
    assert local_shape(t.shape, program.mesh, spec.placements) == (65, 32)
    assert local_shape_on(t.shape, program.mesh, spec.placements, 3) == (62, 32)  # 65 x3, 62
    params = sum(
        math.prod(local_shape(program.types[v].shape, program.mesh, program.specs[v].placements))
        * DTYPE_BYTES[program.types[v].dtype]
        for v in training.values
        if training.value(v).kind == ValueKind.PARAM and training.producer(v) is None
    )
    assert first.model_state["parameters"] == params
