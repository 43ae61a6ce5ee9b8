"""`shardlab calibrate`: the fits recover known constants from synthetic samples, and a quick
calibration writes a profile that `Cluster` loads and `shardlab plan --cluster` accepts."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from shardlab.cli import app
from shardlab.cost.clusters import Cluster, Link, load_cluster
from shardlab.cost.comm import factor, ring_time, steps
from shardlab.cost.compute import roofline_time
from shardlab.errors import ClusterError
from shardlab.models import build_model
from shardlab.plan import Plan, build_plan
from shardlab.runtime import hazards as hz
from shardlab.runtime.calibrate import side_file
from shardlab.runtime.calibrate_fit import (
    MAX_SLOWDOWN,
    MIN_ROOFLINE_S,
    cluster_of,
    fit_all,
    fit_comm_scales,
    fit_line,
    fit_link,
    fit_matmul,
    fit_memory,
    fit_op_overhead,
    kernel_fits,
    kernel_scales,
    overlap_slowdown,
)
from shardlab.runtime.calibrate_measure import (
    COLLECTIVES,
    CommSample,
    ComputeSample,
    KernelSample,
    Measurements,
    StepSample,
)
from shardlab.runtime.calibrate_steps import (
    REFERENCE_STEPS,
    RefRun,
    hop_samples,
    median_run,
    straggle_of,
)
from shardlab.runtime.measure import Measurement, is_comm
from shardlab.runtime.measure_pipeline import executable_pipeline
from shardlab.runtime.torch_rank import RankTiming
from shardlab.strategy import Strategy

RATE, LAUNCH = 5e10, 3e-6  # matmul FLOP/s, per-op seconds
BANDWIDTH = 2e10  # bytes/s of elementwise ops
LINK_BW, LINK_LAT = 1.5e9, 4e-5
TINY = {"layers": 1, "hidden": 32, "heads": 4, "kv_heads": 2, "ffn": 64, "vocab": 64, "seq": 8,
        "batch": 4, "dtype": "float32"}  # fmt: skip


def matmuls(dtype: str = "float32", rate: float = RATE) -> list[ComputeSample]:
    return [ComputeSample("matmul", dtype, n, 2 * n**3, 12 * n * n, LAUNCH + 2 * n**3 / rate)
            for n in (64, 128, 256, 512)]  # fmt: skip


def adds() -> list[ComputeSample]:
    return [ComputeSample("elementwise", "float32", n, n, 12 * n, LAUNCH + 12 * n / BANDWIDTH)
            for n in (1 << 10, 1 << 14, 1 << 18, 1 << 22)]  # fmt: skip


def collectives(nproc: int = 4) -> list[CommSample]:
    return [
        CommSample(kind, n, size, LINK_LAT * steps(kind, n) + factor(kind, n) * size / LINK_BW)
        for n in range(2, nproc + 1)
        for kind in COLLECTIVES
        for size in (1 << 12, 1 << 16, 1 << 20, 1 << 22)
    ]


def synthetic(nproc: int = 4) -> Measurements:
    # attention_grad's two ops span too few sizes for a fixed cost: its scale is the ratio
    points = ((4e-4, 2e-2), (6e-4, 3e-2))
    kernels = [KernelSample("attention_grad", 2, 1e-3, 5e-2, points),
               KernelSample("neg", 1, 1e-8, 1e-5)]  # fmt: skip
    return Measurements(nproc, "float32", matmuls() + adds(), collectives(nproc), (1e-3, 1.25e-3),
                        kernels)  # fmt: skip


def test_fit_line_recovers_intercept_and_slope() -> None:
    line = fit_line([1.0, 2.0, 4.0, 8.0], [3.5, 4.0, 5.0, 7.0])
    assert line.intercept == pytest.approx(3.0) and line.slope == pytest.approx(0.5)


def test_fit_line_with_negative_intercept_goes_through_the_origin() -> None:
    line = fit_line([1.0, 2.0, 4.0], [0.5, 1.5, 3.5])
    assert line.intercept == 0.0 and line.slope > 0


def test_matmul_fit_recovers_the_rate() -> None:
    peak, eff, residuals = fit_matmul(matmuls())
    assert peak * eff == pytest.approx(RATE, rel=1e-9)
    assert 0 < eff <= 1
    assert all(abs(r.error_pct) < 1e-6 for r in residuals)


def test_memory_fit_recovers_bandwidth_and_launch_overhead() -> None:
    hbm, eff, launch, residuals = fit_memory(adds())
    assert hbm * eff == pytest.approx(BANDWIDTH, rel=1e-9)
    assert launch == pytest.approx(LAUNCH, rel=1e-6)
    assert all(abs(r.error_pct) < 1e-6 for r in residuals)


def test_link_fit_recovers_bandwidth_and_latency_over_kinds_and_group_sizes() -> None:
    link, residuals = fit_link(collectives())
    assert link.bandwidth == pytest.approx(LINK_BW, rel=1e-9)
    assert link.latency == pytest.approx(LINK_LAT, rel=1e-9)
    assert len(residuals) == 3 * 4 * 4 and all(abs(r.error_pct) < 1e-6 for r in residuals)


def test_in_step_collectives_give_each_kind_its_factor_over_the_isolated_ring() -> None:
    isolated = Link(LINK_BW, LINK_LAT)
    small, large = 1 << 12, 1 << 20
    ring = {(k, z): ring_time(k, z, 2, isolated) for k in COLLECTIVES for z in (small, large)}
    # all_reduces took 2x and 4x their ring time (summed: 3x if both sizes weigh alike);
    # reduce_scatters 5x; all_gather and all_to_all were not seen inside a step
    in_step = [
        CommSample("all_reduce", 2, small, 2 * ring[("all_reduce", small)]),
        CommSample("all_reduce", 2, large, 4 * ring[("all_reduce", large)]),
        CommSample("reduce_scatter", 2, large, 5 * ring[("reduce_scatter", large)]),
        CommSample("all_gather", 2, large, 0.0),  # not timed: left out
    ]
    scales, residuals = fit_comm_scales(isolated, in_step)
    ar_small, ar_large = ring[("all_reduce", small)], ring[("all_reduce", large)]
    expected = (2 * ar_small + 4 * ar_large) / (ar_small + ar_large)
    assert scales == {"all_reduce": pytest.approx(expected), "reduce_scatter": pytest.approx(5.0)}
    assert [r.label for r in residuals] == [
        f"in step: all_reduce n=2 {small} B",
        f"in step: all_reduce n=2 {large} B",
        f"in step: reduce_scatter n=2 {large} B",
    ]
    assert residuals[2].error_pct == pytest.approx(0.0, abs=1e-9)
    assert residuals[0].predicted_s == pytest.approx(expected * ar_small)
    assert fit_comm_scales(isolated, []) == ({}, [])
    m = synthetic()
    m.step_comm = in_step
    cluster = cluster_of(fit_all(m), m, "c", "", 1e9)
    assert cluster.comm_scale == {k: pytest.approx(v, rel=1e-9) for k, v in scales.items()}
    assert cluster.intra_node.latency == pytest.approx(LINK_LAT)  # the isolated link, kept


def test_op_overhead_explains_the_steps_beyond_the_model_and_is_never_negative() -> None:
    overhead = 40e-6
    # three steps the model predicts without overhead; k: step growth per second of it
    shapes = [("a", 100, 0.020, 90.0), ("b", 120, 0.030, 60.0), ("c", 80, 0.015, 80.0)]
    samples = [StepSample(label, ops, pred + overhead * k, pred, k)
               for label, ops, pred, k in shapes]  # fmt: skip
    got, residuals = fit_op_overhead(samples)
    assert got == pytest.approx(overhead, rel=1e-9)
    assert [r.label for r in residuals] == ["step: a", "step: b", "step: c"]
    assert all(abs(r.error_pct) < 1e-6 for r in residuals)
    # noisy steps: least squares on relative error lands between the per-step overheads
    noisy = [StepSample("a", 100, 0.020 + 30e-6 * 90, 0.020, 90.0),
             StepSample("b", 120, 0.030 + 50e-6 * 60, 0.030, 60.0)]  # fmt: skip
    assert 30e-6 < fit_op_overhead(noisy)[0] < 50e-6
    faster = [StepSample("a", 100, 0.015, 0.020, 90.0)]  # measured below the model: no overhead
    assert fit_op_overhead(faster)[0] == 0.0
    assert fit_op_overhead([]) == (0.0, [])
    m = synthetic()
    m.steps = samples
    assert cluster_of(fit_all(m), m, "c", "", 1e9).op_overhead == pytest.approx(overhead)
    assert cluster_of(fit_all(synthetic()), synthetic(), "c", "", 1e9).op_overhead == 0.0


def test_kernel_scale_is_measured_over_roofline_and_skips_unreadable_kinds() -> None:
    assert MIN_ROOFLINE_S > 1e-8
    assert kernel_scales(synthetic().kernels) == {"attention_grad": pytest.approx(50.0)}


def test_overlap_slowdown_is_the_relative_slowdown_within_bounds() -> None:
    assert overlap_slowdown((1e-3, 1.25e-3)) == pytest.approx(0.25)
    assert overlap_slowdown((1e-3, 0.9e-3)) == 0.0
    assert overlap_slowdown((1e-3, 50e-3)) == MAX_SLOWDOWN
    assert overlap_slowdown(None) == 0.0


def test_contention_solves_the_timelines_slowdown_and_takes_precedence() -> None:
    # compute 2 ms and a collective 2 ms alone; at once 3 ms: 1 ms ran side by side, so
    # compute got half its speed while the collective ran (2 / (1 + s) = 1)
    assert overlap_slowdown(None, (2e-3, 2e-3, 3e-3)) == pytest.approx(1.0)
    assert overlap_slowdown((1e-3, 1.25e-3), (2e-3, 2e-3, 2e-3)) == 0.0  # fully side by side
    assert overlap_slowdown(None, (2e-3, 2e-3, 4e-3)) == MAX_SLOWDOWN  # one after the other
    assert overlap_slowdown(None, (2e-3, 2e-3, 5e-3)) == MAX_SLOWDOWN  # worse than that
    assert overlap_slowdown((1e-3, 1.25e-3), (0.0, 2e-3, 2e-3)) == pytest.approx(0.25)


def test_fitted_cluster_predicts_the_samples_it_was_fitted_on(tmp_path: Path) -> None:
    m = synthetic()
    cluster = cluster_of(fit_all(m), m, "mine", "synthetic", 2**30)
    assert (cluster.nodes, cluster.devices_per_node) == (1, 4)
    assert cluster.launch_overhead == pytest.approx(LAUNCH, rel=1e-6)
    assert cluster.overlap_slowdown == pytest.approx(0.25)
    # an elementwise add of 4 MiB: memory-bound, as fitted
    n = 1 << 22
    assert roofline_time("add", n, 12 * n, "float32", cluster) == pytest.approx(
        LAUNCH + 12 * n / BANDWIDTH, rel=1e-6
    )
    assert ring_time("all_reduce", 1 << 20, 4, cluster.intra_node) == pytest.approx(
        3 * 2 * LINK_LAT + 1.5 * (1 << 20) / LINK_BW, rel=1e-9
    )
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(cluster.to_json()))
    assert load_cluster(str(path)) == cluster
    assert load_cluster(str(path)).kernel_scale == {"attention_grad": pytest.approx(50.0)}


def test_kernel_scale_multiplies_only_its_kinds_and_presets_have_none() -> None:
    gpu = load_cluster("h100-sxm-8x8")
    assert gpu.kernel_scale == {} and "kernel_scale" not in gpu.to_json()
    scaled = Cluster.from_json({**gpu.to_json(), "kernel_scale": {"add": 3.0}})
    base = roofline_time("add", 10**6, 12 * 10**6, "bfloat16", gpu) - gpu.launch_overhead
    got = roofline_time("add", 10**6, 12 * 10**6, "bfloat16", scaled) - gpu.launch_overhead
    assert got == pytest.approx(3 * base)
    assert roofline_time("mul", 10**6, 12 * 10**6, "bfloat16", scaled) == roofline_time(
        "mul", 10**6, 12 * 10**6, "bfloat16", gpu
    )
    with pytest.raises(ClusterError, match=r"kernel_scale\.add"):
        Cluster.from_json({**gpu.to_json(), "kernel_scale": {"add": -1}})


def test_measurements_round_trip_through_json() -> None:
    m = synthetic()
    m.step_comm = [CommSample("reduce_scatter", 2, 1 << 16, 1e-3)]
    m.steps = [StepSample("llama zero2", 128, 0.03, 0.02, 56.0)]
    m.contention = (2e-3, 2e-3, 4e-3)
    m.straggle = 0.2
    assert Measurements.from_json(json.loads(json.dumps(m.to_json()))) == m


@pytest.mark.timeout(120)
def test_quick_calibration_writes_a_profile_plan_accepts(tmp_path: Path) -> None:
    pytest.importorskip("torch.distributed")
    runner = CliRunner()
    out = tmp_path / "here.json"
    got = runner.invoke(app, ["calibrate", "-o", str(out), "--nproc", "2", "--quick"])
    assert got.exit_code == 0, got.output
    assert "fit residuals" in got.output and "all_reduce n=2" in got.output
    cluster = load_cluster(str(out))
    assert cluster.name == "here" and cluster.source == "shardlab calibrate"
    assert (cluster.nodes, cluster.devices_per_node) == (1, 2)
    assert math.isfinite(cluster.intra_node.bandwidth) and cluster.kernel_scale
    raw = json.loads(side_file(out).read_text())
    assert raw["comm"] and raw["compute"] and raw["kernels"] and raw["residuals"]
    # the reference steps: every collective kind the templates issue, the pipeline's sends,
    # and their residuals (the pipelined step is no op_overhead sample: six flat ones)
    kinds = {"all_reduce", "all_gather", "reduce_scatter", "send"}
    assert {s["kind"] for s in raw["step_comm"]} == kinds
    assert set(cluster.comm_scale) == kinds
    assert cluster.op_overhead >= 0 and len(raw["steps"]) == 6 and raw["contention"]
    assert raw["straggle"] is not None and cluster.straggle == raw["straggle"] >= 0
    labels = {r["sample"] for r in raw["residuals"]}
    assert "step: llama zero2" in labels and "in step: reduce_scatter" in " ".join(labels)
    assert "step: llama pp 1F1B" in labels and "in step: send n=2" in " ".join(labels)
    assert "comm_scale" in got.output and "step: llama fsdp" in got.output
    assert "straggle" in got.output
    sets = ["layers=1", "hidden=64", "heads=4", "kv_heads=2", "ffn=128", "vocab=64", "seq=8"]
    args = ["plan", "llama3-8b", *[a for s in sets for a in ("--set", s)], "--mesh", "dp=2",
            "--template", "dp", "--cluster", str(out)]  # fmt: skip
    plan = runner.invoke(app, args)
    assert plan.exit_code == 0, plan.output
    assert "here" in plan.output


def test_a_reference_keeps_its_median_round() -> None:
    """A burst of load slows one round; the reference keeps the median one."""
    runs = [SimpleNamespace(measured_s=t) for t in (0.030, 0.090, 0.031)]
    assert median_run(runs).measured_s == 0.031  # type: ignore[arg-type]
    assert median_run(runs[:2]).measured_s == 0.030  # type: ignore[arg-type]


def test_a_kinds_fixed_cost_and_rate_are_told_apart() -> None:
    """Ops of one kind at several sizes: measured = 40 us + 2 x roofline is recovered; a kind
    measured at one size only keeps the ratio of its sums."""
    sizes = [1e-5, 4e-5, 1.6e-4, 6.4e-4]
    adamw = [(w, 40e-6 + 2.0 * w) for w in sizes]
    silu = [(5e-5, 3e-4), (5e-5, 3e-4)]
    samples = [
        KernelSample("adamw", 4, sum(sizes), sum(m for _, m in adamw), tuple(adamw)),
        KernelSample("silu", 2, 1e-4, 6e-4, tuple(silu)),
    ]
    scales, fixed = kernel_fits(samples)
    assert scales["adamw"] == pytest.approx(2.0) and fixed["adamw"] == pytest.approx(40e-6)
    assert scales["silu"] == pytest.approx(6.0) and "silu" not in fixed
    # the fit transfers to sizes it never saw; the ratio of the sums does not
    for w in (1e-6, 1e-2):
        assert fixed["adamw"] + scales["adamw"] * w == pytest.approx(40e-6 + 2.0 * w)
    ratio = kernel_scales(samples)["adamw"]
    assert ratio * 1e-6 < 0.1 * (40e-6 + 2e-6) and ratio * 1e-2 > 1.05 * (40e-6 + 2e-2)
    gpu = load_cluster("h100-sxm-8x8")
    cluster = Cluster.from_json({**gpu.to_json(), "kernel_overhead": fixed})
    assert cluster.kernel_overhead == fixed and "kernel_overhead" not in gpu.to_json()
    got = roofline_time("adamw", 0, 10**6, "float32", cluster)
    assert got == pytest.approx(roofline_time("adamw", 0, 10**6, "float32", gpu) + 40e-6)
    with pytest.raises(ClusterError, match=r"kernel_overhead\.adamw"):
        Cluster.from_json({**gpu.to_json(), "kernel_overhead": {"adamw": -1}})


def _timed_run(plan: Plan, ranks: dict[int, RankTiming], pipelined: bool = False) -> RefRun:
    """A reference run of `plan` whose ranks 'measured' `ranks`."""
    ref = next(r for r in REFERENCE_STEPS if r.pipelined == pipelined)
    pipeline = executable_pipeline(plan) if pipelined else None
    return RefRun(ref, plan, Measurement(plan.program, ranks, 1, 0, pipeline))


def test_straggle_is_the_slowest_ranks_compute_beyond_its_ops_own_times() -> None:
    """Every compute op takes 1 us on both ranks (its median over the steps); in each step
    one rank or the other lost time slices: the slowest rank's compute per step, 1.5 x, 1.2 x
    and 2 x the ops' sum, has median 1.5 x: straggle 0.5. Steps whose compute adds up to
    their ops' times give none, and shorter ones never a negative one."""
    plan = build_plan(build_model("llama3-8b", TINY), Strategy.build("dp=2", ["dp"]),
                      cluster="cpu-local")  # fmt: skip
    names = [op.name for op in plan.program.ops]
    ops = sum(1 for op in plan.program.ops if not is_comm(op) and op.kind not in hz.SYNC_KINDS)

    def timing(rank: int, *per_op_ns: int) -> RankTiming:
        return RankTiming(rank, {}, dict.fromkeys(names, 1000),
                          compute_ns=[ops * ns for ns in per_op_ns])  # fmt: skip

    late = {0: timing(0, 1500, 1000, 1000), 1: timing(1, 1000, 1200, 2000)}
    assert straggle_of([_timed_run(plan, late)]) == pytest.approx(0.5)
    even = {0: timing(0, 1000, 1000), 1: timing(1, 1000, 1000)}
    assert straggle_of([_timed_run(plan, even)]) == pytest.approx(0.0, abs=1e-9)
    fast = {0: timing(0, 500), 1: timing(1, 800)}
    assert straggle_of([_timed_run(plan, fast)]) == 0.0


