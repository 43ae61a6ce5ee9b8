"""`shardlab calibrate`: the fits recover known constants from synthetic samples, and a quick
calibration writes a profile that `Cluster` loads and `shardlab plan --cluster` accepts."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from shardlab.cli import app
from shardlab.cost.clusters import Cluster, Link, load_cluster
from shardlab.cost.comm import factor, ring_time, steps
from shardlab.cost.compute import roofline_time
from shardlab.errors import ClusterError
from shardlab.runtime.calibrate import side_file
from shardlab.runtime.calibrate_fit import (
    MIN_ROOFLINE_S,
    cluster_of,
    fit_all,
    fit_line,
    fit_link,
    fit_matmul,
    fit_memory,
    fit_step_latency,
    kernel_scales,
    overlap_slowdown,
)
from shardlab.runtime.calibrate_measure import (
    COLLECTIVES,
    CommSample,
    ComputeSample,
    KernelSample,
    Measurements,
)

RATE, LAUNCH = 5e10, 3e-6  # matmul FLOP/s, per-op seconds
BANDWIDTH = 2e10  # bytes/s of elementwise ops
LINK_BW, LINK_LAT = 1.5e9, 4e-5


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
    kernels = [KernelSample("attention_grad", 2, 1e-3, 5e-2), KernelSample("neg", 1, 1e-8, 1e-5)]
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


def test_in_step_collectives_raise_the_latency_to_their_median_never_lower() -> None:
    isolated = Link(LINK_BW, LINK_LAT)
    size = 1 << 17
    bw_term = factor("all_reduce", 2) * size / LINK_BW  # 2 x (1/2) x size / bandwidth
    # three all-reduces of a step on 2 ranks (2 ring steps each) that waited on a peer
    waits = [3e-3, 5e-3, 9e-3]
    in_step = [CommSample("all_reduce", 2, size, bw_term + 2 * w) for w in waits]
    link, residuals = fit_step_latency(isolated, in_step)
    assert link.bandwidth == LINK_BW and link.latency == pytest.approx(5e-3)
    assert [r.predicted_s for r in residuals] == pytest.approx([bw_term + 1e-2] * 3)
    assert [round(r.error_pct, 6) for r in residuals] == pytest.approx(
        [(bw_term + 1e-2) / (bw_term + 2 * w) * 100 - 100 for w in waits]
    )
    quick = [CommSample("all_reduce", 2, size, bw_term)]  # faster than isolated: no change
    assert fit_step_latency(isolated, quick)[0] == isolated
    assert fit_step_latency(isolated, []) == (isolated, [])
    m = synthetic()
    m.step_comm = in_step
    assert cluster_of(fit_all(m), m, "c", "", 1e9).intra_node.latency == pytest.approx(5e-3)


def test_kernel_scale_is_measured_over_roofline_and_skips_unreadable_kinds() -> None:
    assert MIN_ROOFLINE_S > 1e-8
    assert kernel_scales(synthetic().kernels) == {"attention_grad": pytest.approx(50.0)}


def test_overlap_slowdown_is_the_relative_slowdown_within_bounds() -> None:
    assert overlap_slowdown((1e-3, 1.25e-3)) == pytest.approx(0.25)
    assert overlap_slowdown((1e-3, 0.9e-3)) == 0.0
    assert overlap_slowdown((1e-3, 5e-3)) == 1.0
    assert overlap_slowdown(None) == 0.0


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
    sets = ["layers=1", "hidden=64", "heads=4", "kv_heads=2", "ffn=128", "vocab=64", "seq=8"]
    args = ["plan", "llama3-8b", *[a for s in sets for a in ("--set", s)], "--mesh", "dp=2",
            "--template", "dp", "--cluster", str(out)]  # fmt: skip
    plan = runner.invoke(app, args)
    assert plan.exit_code == 0, plan.output
    assert "here" in plan.output
