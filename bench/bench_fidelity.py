"""Fidelity of the cost model: predicted iteration time and TFLOP/s per GPU of Megatron-LM on
DGX A100 clusters against the published measurements (`bench.fidelity_data`).

Every row is planned whole (every layer, every stage; nothing extrapolated) with the paper's
own model, parallel configuration, schedule and recomputation (`bench.fidelity_predict`) on
`a100-80g-<nodes>x8`, and reported with its error. The preset's `matmul_efficiency` was fitted
on Korthikanti et al.'s Table 4 (one 22B layer, `CALIBRATION_ROWS`); every end-to-end row is
held out. A row misses when its time is off by more than `MISS`; the report then names the
term of the model that explains it, with the numbers that show it.

`python -m bench.bench_fidelity` runs this benchmark alone and rewrites its section of
docs/performance.md (`make bench` rewrites the whole file).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

from bench.common import Section
from bench.fidelity_data import (
    CALIBRATION_ROWS,
    LAYER_ROWS,
    ROWS,
    EndToEndRow,
    LayerRow,
)
from bench.fidelity_predict import (
    LayerPrediction,
    Prediction,
    cluster_for,
    predict,
    predict_layer,
)

#: |error| above which a row misses (the goal: median |error| <= 10%, none beyond 25%).
MISS = 0.10
TITLE = "Fidelity: predicted vs published Megatron-LM iteration times (DGX A100 80GB)"
HEADER = ["row", "source", "configuration", "published", "published TFLOP/s/GPU", "predicted",
          "predicted TFLOP/s/GPU", "error", "compute / recompute / bubble / tail",
          "peak memory per GPU", "planned in", "explaining term (misses)"]  # fmt: skip
OUTPUT = Path(__file__).resolve().parent.parent / "docs" / "performance.md"
#: Each row's key -> the row and its prediction.
Results = dict[str, tuple[EndToEndRow, Prediction]]


def configuration(row: EndToEndRow) -> str:
    """`t8 p8 d1 (64 GPUs), batch 64 = 64 x mb 1, interleaved v=3, selective + SP, bf16`."""
    p = row.parallel
    schedule = {"none": "no pipeline", "1f1b": "1F1B"}.get(p.schedule, p.schedule)
    if p.schedule == "interleaved":
        schedule += f" v={p.virtual_stages}"
    memory = {"none": "no recompute"}.get(p.recompute, f"{p.recompute} recompute")
    return (
        f"t{p.tp} p{p.pp} d{p.dp} ({row.gpus} GPUs), batch {p.global_batch} = "
        f"{p.microbatches} x mb {p.micro_batch}, {schedule}, {memory}"
        + (" + SP" if p.sequence_parallel else "")
        + f", {row.dtype}"
    )


def error(row: EndToEndRow, pred: Prediction) -> float:
    """Relative error of the predicted iteration time."""
    return pred.time_s / row.time_s - 1


def _share(pred: Prediction) -> str:
    t = pred.terms
    return " / ".join(
        f"{t[k] / pred.time_s:.1%}" for k in ("compute", "recompute", "bubble", "tail")
    )


def explain(row: EndToEndRow, pred: Prediction, results: Results) -> str:
    """The term of the model that explains a miss, with the numbers that show it ("" for a
    row within MISS)."""
    err = error(row, pred)
    if abs(err) <= MISS:
        return ""
    twin = _twin(row, results)
    if twin is not None:
        twin_row, twin_pred = twin
        first_row, first_pred = _first_of_series(row, results)
        grown = err - error(first_row, first_pred)
        return (
            f"compute efficiency (2021 software): the 2022 run of the same {row.model.name} "
            f"layers with full recompute ({twin_row.key}) is predicted "
            f"{error(twin_row, twin_pred):+.1%}, "
            f"the smallest 2021 run ({first_row.key}) {error(first_row, first_pred):+.1%}; "
            f"{grown:+.1%} more appears as data parallelism grows to {row.gpus} GPUs "
            f"({row.parallel.microbatches} micro-batches: predicted bubble "
            f"{pred.terms['bubble'] / pred.time_s:.1%}, tail with the DP all-reduce "
            f"{pred.terms['tail'] / pred.time_s:.1%} of the step)"
        )
    units = (row.time_s - pred.terms["bubble"] - pred.terms["tail"]) / pred.terms["compute"] - 1
    return f"compute efficiency: the units would have to run {units:+.1%} slower"


def _twin(row: EndToEndRow, results: Results) -> tuple[EndToEndRow, Prediction] | None:
    """For a 2021 row, the 2022 full-recompute run of the same model."""
    if row.flops_formula != "eq3":
        return None
    key = f"k22-{row.model.name}-full"
    return results.get(key)


def _first_of_series(row: EndToEndRow, results: Results) -> tuple[EndToEndRow, Prediction]:
    same = [v for v in results.values() if v[0].source == row.source and v[0].model == row.model]
    return min(same, key=lambda v: v[0].gpus)


def table_row(row: EndToEndRow, pred: Prediction, note: str) -> list[str]:
    """One line of the table (HEADER)."""
    tflops = row.flops() / (row.gpus * pred.time_s) / 1e12
    memory = f"{pred.peak_memory_bytes / 1e9:.1f} GB" + ("" if pred.fits else " (over 80 GB)")
    return [row.key, row.source, configuration(row), f"{row.time_s:.2f} s",
            f"{row.tflops:.1f}", f"{pred.time_s:.2f} s", f"{tflops:.1f}",
            f"{error(row, pred):+.1%}", _share(pred), memory, f"{pred.plan_s:.1f} s",
            note]  # fmt: skip


def layer_table(layers: Sequence[tuple[LayerRow, LayerPrediction]]) -> list[str]:
    """Korthikanti et al.'s Table 4 against the prediction, as Markdown lines."""
    lines = ["| Table 4 (22B layer, t 8, mb 4) | published fwd / bwd | predicted fwd / bwd "
             "| error fwd / bwd |", "|---|---|---|---|"]  # fmt: skip
    for row, got in layers:
        lines.append(
            f"| {row.label} | {row.forward_ms:.1f} / {row.backward_ms:.1f} ms | "
            f"{got.forward_ms:.2f} / {got.backward_ms:.2f} ms | "
            f"{got.forward_ms / row.forward_ms - 1:+.1%} / "
            f"{got.backward_ms / row.backward_ms - 1:+.1%} |"
        )
    return lines


