"""The published rows of the fidelity benchmark agree with themselves: each parallel
configuration multiplies to its GPU count and fits its schedule, and wherever a paper gives
a number twice (time and MFU, time and speedup, parameters and name) the two agree."""

from __future__ import annotations

import itertools

import pytest

from bench.fidelity_data import (
    A100_PEAK,
    CALIBRATION_ROWS,
    GPT_1T,
    GPT_175B,
    GPT_530B,
    LAYER_ROWS,
    ROWS,
    TABLE4_OVERHEADS,
    TABLE5_SPEEDUPS,
    EndToEndRow,
)


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.key)
def test_each_configuration_multiplies_to_its_gpus_and_fits_its_schedule(row: EndToEndRow) -> None:
    p = row.parallel
    assert p.tp * p.pp * p.dp == row.gpus
    assert p.global_batch % (p.dp * p.micro_batch) == 0
    assert row.model.layers % (p.pp * p.virtual_stages) == 0
    assert row.model.hidden % row.model.heads == 0 and row.model.heads % p.tp == 0
    assert (p.pp == 1) == (p.schedule == "none")
    if p.schedule == "interleaved":
        assert p.virtual_stages > 1 and p.microbatches % p.pp == 0
    else:
        assert p.virtual_stages == 1
    assert 0 < row.tflops * 1e12 < A100_PEAK
    assert row.time_s > 0


def test_named_sizes_are_eq2_parameter_counts() -> None:
    """Narayanan et al.'s Table 2 names 174.6B and 529.6B, Table 1 1008.0B."""
    for shape, billions in ((GPT_175B, 174.6), (GPT_530B, 529.6), (GPT_1T, 1008.0)):
        assert shape.parameters() / 1e9 == pytest.approx(billions, abs=0.05)


@pytest.mark.parametrize("row", [r for r in ROWS if r.mfu is not None], ids=lambda r: r.key)
def test_korthikanti_times_agree_with_their_mfu_and_hfu(row: EndToEndRow) -> None:
    """MFU = model FLOPs / (time x GPUs x 312 TFLOP/s), within the rounding of a time given
    to 3-4 digits; HFU / MFU = 1 + s/(6h) (the recomputed attention core, section 6.3)."""
    assert row.iteration_s is not None and row.hfu is not None and row.mfu is not None
    mfu = row.model.model_flops(row.parallel.global_batch) / (
        row.iteration_s * row.gpus * A100_PEAK
    )
    assert mfu == pytest.approx(row.mfu, abs=0.003)
    ratio = 1 + row.model.seq / (6 * row.model.hidden)
    assert row.hfu == pytest.approx(row.mfu * ratio, abs=0.002)


def test_table5_times_agree_with_the_stated_speedups() -> None:
    times = {(r.model.name, r.parallel.recompute): r.time_s for r in ROWS if r.key[:3] == "k22"}
    for name, speedup in TABLE5_SPEEDUPS.items():
        assert times[(name, "full")] / times[(name, "selective")] - 1 == pytest.approx(
            speedup, abs=0.002
        )


def test_table4_sums_agree_with_the_stated_overheads() -> None:
    rows = {r.key: r for r in LAYER_ROWS}
    base = rows["t4-baseline"].forward_ms + rows["t4-baseline"].backward_ms
    for key, overhead in TABLE4_OVERHEADS.items():
        total = rows[key].forward_ms + rows[key].backward_ms
        assert total / base - 1 == pytest.approx(overhead, abs=0.005)


def test_eq3_times_and_tflops_agree() -> None:
    """Narayanan et al.'s rows give TFLOP/s; the time is eq. 3 FLOPs / (GPUs x TFLOP/s) and
    gives the TFLOP/s back; at a fixed batch, doubling the GPUs nearly halves the time."""
    table2 = [r for r in ROWS if r.flops_formula == "eq3"]
    assert len(table2) == 6
    for row in table2:
        assert row.model.eq3_flops(row.parallel.global_batch) / (
            row.gpus * row.time_s
        ) == pytest.approx(row.tflops * 1e12)
    for a, b in itertools.pairwise(table2):
        if a.model == b.model:
            assert b.gpus == 2 * a.gpus and 0.5 < b.time_s / a.time_s < 0.56


def test_calibration_rows_are_rows() -> None:
    keys = {r.key for r in ROWS} | {r.key for r in LAYER_ROWS}
    assert set(CALIBRATION_ROWS) <= keys
    assert len({r.key for r in ROWS}) == len(ROWS)
