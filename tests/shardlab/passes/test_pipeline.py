"""Pipeline parallelism: stage assignment, schedules, send/recv checks, and one training step
on the simulated mesh against the full batch on one device."""

from __future__ import annotations

import dataclasses

import pytest

from shardlab.autodiff import training_graph
from shardlab.errors import ExecutionError
from shardlab.ir import Graph, OpRole, TensorType
from shardlab.models import build_model
from shardlab.passes.pipeline import (
    PipelineError,
    PipelineProgram,
    assign_layers,
    build_pipeline,
    check_send_recv,
    microbatch_of,
    stage_of_scope,
)
from shardlab.runtime.pipeline_exec import verify_pipeline
from shardlab.strategy import Strategy

LLAMA = {"layers": 4, "hidden": 64, "heads": 4, "kv_heads": 2, "ffn": 128, "vocab": 64,
         "seq": 8, "batch": 8, "dtype": "float32"}  # fmt: skip
M = 4
PARAMS = 39  # embed, 4 x 9 per layer, final_norm, lm_head


def micro_model(**overrides: object) -> Graph:
    """The model of one micro-batch (batch 8 / 4 micro-batches)."""
    return build_model("llama3-8b", {**LLAMA, "batch": 8 // M, **overrides})


def pipeline(
    mesh: str = "pp=2,dp=2",
    templates: tuple[str, ...] = ("dp",),
    schedule: str = "1f1b",
    boundaries: list[int] | None = None,
    microbatches: int = M,
) -> PipelineProgram:
    strategy = Strategy.build(mesh, list(templates))
    return build_pipeline(
        micro_model(), strategy, microbatches=microbatches, schedule=schedule, boundaries=boundaries
    )


# -- one training step against one device ---------------------------------------------------


@pytest.mark.parametrize(
    ("mesh", "templates", "schedule", "virtual"),
    [
        ("pp=2,dp=2", ["dp"], "1f1b", None),
        ("pp=2,dp=2", ["dp"], "gpipe", None),
        ("pp=2,tp=2", ["megatron_tp"], "interleaved", 2),
        ("pp=4", [], "1f1b", None),
        ("pp=2,dp=2,tp=2", ["dp", "megatron_tp", "sequence_parallel"], "1f1b", None),
    ],
)
def test_pipelined_step_matches_one_device_float64(
    mesh: str, templates: list[str], schedule: str, virtual: int | None
) -> None:
    report = verify_pipeline(
        "llama3-8b",
        Strategy.build(mesh, templates),
        overrides=LLAMA,
        microbatches=M,
        schedule=schedule,
        virtual_stages=virtual,
        compute_dtype="float64",
    )
    assert report.ok, report.failed()[:3]
    # the loss, each accumulated gradient, each new parameter and its two AdamW moments
    assert report.summary["compared"] == 1 + PARAMS * 4
    assert {c.kind for c in report.checks} == {"loss", "grad", "param"}
    assert all(c.max_abs < 1e-10 for c in report.checks)


@pytest.mark.parametrize(
    ("mesh", "templates", "schedule"),
    [
        ("pp=2,dp=2", ["dp"], "1f1b"),
        ("pp=2,dp=2", ["dp"], "gpipe"),
        ("pp=2,tp=2", ["megatron_tp"], "interleaved"),
    ],
)
def test_pipelined_step_matches_one_device_float32(
    mesh: str, templates: list[str], schedule: str
) -> None:
    # SGD: AdamW's first step divides each gradient by its magnitude, which float32 cannot
    # reproduce for the few ~1e-8 gradients of this tiny model, pipelined or not.
    report = verify_pipeline(
        "llama3-8b",
        Strategy.build(mesh, templates),
        overrides=LLAMA,
        microbatches=M,
        schedule=schedule,
        optimizer="sgd",
        lr=0.1,
        compute_dtype="float32",
    )
    assert report.ok, report.failed()[:3]
    assert report.summary["compared"] == 1 + PARAMS * 2


def test_float32_adamw_loss_and_gradients_match() -> None:
    report = verify_pipeline(
        "llama3-8b",
        Strategy.build("pp=2,dp=2", ["dp"]),
        overrides=LLAMA,
        microbatches=M,
        compute_dtype="float32",
    )
    assert all(c.ok for c in report.checks if c.kind in ("loss", "grad"))


def test_the_runtime_splits_the_batch_and_needs_it_divisible() -> None:
    with pytest.raises(ExecutionError, match="does not split into 3"):
        verify_pipeline("llama3-8b", Strategy.build("pp=2", []), overrides=LLAMA, microbatches=3)


# -- stage assignment -----------------------------------------------------------------------


def test_layers_are_balanced_by_flops() -> None:
    training = training_graph(micro_model())
    assert assign_layers(training, 2).chunks == ((0, 2), (2, 4))
    assert assign_layers(training, 4).chunks == ((0, 1), (1, 2), (2, 3), (3, 4))
    assert [assign_layers(training, 2).stage_of_layer(i) for i in range(4)] == [0, 0, 1, 1]
    # a large vocabulary makes lm_head + loss as heavy as several layers: fewer layers there
    heavy_head = training_graph(micro_model(vocab=4096))
    first, last = assign_layers(heavy_head, 2).chunks
    assert first[1] - first[0] > last[1] - last[0]


def test_given_boundaries_are_respected_and_checked() -> None:
    training = training_graph(micro_model())
    assert assign_layers(training, 2, boundaries=[1]).chunks == ((0, 1), (1, 4))
    p = pipeline("pp=2", (), boundaries=[3])
    assert [s["layers"] for s in p.summary()["stages"]] == [[0, 1, 2], [3]]
    for bad in ([0], [4], [1, 2]):
        with pytest.raises(PipelineError, match="boundaries"):
            assign_layers(training, 2, boundaries=bad)
    with pytest.raises(PipelineError, match="every chunk needs a layer"):
        assign_layers(training, 8)


def test_ops_run_on_the_stage_of_their_scope() -> None:
    p = pipeline()
    a = p.assignment
    scopes = ("embed", "rope", "layers.1.mlp", "layers.2.attn", "final_norm", "lm_head", "loss")
    assert [stage_of_scope(scope, a) for scope in scopes] == [0, 0, 0, 1, 1, 1, 1]
    assert stage_of_scope("", a) is None  # unscoped ops follow their data
    for s, stage in enumerate(p.stages):
        for op in stage.ops:
            # per-micro-batch ops (forward, backward, send/recv) run on the stage of the forward
            # op's scope; ops needing no data (rope_cache) run on every stage that reads them
            if op.scope and microbatch_of(op.name) is not None:
                assert stage_of_scope(op.scope, a) == s, (s, op.name)
            if op.role == OpRole.OPTIMIZER:  # the parameter's stage
                assert stage_of_scope(op.inputs[0].rsplit(".", 1)[0], a) == s, (s, op.name)
    optimizers = [sum(op.role == OpRole.OPTIMIZER for op in st.ops) for st in p.stages]
    assert optimizers == [1 + 2 * 9, 2 * 9 + 2]  # each optimizer op once, on its stage


def test_send_recv_counts_are_crossing_values_times_microbatches() -> None:
    interleaved = pipeline("pp=2,tp=2", ("megatron_tp",), schedule="interleaved")
    for p in (pipeline(), pipeline("pp=4", ()), interleaved):
        for s, info in enumerate(p.summary()["stages"]):
            assert info["sends"] == M * sum(c.src == s for c in p.crossing)
            assert info["recvs"] == M * sum(c.dst == s for c in p.crossing)
    p = pipeline()
    # the residual stream goes forward once, its gradient comes back once, per micro-batch
    assert [(c.value, c.src, c.dst) for c in p.crossing] == [
        ("layers.1.mlp_residual", 0, 1),
        ("layers.1.mlp_residual.grad", 1, 0),
    ]
    for s, stage in enumerate(p.stages):
        for op in stage.ops:
            if op.kind in ("send", "recv"):
                assert op.stream == "comm:pp" and op.role == OpRole.COMM
                assert op.attrs["peer_stage"] == 1 - s
                assert microbatch_of(op.attrs["tag"]) == op.attrs["microbatch"]


def _forwards_before_first_backward(p: PipelineProgram, s: int) -> set[int]:
    seen: set[int] = set()
    for op in p.stages[s].ops:
        m = microbatch_of(op.name)
        if op.role == OpRole.BACKWARD and m is not None:
            return seen
        if op.role in (OpRole.FORWARD, OpRole.LOSS) and m is not None:
            seen.add(m)
    return seen


def test_1f1b_warms_up_with_pp_minus_1_minus_s_forwards() -> None:
    p = pipeline("pp=4", ())
    for s in range(4):
        warm = 4 - 1 - s
        phases = "".join(u.phase for u in p.units[s])
        assert phases == "F" * warm + "FB" * (M - warm) + "B" * warm
        # the ops follow the units: warm-up forwards, one more forward, then a backward
        assert _forwards_before_first_backward(p, s) == set(range(warm + 1))
    assert p.summary()["bubble_fraction"] == pytest.approx(3 / (M + 3))


def test_gpipe_runs_all_forwards_first_and_interleaving_cuts_the_bubble() -> None:
    g = pipeline(schedule="gpipe")
    for s in range(2):
        assert "".join(u.phase for u in g.units[s]) == "F" * M + "B" * M
        assert _forwards_before_first_backward(g, s) == set(range(M))
    i = pipeline("pp=2,tp=2", ("megatron_tp",), schedule="interleaved")
    assert [info["layers"] for info in i.summary()["stages"]] == [[0, 2], [1, 3]]
    assert [len(u) for u in i.units] == [2 * 2 * M, 2 * 2 * M]  # F and B, 2 chunks, M each
    assert i.summary()["bubble_fraction"] == pytest.approx(1 / (2 * M + 1))
    assert g.summary()["bubble_fraction"] == pytest.approx(1 / (M + 1))
    with pytest.raises(PipelineError, match="divisible"):
        pipeline(schedule="interleaved", microbatches=3)


def test_gradients_accumulate_and_the_optimizer_runs_once() -> None:
    p = pipeline()
    names = [op.name for op in p.stages[1].ops]
    assert "lm_head.weight.adamw" in names and "lm_head.weight.adamw#0" not in names
    adds = [n for n in names if n.startswith("lm_head.weight.grad.acc_add#")]
    assert adds == [f"lm_head.weight.grad.acc_add#{m}" for m in range(1, M)]
    # the data-parallel all-reduce of the gradient runs once, on the sum
    reduces = [
        op for op in p.stages[1].ops if op.kind == "all_reduce" and "lm_head.weight" in op.name
    ]
    assert len(reduces) == 1 and reduces[0].inputs == ("lm_head.weight.grad.acc",)
    seeds = [op for op in p.stages[1].ops if op.name == "loss.grad_seed"]
    assert len(seeds) == 1 and seeds[0].attrs["value"] == pytest.approx(1 / M)


# -- send/recv check ------------------------------------------------------------------------


def _first(p: PipelineProgram, stage: int, kind: str) -> int:
    return next(i for i, op in enumerate(p.stages[stage].ops) if op.kind == kind)


def test_a_recv_with_the_wrong_shape_is_caught() -> None:
    p = pipeline()
    stage = p.stages[1]
    recv = stage.ops[_first(p, 1, "recv")]
    value = recv.outputs[0]
    t = stage.types[value]
    wrong = TensorType((t.shape[0] * 2, *t.shape[1:]), t.dtype)
    p.stages[1] = dataclasses.replace(stage, types={**stage.types, value: wrong})
    with pytest.raises(PipelineError) as err:
        check_send_recv(p)
    assert err.value.code == "invalid_pipeline"
    send = f"send:{recv.attrs['tag']}->1"
    assert send in err.value.message and recv.name in err.value.message
    assert "float32[2,8,64]" in err.value.message  # local shape of the wrong recv (dp=2)


def test_a_missing_recv_is_caught() -> None:
    p = pipeline()
    i = _first(p, 1, "recv")
    recv = p.stages[1].ops[i]
    p.stages[1] = dataclasses.replace(
        p.stages[1], ops=p.stages[1].ops[:i] + p.stages[1].ops[i + 1 :]
    )
    with pytest.raises(PipelineError, match="no matching recv on stage 1") as err:
        check_send_recv(p)
    assert f"send:{recv.attrs['tag']}->1" in err.value.message
    assert "reads it" in err.value.message  # and the op on stage 1 that needed it


def test_a_schedule_order_that_deadlocks_is_caught() -> None:
    p = pipeline()
    ops = list(p.stages[0].ops)
    recv = ops.pop(_first(p, 0, "recv"))  # stage 0 waits for a gradient before any forward
    p.stages[0] = dataclasses.replace(p.stages[0], ops=[recv, *ops])
    with pytest.raises(PipelineError, match="deadlock") as err:
        check_send_recv(p)
    message = err.value.message
    assert recv.name in message and f"send:{recv.attrs['tag']}->0" in message
    assert "stage 1 waits in recv" in message  # and stage 1 waits for stage 0's activation


# -- what is refused ------------------------------------------------------------------------


def test_templates_on_the_pipeline_axis_are_refused() -> None:
    with pytest.raises(PipelineError, match="pipeline axis"):
        build_pipeline(micro_model(), Strategy.build("pp=2,dp=2", ["dp:pp"]), microbatches=M)