def _layer_errors(layers: Sequence[tuple[LayerRow, LayerPrediction]]) -> list[float]:
    out = []
    for row, got in layers:
        out += [got.forward_ms / row.forward_ms - 1, got.backward_ms / row.backward_ms - 1]
    return out


def run() -> Section:
    """Plan every row, compare, and write the section."""
    started = time.perf_counter()
    layers = [(row, predict_layer(row)) for row in LAYER_ROWS]
    results: Results = {}
    for row in ROWS:
        results[row.key] = (row, predict(row))
    section = Section(TITLE, HEADER)
    for row, pred in results.values():
        section.rows.append(table_row(row, pred, explain(row, pred, results)))
    section.notes += notes(results, layers, time.perf_counter() - started)
    return section


def notes(
    results: Results, layers: Sequence[tuple[LayerRow, LayerPrediction]], elapsed: float
) -> list[str]:
    """Summary, calibration, memory check, what the model leaves out, Table 4."""
    errors = {k: error(r, p) for k, (r, p) in results.items()}
    worst = max(errors, key=lambda k: abs(errors[k]))
    misses = sorted(k for k, e in errors.items() if abs(e) > MISS)
    layer_errs = _layer_errors(layers)
    fits = all(p.fits for _, p in results.values())
    peak = max(results.values(), key=lambda v: v[1].peak_memory_bytes)
    flops = [
        p.model_flops / r.model.model_flops(r.parallel.global_batch) - 1
        for r, p in results.values()
    ]
    blocking = [
        (r.key, p.p2p_per_microbatch_s * p.microbatches / p.time_s)
        for r, p in results.values() if p.p2p_per_microbatch_s
    ]  # fmt: skip
    top = max(blocking, key=lambda kv: kv[1])
    rows_2022 = [e for k, e in errors.items() if k.startswith("k22")]
    rows_2021 = [e for k, e in errors.items() if k.startswith("n21")]
    faster = sum(e < 0 for e in errors.values())
    outside, optimizer_s = _outside_layers(results, layers)
    return [
        f"**Held-out end-to-end rows: median |error| {_median_abs(errors.values()):.1%}, max "
        f"{abs(errors[worst]):.1%} ({worst}); {len(misses)} of {len(errors)} beyond "
        f"{MISS:.0%}: {', '.join(misses) or 'none'}.** Korthikanti et al. 2022 rows: median "
        f"|error| {_median_abs(rows_2022):.1%}; Narayanan et al. 2021 rows: "
        f"{_median_abs(rows_2021):.1%}. {faster} of {len(errors)} predictions are faster "
        f"than the measurement, the others within {max(errors.values()):.1%}: the model leaves "
        "out work the runs did (below).",
        "",
        "Configurations: "
        + "; ".join(sorted({r.config_source for r, _ in results.values()}))
        + ". Model: the `gpt` preset at each size (vocabulary 51200, sequence 2048, ffn 4h, "
        "eager attention with dropout 0.1), mesh pp x dp x tp with tp inside a node, "
        "templates dp + megatron_tp (+ sequence_parallel), layers split evenly over the "
        "chunks; embeddings tied without a pipeline, untied with one.",
        "",
        f"Calibration: `matmul_efficiency` of the `a100-80g` preset (0.76) was fitted on the "
        f"{len(CALIBRATION_ROWS)} Table 4 rows below ({', '.join(CALIBRATION_ROWS)}): their "
        f"ten times are now within {max(abs(e) for e in layer_errs):.1%} (median "
        f"{_median_abs(layer_errs):.1%}). Every end-to-end row above is held out; no other "
        "constant was fitted (bandwidths, latencies, `memory_efficiency` are datasheet-based "
        "estimates).",
        "",
        f"Memory: every row's predicted peak per GPU (the worst pipeline stage) "
        f"{'fits' if fits else 'does NOT fit'} 80 GB - the largest is "
        f"{peak[1].peak_memory_bytes / 1e9:.1f} GB ({peak[0].key}) - consistent with the "
        "published runs having run.",
        "",
        "Published times: Korthikanti et al. give seconds per iteration (TFLOP/s here = their "
        "model FLOPs, 72Bslh^2(1 + s/6h + V/12lh), per GPU per second: MFU x 312); Narayanan "
        "et al. give TFLOP/s per GPU by their eq. 3 (recomputation included), so their time is "
        "eq. 3 FLOPs / (GPUs x TFLOP/s); predicted TFLOP/s use the same formula over the "
        "predicted time. Shardlab's own model-FLOP count is within "
        f"{max(abs(f) for f in flops):.1%} of the paper formula on every row. Columns: step "
        "shares of the busiest stage's forward/backward units (compute, tensor-parallel comm "
        "included), the replayed forward within them (recompute), its idle time in the schedule "
        "(bubble: fill, drain, waits on sends) and the optimizer with the data-parallel "
        "all-reduce before it (tail).",
        "",
        "What the model leaves out (each would make a prediction slower, none is fitted): "
        "(1) Megatron-LM up to 2022 blocks on every pipeline send/receive (batch_isend_irecv, "
        "wait, cuda synchronize); Shardlab's schedule sends eagerly. Blocking would add at most "
        f"{top[1]:.1%} of the step ({top[0]}). (2) The optimizer phase beyond Adam: gradient-"
        "norm clipping, the fp32 -> 16-bit parameter copy and zeroing the fp32 gradient buffer "
        f"(~14 bytes per parameter: {optimizer_s * 1e3:.0f} ms per iteration at 22B on 8 "
        "GPUs), data loading and per-iteration framework time: the 22B run with selective "
        "recompute + SP spends "
        f"{outside[0] * 1e3:.0f} ms outside its 48 layers (1.10 s end to end less 48 x the "
        f"Table 4 layer), the prediction {outside[1] * 1e3:.0f} ms. (3) The word-embedding "
        "gradient all-reduce between the first and last stage (embeddings are untied where "
        "pp > 1; V x h / 8 fp32 values between two nodes, ~30 ms).",
        "",
        "Left out: Narayanan et al.'s Table 1 (weak scaling 1.7B-1T) gives neither micro-batch "
        "sizes nor chunks per stage (the authors' scripts in Megatron-LM `examples/sc21` do). "
        "The 1T rows of Korthikanti et al. are planned with 1F1B (2 layers per stage; the "
        "interleaved schedule is stated for 175B and 530B): with two chunks per stage the "
        "first stage's predicted peak would be above 80 GB.",
        "",
        *layer_table(layers),
        "",
        f"Planning all rows took {elapsed:.0f} s on this machine (the planned-in column: model "
        "build, completion, lowering, passes and the cost of every stage, per row).",
    ]


