"""The reference training steps of a calibration: what they are and what they show.

What it is for: `runtime.calibrate` fits the figures only a training step shows from
one-layer reference plans run on the torch backend. This module holds those references
(`REFERENCE` models, `REFERENCE_STEPS`: every collective kind the templates issue, and a 1F1B
pipeline), runs them (`run_references`, in `REFERENCE_ROUNDS` rounds, each reference keeping
its median round) and reads the samples the fits take off the measured runs:

- `kernel_samples`: every compute kind's ops against their roofline, and the backend's
  per-op floor (`kernel_scale`, `kernel_overhead`, `launch_overhead`);
- `step_collectives` and `hop_samples`: the collectives inside the steps and the hops
  between pipeline stages (`comm_scale`);
- `straggle_of`: the slowest rank's compute of a step beyond its ops' times (`straggle`);
- `step_samples`: each flat step against the model's prediction (`op_overhead`).

Compute ops count at their longest over the ranks (`Measurement.slowest_op_seconds`: the
step waits for the last rank), collectives at their median (`typical_op_seconds`: the
first rank to reach one waits inside it for the last).
"""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING

from shardlab.cost.clusters import Cluster
from shardlab.cost.comm import comm_op_group, factor
from shardlab.cost.compute import program_op_times
from shardlab.cost.pipeline_cost import cost_pipeline, sent_bytes
from shardlab.runtime import hazards as hz
from shardlab.runtime.calibrate_measure import CommSample, KernelSample, StepSample

if TYPE_CHECKING:
    from shardlab.plan import Plan
    from shardlab.program import DistProgram
    from shardlab.runtime.measure import Measurement
    from shardlab.strategy import Strategy

