"""Published end-to-end measurements of Megatron-LM on DGX A100 clusters, with their sources.

The fidelity benchmark (`bench.bench_fidelity`) plans every row with the paper's own model,
parallel configuration, schedule and recomputation, and reports the predicted iteration time
and TFLOP/s per GPU next to these numbers.

Sources (all runs on DGX A100 80GB nodes: 8 GPUs on NVLink/NVSwitch, 8 HDR InfiniBand NICs,
312 TFLOP/s 16-bit peak per GPU; GPT with vocabulary 51200, sequence 2048):

- Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models",
  arXiv:2205.05198 (bf16, eager attention with dropout, no data parallelism). Table 3: the
  configurations; Table 4: one 22B layer's forward / backward times; Table 5: iteration time
  with full recomputation (no sequence parallelism) and with "present work" (sequence
  parallelism + selective recomputation), and MFU / HFU of present work. The 175B and 530B
  models run the interleaved schedule with three chunks per stage (as the paper's setup
  states; not re-read here from a primary copy); the 1T model, 2 layers per stage, is
  taken to run plain 1F1B: three chunks do not divide its stages, and with two Shardlab's
  memory model puts its first stage above 80 GB.
- Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters
  Using Megatron-LM", arXiv:2104.04473 (fp16, full recomputation, scatter/gather, data-
  parallel all-reduce after the backward: `DDP=local`). Table 2, PTD-P rows: TFLOP/s per GPU
  counted with eq. 3, 96 B s l h^2 (1 + s/(6h) + V/(16 l h)) FLOPs per iteration (these
  include the recomputation). The table gives micro-batch 1 but not the chunks per stage:
  they come from the authors' reproduction scripts in github.com/NVIDIA/Megatron-LM,
  `examples/sc21/`: `run_figure_12.sh` / `run_figure_18.sh` run this very 175B model (96
  layers, t 8, p 12, micro-batch 1) with 2 layers per virtual stage (v = 4), and
  `run_table_1.sh` runs the 530B model (t 8, p 35) with 1 layer per virtual stage (v = 3).
- Narayanan et al. 2021, Table 1 (weak scaling, 1.7B-1T) is left out: the table gives neither
  the micro-batch size nor the chunks per stage (only the scripts do).

Numbers were read from secondary copies of the papers and cross-checked against each other
(`tests/bench/test_fidelity_data.py`): Table 5's times against its MFU / HFU and its stated
speedups (29.0 / 31.8 / 29.7 / 32.1 %), Table 4's sums against its stated overheads.
"""

from __future__ import annotations

from dataclasses import dataclass

#: A100 SXM4 dense 16-bit tensor-core peak (bf16 and fp16 alike), FLOP/s.
A100_PEAK = 312e12
KORTHIKANTI = "Korthikanti et al. 2022 (arXiv:2205.05198)"
NARAYANAN = "Narayanan et al. 2021 (arXiv:2104.04473)"
SC21_SCRIPTS = "github.com/NVIDIA/Megatron-LM examples/sc21"


@dataclass(frozen=True, slots=True)
class GptShape:
    """A GPT of the Megatron-LM papers: layers, hidden size, attention heads."""

    name: str
    layers: int
    hidden: int
    heads: int
    vocab: int = 51200
    seq: int = 2048

    def parameters(self) -> float:
        """Narayanan et al.'s eq. 2: 12 l h^2 (1 + 13/(12h) + (V + s)/(12 l h))."""
        l, h = self.layers, self.hidden
        return 12 * l * h * h * (1 + 13 / (12 * h) + (self.vocab + self.seq) / (12 * l * h))

    def eq3_flops(self, batch: int) -> float:
        """Narayanan et al.'s eq. 3: FLOPs of one iteration with full recomputation."""
        l, h, s, v = self.layers, self.hidden, self.seq, self.vocab
        return 96 * batch * s * l * h * h * (1 + s / (6 * h) + v / (16 * l * h))

    def model_flops(self, batch: int) -> float:
        """Korthikanti et al.'s appendix A: model FLOPs of one iteration (no recomputation),
        72 B s l h^2 (1 + s/(6h) + V/(12 l h)); MFU divides them by time x GPUs x peak."""
        l, h, s, v = self.layers, self.hidden, self.seq, self.vocab
        return 72 * batch * s * l * h * h * (1 + s / (6 * h) + v / (12 * l * h))


