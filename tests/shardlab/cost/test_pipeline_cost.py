"""cost_pipeline: a hand-checked two-stage timeline, and the tiny llama pipeline."""

from __future__ import annotations

import dataclasses

import pytest

from shardlab.autodiff import training_graph
from shardlab.cost.clusters import load_cluster
from shardlab.cost.comm import collective_time
from shardlab.cost.compute import model_flops
from shardlab.cost.pipeline_cost import cost_pipeline
from shardlab.ir import OpRole, TensorType
from shardlab.models import build_model
from shardlab.passes.pipeline import PipelineProgram, build_pipeline
from shardlab.passes.send_wait import pipeline_send_wait, with_send_waits
from shardlab.placement import DistSpec, Replicate
from shardlab.program import DistOp, DistProgram
from shardlab.strategy import Strategy

LLAMA = {"layers": 4, "hidden": 64, "heads": 4, "kv_heads": 2, "ffn": 128, "vocab": 64,
         "seq": 8, "batch": 2, "dtype": "float32"}  # fmt: skip
CLUSTER = dataclasses.replace(load_cluster("h100-sxm-8x8"), overlap_slowdown=0.0)  # by hand
F, B = 1e-3, 2e-3  # seconds of every forward / backward compute op in the hand-checked case


@pytest.fixture(scope="module")
def tiny() -> tuple[PipelineProgram, object]:
    model = build_model("llama3-8b", LLAMA)
    strategy = Strategy.build("pp=2,dp=2", ["dp"])
    return build_pipeline(model, strategy, microbatches=4), training_graph(model)


def _op(
    name: str,
    kind: str,
    ins: tuple[str, ...],
    outs: tuple[str, ...],
    attrs: dict[str, object] | None = None,
    deps: tuple[str, ...] = (),
) -> DistOp:
    stream = "comm:pp" if kind in ("send", "recv") else "compute"
    role = OpRole.BACKWARD if name.startswith("b") else OpRole.FORWARD
    if kind in ("send", "recv"):
        role = OpRole.COMM
    return DistOp(name, kind, ins, outs, stream, role, attrs=attrs or {}, deps=deps)


def _p2p(kind: str, tag: str, peer: int, dep: str | None = None) -> DistOp:
    value, m = tag.split("#")
    ins, outs = ((tag,), ()) if kind == "send" else ((), (tag,))
    attrs = {"peer_stage": peer, "tag": tag, "value": value, "microbatch": int(m)}
    return _op(f"{kind}:{tag}", kind, ins, outs, attrs=attrs, deps=(dep,) if dep else ())


def two_stages(base: PipelineProgram) -> PipelineProgram:
    """Stage 0: f0 send x0 f1 send x1 recv g0 b0 recv g1 b1; stage 1 answers each x with g."""
    t = TensorType((1024, 1024), "float32")
    s0 = [
        _op("f#0", "relu", ("a",), ("x#0",)),
        _p2p("send", "x#0", 1, "f#0"),
        _op("f#1", "relu", ("a",), ("x#1",)),
        _p2p("send", "x#1", 1, "f#1"),
    ]
    for m in (0, 1):
        s0 += [
            _p2p("recv", f"x.grad#{m}", 1),
            _op(f"b#{m}", "relu", (f"x.grad#{m}",), (f"d#{m}",), deps=(f"recv:x.grad#{m}",)),
        ]
    s1 = []
    for m in (0, 1):
        s1 += [
            _p2p("recv", f"x#{m}", 0),
            _op(f"f#{m}", "relu", (f"x#{m}",), (f"y#{m}",), deps=(f"recv:x#{m}",)),
            _op(f"b#{m}", "relu", (f"y#{m}",), (f"x.grad#{m}",), deps=(f"f#{m}",)),
            _p2p("send", f"x.grad#{m}", 0, f"b#{m}"),
        ]
    stages = []
    for s, ops in enumerate((s0, s1)):
        mesh = base.stages[s].mesh
        values = {v for op in ops for v in (*op.inputs, *op.outputs)}
        specs = {v: DistSpec(mesh, (Replicate(),)) for v in values}
        stages.append(DistProgram(mesh, ops, dict.fromkeys(values, t), specs, {}))
    return dataclasses.replace(base, stages=stages, microbatches=2)


def _times(stage: int, op: DistOp) -> float:
    return F if op.name.startswith("f") else B


def test_two_stage_timeline_by_hand(tiny: tuple[PipelineProgram, object]) -> None:
    pipe = two_stages(tiny[0])
    ranks = [p.mesh.ranks[0] for p in pipe.stages]
    assert ranks == [0, 2]  # one node: the intra-node link
    T = collective_time("send", 1024 * 1024 * 4, (0, 2), CLUSTER)
    link = CLUSTER.intra_node
    assert pytest.approx(link.latency + 4 * 2**20 / link.bandwidth) == T
    assert T < F
    training = training_graph(build_model("llama3-8b", LLAMA))
    cost = cost_pipeline(pipe, training, CLUSTER, compute_time=_times)
    # stage 1: f0 [1+T, 2+T] b0 [.., 4+T] send g0 [.., 4+2T]; recv x1 queues behind it on
    # comm:pp, so f1 [4+2T, 5+2T] b1 [.., 7+2T] send g1 [.., 7+3T]; stage 0 b1 ends 9+3T.
    ends = {e.name: e.end for e in cost.timeline.events_of(2)}
    assert ends["s1/send:x.grad#0"] == pytest.approx(4 * 1e-3 + 2 * T)
    assert cost.step_time == pytest.approx(9e-3 + 3 * T)
    assert cost.busy == pytest.approx([6e-3, 6e-3])
    assert cost.bubble_fraction == pytest.approx(1 - 6e-3 / (9e-3 + 3 * T))
    # the baseline's wait delays stage 0's second forward by one send time
    base = cost_pipeline(with_send_waits(pipe), training, CLUSTER, compute_time=_times)
    starts = {e.name: e.start for e in base.timeline.events_of(0)}
    assert starts["s0/f#1"] == pytest.approx(F + T)
    assert {e.name: e.start for e in cost.timeline.events_of(0)}["s0/f#1"] == pytest.approx(F)
    opt, summary = pipeline_send_wait(pipe)
    assert (summary.waits_removed, summary.holds_added) == (2, 2)
    assert cost_pipeline(opt, training, CLUSTER, compute_time=_times).step_time == pytest.approx(
        cost.step_time
    )


def test_tiny_llama_pipeline_cost(tiny: tuple[PipelineProgram, object]) -> None:
    pipe, training = tiny
    cost = cost_pipeline(pipe, training, CLUSTER)  # type: ignore[arg-type]
    assert cost.tokens == 4 * 2 * 8
    assert cost.model_flops == 4 * model_flops(training)  # type: ignore[arg-type]
    assert 0 < cost.bubble_fraction < 1
    assert cost.step_time >= max(cost.busy) > 0
    assert cost.summary()["stage_ranks"] == [0, 2]
    base = cost_pipeline(with_send_waits(pipe), training, CLUSTER)  # type: ignore[arg-type]
    opt = cost_pipeline(pipeline_send_wait(pipe)[0], training, CLUSTER)  # type: ignore[arg-type]
    assert opt.step_time <= base.step_time