#: The reference models: one GPT-2 and one Llama layer (`REFERENCE_STEPS` runs them; data
#: parallel, every compute kind of a training step is timed on a full-size block).
REFERENCE = (
    ("gpt2", {"layers": 1, "hidden": 128, "heads": 4, "ffn": 512, "vocab": 256, "seq": 64,
              "batch": 4}),
    ("llama3-8b", {"layers": 1, "hidden": 128, "heads": 4, "kv_heads": 2, "ffn": 384,
                   "vocab": 256, "seq": 64, "batch": 4}),
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class RefStep:
    """One reference step: its label, its model (`REFERENCE` index), the mesh axis all ranks
    sit on, its templates, and whether its kernels give `kernel_scale`. A `pipelined`
    reference puts the ranks on `pp=2` (times `axis` over the rest), its model one layer per
    stage and a batch as many times larger as `axis` has ranks, and runs 1F1B over
    `PIPELINE_MICROBATCHES`: its sends give `comm_scale["send"]`."""

    label: str
    model: int
    axis: str
    templates: tuple[str, ...]
    kernels: bool = False
    pipelined: bool = False

    def strategy(self, nproc: int) -> Strategy:
        """The reference's strategy on `nproc` ranks."""
        from shardlab.strategy import Strategy

        if not self.pipelined:
            return Strategy.build(f"{self.axis}={nproc}", list(self.templates), [], {})
        rest = nproc // PIPELINE_STAGES
        mesh = f"pp={PIPELINE_STAGES}" + (f",{self.axis}={rest}" if rest > 1 else "")
        pipeline = {"schedule": "1f1b", "microbatches": PIPELINE_MICROBATCHES}
        templates = list(self.templates) if rest > 1 else []
        return Strategy.build(mesh, templates, [], {"pipeline": pipeline})

    def runs_on(self, nproc: int) -> bool:
        """A pipelined reference needs a rank count its stages divide."""
        return not self.pipelined or nproc % PIPELINE_STAGES == 0


#: The reference steps: every collective kind the templates issue, and the sends between
#: pipeline stages, inside a training step.
REFERENCE_STEPS = (
    RefStep("gpt2 dp", 0, "dp", ("dp",), kernels=True),
    RefStep("llama dp", 1, "dp", ("dp",), kernels=True),
    RefStep("gpt2 tp", 0, "tp", ("megatron_tp",)),
    RefStep("llama tp+sp", 1, "tp", ("megatron_tp", "sequence_parallel")),
    RefStep("llama zero2", 1, "dp", ("dp", "zero2")),
    RefStep("llama fsdp", 1, "dp", ("fsdp",)),
    RefStep("llama pp 1F1B", 1, "dp", ("dp",), pipelined=True),
)
#: the pipelined reference's stages and micro-batches
PIPELINE_STAGES, PIPELINE_MICROBATCHES = 2, 4
#: steps timed per reference and round (after one warm-up), quick and full
REFERENCE_STEPS_TIMED = (6, 10)
#: rounds over every reference step, each reference's median round kept: a shared machine
#: slows everything for seconds at a time, and a burst should cost one round, not the fit
REFERENCE_ROUNDS = 3
#: op_overhead (s) at which the model's step is first differenced (then at the fitted one)
PROBE_OVERHEAD_S = 1e-4
#: roofline seconds under which an op counts as doing no work (its time is the backend's)
FLOOR_WORK_S = 1e-6


@dataclass(frozen=True, slots=True)
class RefRun:
    """One reference step: its plan (built on the cluster fitted before any step ran) and
    its measurement."""

    ref: RefStep
    plan: Plan
    got: Measurement

    @property
    def slowest(self) -> int:
        return max(self.got.ranks, key=self.got.step_time)

    @property
    def measured_s(self) -> float:
        """The slowest rank's median step."""
        return self.got.step_time(self.slowest)


def run_references(
    cluster: Cluster, nproc: int, dtype: str, steps: int, rounds: int = REFERENCE_ROUNDS
) -> list[RefRun]:
    """Build every `REFERENCE_STEPS` plan on `nproc` ranks against `cluster` and time it on
    the torch backend (`steps` kept after one warm-up), in `rounds` rounds over all of
    them; each reference keeps its round of median step time (`median_run`)."""
    from shardlab.models import build_model
    from shardlab.plan import build_plan
    from shardlab.runtime.measure import measure

    refs = [ref for ref in REFERENCE_STEPS if ref.runs_on(nproc)]
    plans = []
    for ref in refs:
        model, overrides = REFERENCE[ref.model]
        if ref.pipelined:  # one layer per stage, a micro-batch row per data-parallel rank
            rest = nproc // PIPELINE_STAGES
            overrides = {**overrides, "layers": PIPELINE_STAGES,
                         "batch": int(overrides["batch"]) * rest}  # fmt: skip
        graph = build_model(model, {**overrides, "dtype": dtype})
        plans.append(build_plan(graph, ref.strategy(nproc), cluster=cluster))
    tried: list[list[RefRun]] = [[] for _ in plans]
    for _ in range(rounds):
        for ref, plan, runs in zip(refs, plans, tried, strict=True):
            runs.append(RefRun(ref, plan, measure(plan, steps=steps, warmup=1, dtype=dtype)))
    return [median_run(runs) for runs in tried]


def median_run(runs: list[RefRun]) -> RefRun:
    """The run whose (slowest rank's median) step is the median of `runs` (the lower of the
    two middle ones for an even count)."""
    ordered = sorted(runs, key=lambda r: r.measured_s)
    return ordered[(len(ordered) - 1) // 2]


def kernel_samples(runs: list[RefRun], cluster: Cluster) -> tuple[list[KernelSample], float | None]:
    """Every compute kind of `runs` as the torch backend ran it, each op its longest time
    over the ranks (`Measurement.slowest_op_seconds`), and the backend's per-op floor.

    The floor is the median measured seconds of the ops that do (next to) no work: views
    and ops whose roofline is under `FLOOR_WORK_S` - the backend's own per-op time. Each
    kind's sample holds its ops' roofline seconds on `cluster` (launch overhead left out)
    and their measured seconds less one floor per op, summed and op by op."""
    from shardlab.runtime.measure import is_comm

    launch = cluster.launch_overhead
    timed: list[tuple[str, float, float]] = []  # (kind, roofline less launch, measured)
    for run in runs:
        seen = run.got.slowest_op_seconds()
        roof = program_op_times(run.plan.program, cluster)
        for op in run.plan.program.ops:
            if op.kind in hz.SYNC_KINDS or is_comm(op) or op.name not in seen:
                continue
            work = max(0.0, roof.get(op.name, 0.0) - launch)
            timed.append((op.kind, work, seen[op.name]))
    idle = [t for _, work, t in timed if work < FLOOR_WORK_S]
    floor = statistics.median(idle) if idle else None
    points: dict[str, list[tuple[float, float]]] = {}
    for kind, work, t in timed:
        if work > 0:
            beyond = max(0.0, t - (floor if floor is not None else launch))
            points.setdefault(kind, []).append((work, beyond))
    samples = [
        KernelSample(k, len(p), sum(w for w, _ in p), sum(m for _, m in p), tuple(p))
        for k, p in sorted(points.items())
    ]
    return samples, floor


def straggle_of(runs: list[RefRun]) -> float:
    """How much longer the slowest rank's compute of a step is than the sum of its compute
    ops' own times (each its longest over the ranks, `Measurement.slowest_op_seconds`),
    summed over `runs`, less one (never below 0): ranks that share cores are descheduled
    for whole time slices, now this rank, now that one, and the step waits for the rank
    that lost the most. A step's compute on a rank is the sum of its compute ops' spans
    (`RankTiming.compute_ns`); per reference, the median over its steps of the slowest
    rank's."""
    own = slowest = 0.0
    for run in runs:
        compute = [op.name for op in run.plan.program.ops if hz.is_compute(op)]
        per_step = [max(step) for step in
                    zip(*(t.compute_ns for t in run.got.ranks.values()), strict=False)]  # fmt: skip
        if not per_step:
            continue
        times = run.got.slowest_op_seconds()
        own += sum(times.get(name, 0.0) for name in compute)
        slowest += statistics.median(per_step) * 1e-9
    return max(0.0, slowest / own - 1.0) if own > 0 else 0.0


def step_collectives(runs: list[RefRun]) -> list[CommSample]:
    """The collectives of every reference step as a typical rank ran them (each one's median
    over the ranks), from issue to the wait of the op that reads it (the compute it was
    issued ahead of runs inside that span, as it does in the model's timeline): the samples
    `calibrate_fit.fit_comm_scales` fits `comm_scale` to."""
    samples: list[CommSample] = []
    for run in runs:
        seen = run.got.typical_op_seconds()
        for program in _programs(run):
            for op in program.ops:
                if op.comm is None or op.name not in seen:
                    continue
                n = len(comm_op_group(program.mesh, program.mesh.ranks[0], op.comm.axis))
                f = factor(op.comm.kind, n) if n > 1 else 0.0
                if f > 0:
                    size = int(op.comm.bytes_per_rank / f)
                    samples.append(CommSample(op.comm.kind, n, size, seen[op.name]))
        samples += hop_samples(run)
    return samples


def _programs(run: RefRun) -> list[DistProgram]:
    """The programs a reference's ranks ran: the plan's, or each pipeline stage's once."""
    if run.got.pipeline is None:
        return [run.plan.program]
    return list(run.got.pipeline.stages)


def hop_samples(run: RefRun) -> list[CommSample]:
    """A pipelined reference's hops between stages as `send` samples: from the sender's
    issue to the end of the matching recv (same tag, same position in the peer stage's
    ranks), where the receiver was already waiting, on the clock the ranks of this host
    share (`RankTiming.t0_ns`, the same step on every rank). Inside a step a waiting
    receiver is woken only when a core comes free, which the isolated link never shows."""
    if run.got.pipeline is None:
        return []
    stages = run.got.pipeline.stages
    out = []
    recv_of = {(s, op.attrs["tag"]): op for s, program in enumerate(stages)
               for op in program.ops if op.kind == "recv"}  # fmt: skip
    for program in stages:
        for op in program.ops:
            if op.kind != "send":
                continue
            peer = stages[int(op.attrs["peer_stage"])]
            recv = recv_of[int(op.attrs["peer_stage"]), op.attrs["tag"]]
            size = int(sent_bytes(program, op.inputs[0]))
            for sender, receiver in zip(program.mesh.ranks, peer.mesh.ranks, strict=True):
                issued = _clock(run.got, sender, op.name, 0)
                posted, done = (
                    _clock(run.got, receiver, recv.name, 0),
                    _clock(run.got, receiver, recv.name, 1),
                )
                if posted <= issued < done:
                    out.append(CommSample("send", 2, size, (done - issued) * 1e-9))
    return out


def _clock(got: Measurement, rank: int, op: str, end: int) -> int:
    """When op `op` started (`end` 0) or ended (1) on `rank`, on the host's clock (ns)."""
    timing = got.ranks[rank]
    return timing.t0_ns + timing.spans[op][end]


def step_samples(runs: list[RefRun], cluster: Cluster, probe_s: float) -> list[StepSample]:
    """Every reference step measured against the model on `cluster` without op overhead,
    and the growth of the predicted step per second of `op_overhead` (differenced at
    `probe_s`)."""
    out = []
    for run in runs:
        bare = predicted_step(run, dataclasses.replace(cluster, op_overhead=0.0))
        probed = predicted_step(run, dataclasses.replace(cluster, op_overhead=probe_s))
        ops = sum(1 for op in run.plan.program.ops if op.kind not in hz.SYNC_KINDS)
        out.append(StepSample(run.ref.label, ops, run.measured_s, bare,
                              (probed - bare) / probe_s))  # fmt: skip
    return out


def predicted_step(run: RefRun, cluster: Cluster) -> float:
    """The model's step of a reference's program on `cluster` (a pipelined one's: the
    op-level model of the stage programs its ranks ran)."""
    from shardlab.cost.model import cost_program

    if run.got.pipeline is not None:
        return cost_pipeline(run.got.pipeline, run.plan.training, cluster).step_time
    return cost_program(run.plan.program, run.plan.training, cluster).step_time
