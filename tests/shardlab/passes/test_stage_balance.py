"""Stage partition by the cost model's time: the dynamic program gives the stage with the
head and the loss fewer layers, and the pipelined step is no slower than equal layer
counts (Megatron-LM's) or the FLOPs balance."""

from __future__ import annotations

import pytest

from shardlab.models import build_model
from shardlab.passes.pipeline_schedule import PipelineError
from shardlab.plan import build_plan
from shardlab.strategy import Strategy

# a large vocabulary: the head and the loss weigh as much as a layer or more
SHAPE = {"layers": 8, "hidden": 1024, "heads": 8, "kv_heads": 8, "ffn": 2816, "vocab": 128256,
         "seq": 1024, "batch": 16}  # fmt: skip


def _plan(balance: str, cluster: str | None = "h100-sxm-1x8"):
    strategy = Strategy.build("pp=4,dp=2", ["dp"], options={
        "pipeline": {"schedule": "1f1b", "microbatches": 8, "balance": balance}})  # fmt: skip
    return build_plan(build_model("llama3-8b", SHAPE), strategy, cluster=cluster)


def test_time_balance_lightens_the_last_stage_and_steps_no_slower():
    even, flops, timed = _plan("even"), _plan("flops"), _plan("time")
    layers = [len(timed.pipeline.assignment.layers_of_stage(s)) for s in range(4)]
    assert sum(layers) == 8 and layers[-1] < 2  # the head's stage holds fewer layers
    assert even.pipeline.assignment.chunks == ((0, 2), (2, 4), (4, 6), (6, 8))
    step = timed.pipeline.cost.step_time
    assert step <= even.pipeline.cost.step_time
    assert step <= flops.pipeline.cost.step_time * 1.005
    assert timed.pipeline.summary()["balance"] == "time"


def test_time_balance_needs_a_cluster():
    with pytest.raises(PipelineError, match="balance 'time' needs a cluster"):
        _plan("time", cluster=None)