@dataclass(frozen=True, slots=True)
class Parallel:
    """How a run was split: tensor x pipeline x data parallel, batches, schedule, memory."""

    tp: int
    pp: int
    dp: int
    global_batch: int
    micro_batch: int
    recompute: str  # none, selective, full
    sequence_parallel: bool
    schedule: str = "none"  # none (no pipeline), 1f1b, interleaved
    virtual_stages: int = 1

    @property
    def gpus(self) -> int:
        """tp x pp x dp."""
        return self.tp * self.pp * self.dp

    @property
    def microbatches(self) -> int:
        """Micro-batches per pipeline per iteration: global batch / (dp x micro-batch)."""
        return self.global_batch // (self.dp * self.micro_batch)


@dataclass(frozen=True, slots=True)
class EndToEndRow:
    """One published training run: what ran and what it measured, with the source of each
    number. A paper gives the iteration time, or TFLOP/s per GPU (then the time is derived
    through the paper's FLOP formula), or both."""

    key: str
    source: str  # paper and table
    model: GptShape
    parallel: Parallel
    gpus: int  # as published
    dtype: str
    iteration_s: float | None = None
    tflops_per_gpu: float | None = None  # as published, by `flops_formula`
    mfu: float | None = None
    hfu: float | None = None
    flops_formula: str = "model"  # "model" (Korthikanti, MFU) or "eq3" (Narayanan)
    config_source: str = ""

    def flops(self) -> float:
        """FLOPs of one iteration by the paper's own formula."""
        batch = self.parallel.global_batch
        if self.flops_formula == "eq3":
            return self.model.eq3_flops(batch)
        return self.model.model_flops(batch)

    @property
    def time_s(self) -> float:
        """The published iteration time, or eq. 3 FLOPs / (GPUs x published TFLOP/s)."""
        if self.iteration_s is not None:
            return self.iteration_s
        assert self.tflops_per_gpu is not None
        return self.flops() / (self.gpus * self.tflops_per_gpu * 1e12)

    @property
    def tflops(self) -> float:
        """Published TFLOP/s per GPU (MFU x peak for Korthikanti's rows)."""
        if self.tflops_per_gpu is not None:
            return self.tflops_per_gpu
        return self.flops() / (self.gpus * self.time_s) / 1e12


@dataclass(frozen=True, slots=True)
class LayerRow:
    """Korthikanti et al. 2022, Table 4: one 22B transformer layer (t 8, micro-batch 4)."""

    key: str
    label: str
    recompute: str
    sequence_parallel: bool
    forward_ms: float
    backward_ms: float
    source: str = f"{KORTHIKANTI}, Table 4"


GPT_22B = GptShape("22B", 48, 6144, 64)
GPT_175B = GptShape("175B", 96, 12288, 96)
GPT_530B = GptShape("530B", 105, 20480, 128)
GPT_1T = GptShape("1T", 128, 25600, 160)

_K3 = f"{KORTHIKANTI}, Table 3 (configurations) and section 6 (schedule)"


def _korthikanti(
    model: GptShape, pp: int, batch: int, schedule: str, v: int, present: bool,
    time_s: float, mfu: float | None = None, hfu: float | None = None,
) -> EndToEndRow:  # fmt: skip
    parallel = Parallel(
        tp=8, pp=pp, dp=1, global_batch=batch, micro_batch=4 if pp == 1 else 1,
        recompute="selective" if present else "full", sequence_parallel=present,
        schedule=schedule, virtual_stages=v,
    )  # fmt: skip
    which = "present work" if present else "full recompute"
    return EndToEndRow(
        key=f"k22-{model.name}-{'present' if present else 'full'}",
        source=f"{KORTHIKANTI}, Table 5 ({which})",
        model=model,
        parallel=parallel,
        gpus=8 * pp,
        dtype="bfloat16",
        iteration_s=time_s,
        mfu=mfu,
        hfu=hfu,
        config_source=_K3,
    )