def test_a_hop_runs_from_the_senders_issue_to_the_waiting_receivers_completion() -> None:
    """Two ranks on pp=2, clocks of one host: a hop counts only where the receiver was
    already waiting, from the send's issue to the recv's end."""
    strategy = Strategy.build("pp=2", [], [], {"pipeline": {"schedule": "1f1b",
                                                            "microbatches": 2}})  # fmt: skip
    plan = build_plan(build_model("llama3-8b", {**TINY, "layers": 2}), strategy,
                      cluster="cpu-local")  # fmt: skip
    stages = executable_pipeline(plan).stages
    (first, second, *_) = [op for op in stages[0].ops if op.kind == "send"]
    recvs = {op.attrs["tag"]: op.name for op in stages[1].ops if op.kind == "recv"}
    spans0 = {op.name: (0, 0) for op in stages[0].ops}
    spans1 = {op.name: (0, 0) for op in stages[1].ops}
    spans0[first.name] = (1_000, 1_200)  # issued at 11_000 on the host's clock
    spans1[recvs[first.attrs["tag"]]] = (0, 3_000)  # waiting since 10_500, done at 13_500
    spans0[second.name] = (5_000, 5_100)  # issued at 15_000
    spans1[recvs[second.attrs["tag"]]] = (6_000, 6_100)  # posted at 16_500: not waiting
    ranks = {0: RankTiming(0, spans0, {}, t0_ns=10_000), 1: RankTiming(1, spans1, {}, t0_ns=10_500)}
    hops = hop_samples(_timed_run(plan, ranks, pipelined=True))
    size = 4 * TINY["seq"] * TINY["hidden"] * TINY["batch"] // 2  # one micro-batch, float32
    assert [(h.kind, h.ranks, h.size) for h in hops] == [("send", 2, size)]
    assert hops[0].seconds == pytest.approx(2_500e-9)