def _outside_layers(
    results: Results, layers: Sequence[tuple[LayerRow, LayerPrediction]]
) -> tuple[tuple[float, float], float]:
    """Seconds the 22B present-work iteration spends outside its layers, published and
    predicted (iteration less layers x Table 4's layer), and what ~14 more optimizer bytes
    per parameter would cost per GPU at the preset's achieved HBM bandwidth."""
    row, pred = results["k22-22B-present"]
    table4, got = next((r, g) for r, g in layers if r.key == "t4-selective-sp")
    n = row.model.layers
    published = row.time_s - n * (table4.forward_ms + table4.backward_ms) / 1e3
    predicted = pred.time_s - n * (got.forward_ms + got.backward_ms) / 1e3
    cluster = cluster_for(row.gpus)
    per_gpu = row.model.parameters() / (row.parallel.tp * row.parallel.pp)
    optimizer = 14 * per_gpu / (cluster.hbm_bandwidth * cluster.memory_efficiency)
    return (published, predicted), optimizer


def _median_abs(values: Iterable[float]) -> float:
    vals = [abs(v) for v in values]
    return statistics.median(vals) if vals else 0.0


def write_section(section: Section, path: Path = OUTPUT) -> None:
    """Replace (or append) this benchmark's section of docs/performance.md."""
    text = path.read_text() if path.exists() else "# Performance\n"
    head = f"## {TITLE}"
    start = text.find(head)
    if start < 0:
        text = text.rstrip("\n") + "\n\n" + section.markdown()
    else:
        end = text.find("\n## ", start + len(head))
        tail = text[end + 1 :] if end >= 0 else ""
        text = text[:start] + section.markdown() + ("\n" + tail if tail else "")
    path.write_text(text)


def main() -> None:
    """Run this benchmark alone and rewrite its section of docs/performance.md."""
    section = run()
    print(section.markdown())
    write_section(section)
    print(f"wrote {OUTPUT}")


if __name__ == "__main__":
    main()