def _narayanan(
    model: GptShape, pp: int, v: int, batch: int, gpus: int, tflops: float
) -> EndToEndRow:
    dp = gpus // (8 * pp)
    parallel = Parallel(
        tp=8, pp=pp, dp=dp, global_batch=batch, micro_batch=1, recompute="full",
        sequence_parallel=False, schedule="interleaved", virtual_stages=v,
    )  # fmt: skip
    script = "run_figure_12.sh (2 layers per virtual stage)" if v == 4 else "run_table_1.sh"
    return EndToEndRow(
        key=f"n21-{model.name}-{gpus}",
        source=f"{NARAYANAN}, Table 2 (PTD-P)",
        model=model,
        parallel=parallel,
        gpus=gpus,
        dtype="float16",
        tflops_per_gpu=tflops,
        flops_formula="eq3",
        config_source=f"{NARAYANAN}, Table 2; chunks per stage: {SC21_SCRIPTS}/{script}",
    )


#: Every end-to-end row, in the order of the report.
ROWS: tuple[EndToEndRow, ...] = (
    _korthikanti(GPT_22B, 1, 4, "none", 1, False, 1.42),
    _korthikanti(GPT_22B, 1, 4, "none", 1, True, 1.10, 0.415, 0.437),
    _korthikanti(GPT_175B, 8, 64, "interleaved", 3, False, 18.13),
    _korthikanti(GPT_175B, 8, 64, "interleaved", 3, True, 13.75, 0.514, 0.528),
    _korthikanti(GPT_530B, 35, 280, "interleaved", 3, False, 49.05),
    _korthikanti(GPT_530B, 35, 280, "interleaved", 3, True, 37.83, 0.560, 0.570),
    _korthikanti(GPT_1T, 64, 512, "1f1b", 1, False, 94.42),
    _korthikanti(GPT_1T, 64, 512, "1f1b", 1, True, 71.49, 0.563, 0.570),
    _narayanan(GPT_175B, 12, 4, 1536, 384, 153),
    _narayanan(GPT_175B, 12, 4, 1536, 768, 149),
    _narayanan(GPT_175B, 12, 4, 1536, 1536, 141),
    _narayanan(GPT_530B, 35, 3, 2240, 560, 171),
    _narayanan(GPT_530B, 35, 3, 2240, 1120, 167),
    _narayanan(GPT_530B, 35, 3, 2240, 2240, 159),
)

#: Korthikanti et al. 2022, Table 4 (22B layer: h 6144, 64 heads, s 2048, b 4, t 8).
LAYER_ROWS: tuple[LayerRow, ...] = (
    LayerRow("t4-baseline", "no recompute", "none", False, 7.7, 11.9),
    LayerRow("t4-sp", "sequence parallel", "none", True, 7.2, 11.8),
    LayerRow("t4-full", "full recompute", "full", False, 7.7, 19.5),
    LayerRow("t4-selective", "selective recompute", "selective", False, 7.7, 13.2),
    LayerRow("t4-selective-sp", "selective recompute + SP", "selective", True, 7.2, 13.1),
)
#: The 22B layer of Table 4: batch 4 is one micro-batch of the 22B run.
LAYER_MODEL = GPT_22B
LAYER_MICRO_BATCH = 4

#: Table 5's stated throughput gains of present work over full recomputation (section 6.3).
TABLE5_SPEEDUPS = {"22B": 0.290, "175B": 0.318, "530B": 0.297, "1T": 0.321}
#: Table 4's stated overheads over the baseline (section 6.2): full 39%, selective 7%,
#: selective + sequence parallel 4%.
TABLE4_OVERHEADS = {"t4-full": 0.39, "t4-selective": 0.07, "t4-selective-sp": 0.04}

#: Rows any constant of the `a100-80g` preset was fitted on; every other row is held out.
CALIBRATION_ROWS: tuple[str, ...] = tuple(r.key for r in LAYER_ROWS)
