"""Real ranks: run a DistProgram with one process per rank over torch.distributed.

What it is for: the simulated mesh (`runtime.simulated`) proves a program right with numpy
collectives it computes itself; this backend runs the same per-rank program where every
collective is a real `torch.distributed` call between processes, so `shardlab verify
--backend torch` checks the program as a framework would run it. Pipelines (a mesh with a
`pp` axis) run on it through `runtime.torch_pipeline`. Ranks run on CPU over gloo or on
GPUs over NCCL, in the verification's compute dtype or in the graph's own mixed precision
(bf16 with fp32 masters): `runtime.torch_device.RankDevice`.

`run_torchdist` has the contract of `run_simulated`: the same sources, split by the same
seed (`runtime.distribute`), give every value's block on every rank (`Blocks`), so
`global_view` and verification work unchanged; its `TorchBlocks` also say where each
rank's local ops ran (`summary["torch_ops"]`: as torch ops, `runtime.torch_ops`, or as the
numpy kernels). The backend is split by concern:

- `runtime.torch_launch`: starting one process per rank (forkserver, a group over a
  FileStore), or joining a torchrun job, and bringing every rank's result back;
- `runtime.torch_device`: the device, its collective library and the precision;
- `runtime.torch_rank`: one rank's run of its program in program order, and its timing
  (`run_rank`, `time_rank`, `RankTiming`);
- `runtime.torch_comm`: the torch groups of the mesh axes and every comm step as a torch
  collective on the rank's device (async handles for the passes' async ops);
- `runtime.torch_pipeline`: a pipeline's stages, with send/recv between their ranks.

Under `torchrun` (RANK, WORLD_SIZE and MASTER_ADDR set) nothing is spawned: this process is
one rank, the default group is joined from the environment, and every rank ends with every
rank's blocks (`all_gather_object`). `python -m shardlab.runtime.torchdist PLAN.json`
verifies a saved plan (`shardlab.plan.save_plan`) on this backend that way, or, run without
torchrun, by spawning.

Timing (`time_torchdist`, used by `runtime.measure`): every rank runs its program `steps`
times after `warmup` dropped ones and returns its spans (`RankTiming`; `runtime.torch_rank`
says what a span covers). Always spawned, never under torchrun.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from shardlab.errors import ExecutionError, ShardlabError
from shardlab.ops.base import Array
from shardlab.program import DistProgram
from shardlab.runtime.distribute import distribute
from shardlab.runtime.torch_device import RankDevice
from shardlab.runtime.torch_launch import BACKEND, run_job, spawn, torch_modules, under_torchrun
from shardlab.runtime.torch_rank import (
    OpCounts,
    RankBlocks,
    RankTiming,
    flat_job,
    process_ranks,
    run_rank,
    time_rank,
)

__all__ = [
    "BACKEND",
    "Blocks",
    "RankBlocks",
    "RankTiming",
    "TorchBlocks",
    "main",
    "run_rank",
    "run_torchdist",
    "split_sources",
    "time_rank",
    "time_torchdist",
    "under_torchrun",
]

Blocks = dict[str, dict[int, Array]]


def run_torchdist(
    program: DistProgram,
    sources: Mapping[str, Array],
    seed: int = 0,
    *,
    compute_dtype: str | None = None,
    nproc: int | None = None,
    timeout_s: float = 300.0,
    device: RankDevice | None = None,
) -> Blocks:
    """Every program value's block on every rank, each rank run by its own process.

    `seed` splits partial sources at random (as `run_simulated` does); `compute_dtype`, when
    given, casts floating sources first; `nproc`, when given, must equal the mesh size;
    `timeout_s` bounds every collective (the group's timeout); `device`: where and in which
    precision the ranks run (default CPU, gloo, the sources' dtype).
    """
    torch_modules()
    _check_nproc(program, nproc)
    per_rank = split_sources(program, sources, seed, compute_dtype)
    ranks = process_ranks(program.mesh.ranks)
    inputs = [per_rank[r] for r in ranks]
    device = device or RankDevice()
    got = run_job(flat_job, (program, None, device), inputs, timeout_s, ranks, device)
    blocks = TorchBlocks()
    for r, (theirs, _) in zip(ranks, got, strict=True):
        for name, block in theirs.items():
            blocks.setdefault(name, {})[r] = block
    blocks.summary["torch_ops"] = torch_ops_summary(
        {r: counts for r, (_, counts) in zip(ranks, got, strict=True)}
    )
    return blocks


class TorchBlocks(Blocks):
    """`Blocks` of a torch run, with what the run reports for the verify summary
    (`summary["torch_ops"]`: `torch_ops_summary`)."""

    def __init__(self) -> None:
        super().__init__()
        self.summary: dict[str, Any] = {}


def torch_ops_summary(counts: Mapping[int, OpCounts]) -> dict[str, Any]:
    """Local compute ops over all ranks by where they ran: `torch` ops, `numpy` kernels and
    their `numpy_kinds` (`OpCounts` labels, sorted), and per rank (`per_rank`)."""
    kinds = sorted({label for c in counts.values() for label in c.numpy})
    per_rank = [
        {"rank": r, "torch": c.torch, "numpy": sum(c.numpy.values())}
        for r, c in sorted(counts.items())
    ]
    return {
        "torch": sum(row["torch"] for row in per_rank),
        "numpy": sum(row["numpy"] for row in per_rank),
        "numpy_kinds": kinds,
        "per_rank": per_rank,
    }


def split_sources(
    program: DistProgram, sources: Mapping[str, Array], seed: int, compute_dtype: str | None
) -> dict[int, RankBlocks]:
    """Every rank's source blocks, split exactly as `run_simulated` splits them."""
    rng = np.random.default_rng(seed)
    out: dict[int, RankBlocks] = {r: {} for r in program.mesh.ranks}
    for name, data in sources.items():
        full = np.asarray(data)
        if compute_dtype is not None and full.dtype.kind == "f":
            full = full.astype(compute_dtype)
        for r, block in distribute(full, program.specs[name], rng).items():
            out[r][name] = block
    return out


def _check_nproc(program: DistProgram, nproc: int | None) -> None:
    if nproc is not None and nproc != program.mesh.size:
        raise ExecutionError(
            f"backend {BACKEND!r}: {nproc} processes requested but the mesh "
            f"{program.mesh.shape} has {program.mesh.size} ranks; they must be equal",
            backend=BACKEND,
            nproc=nproc,
            mesh_size=program.mesh.size,
        )


def time_torchdist(
    program: DistProgram,
    sources: Mapping[str, Array],
    seed: int = 0,
    *,
    steps: int = 5,
    warmup: int = 1,
    compute_dtype: str | None = None,
    nproc: int | None = None,
    timeout_s: float = 300.0,
    device: RankDevice | None = None,
) -> dict[int, RankTiming]:
    """Every rank's timing of `steps` steps after `warmup` dropped ones, one process per rank
    (spawned; not under torchrun) on `device` (default CPU)."""
    torch_modules()
    if steps < 1 or warmup < 0:
        raise ExecutionError(
            f"timing needs steps >= 1 and warmup >= 0, got steps={steps} warmup={warmup}",
            steps=steps,
            warmup=warmup,
        )
    _check_nproc(program, nproc)
    per_rank = split_sources(program, sources, seed, compute_dtype)
    ranks = process_ranks(program.mesh.ranks)
    inputs = [per_rank[r] for r in ranks]
    device = device or RankDevice()
    job = (program, (steps, warmup), device)
    got: list[RankTiming] = spawn(flat_job, job, inputs, timeout_s, ranks, device)
    return {t.rank: t for t in got}


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m shardlab.runtime.torchdist PLAN.json`: verify a saved plan on real ranks
    (spawned, or this process's rank under torchrun); rank 0 prints the outcome."""
    parser = argparse.ArgumentParser(
        prog="python -m shardlab.runtime.torchdist",
        description="Verify a saved plan (shardlab plan ... --save) on torch.distributed ranks.",
    )
    parser.add_argument("plan", help="a plan file written by shardlab.plan.save_plan")
    parser.add_argument("--dtype", default="float64", help="compute dtype: float64 or float32")
    parser.add_argument("--seed", type=int, default=0, help="seed of the inputs and parameters")
    args = parser.parse_args(argv)
    from shardlab.plan import load_plan
    from shardlab.runtime.verify import verify

    launched = under_torchrun()
    try:
        report = verify(load_plan(args.plan), compute_dtype=args.dtype, seed=args.seed,
                        backend=BACKEND)  # fmt: skip
    except ShardlabError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 1
    finally:
        if launched:
            _, dist = torch_modules()
            if dist.is_initialized():
                dist.destroy_process_group()
    if not launched or os.environ.get("RANK") == "0":
        status = "PASS" if report.ok else "FAIL"
        print(f"{status}: {report.summary.get('compared')} tensors compared in {args.dtype}")
        if report.first_divergence:
            print(f"first diverging op: {report.first_divergence}")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
