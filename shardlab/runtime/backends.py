"""Run a DistProgram on a named verification backend (`runtime.verify.BACKENDS`).

"simulated": every rank in this process (`runtime.simulated`, numpy, CPU, the sources'
dtype); "torch": one process per rank with real torch.distributed collectives
(`runtime.torchdist`, imported only when asked for, so the simulated backend needs no
torch), on a `device` ("cpu": gloo; "cuda": NCCL) in a `precision` ("compute": the
sources' dtype; "graph": the graph's own mixed precision; `runtime.torch_device`).
`run_pipeline_backend` does the same for a pipeline's stage programs
(`runtime.pipeline_exec`, `runtime.torch_pipeline`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from shardlab.errors import ExecutionError
from shardlab.mesh import Mesh
from shardlab.ops.base import Array
from shardlab.program import DistProgram
from shardlab.runtime.simulated import Blocks, run_simulated
from shardlab.runtime.torch_device import RankDevice

if TYPE_CHECKING:
    from shardlab.passes.pipeline import PipelineProgram


def run_backend(
    backend: str,
    program: DistProgram,
    sources: Mapping[str, Array],
    seed: int = 0,
    *,
    nproc: int | None = None,
    device: str = "cpu",
    precision: str = "compute",
) -> Blocks:
    """Every program value's block on every rank, computed by `backend`."""
    if backend == "simulated":
        _check_simulated(device, precision)
        return run_simulated(program, sources, seed)
    if backend == "torch":
        from shardlab.runtime.torchdist import run_torchdist

        where = RankDevice(device, precision)
        return run_torchdist(program, sources, seed, nproc=nproc, device=where)
    raise ExecutionError(f"unknown verification backend {backend!r}", backend=backend)


def run_pipeline_backend(
    backend: str,
    pipeline: PipelineProgram,
    sources: Mapping[str, Array],
    seed: int = 0,
    *,
    nproc: int | None = None,
    device: str = "cpu",
    precision: str = "compute",
) -> list[Blocks]:
    """Every pipeline stage's blocks of every value it holds after the step, computed by
    `backend` from the global (full-batch) sources."""
    if backend == "simulated":
        from shardlab.runtime.pipeline_exec import run_pipeline_blocks

        _check_simulated(device, precision)
        return run_pipeline_blocks(pipeline, sources, seed)
    if backend == "torch":
        from shardlab.runtime.torch_pipeline import run_pipeline_torch

        where = RankDevice(device, precision)
        return run_pipeline_torch(pipeline, sources, seed, nproc=nproc, device=where)
    raise ExecutionError(f"unknown verification backend {backend!r}", backend=backend)


def _check_simulated(device: str, precision: str) -> None:
    """The simulated backend runs numpy on this CPU in the sources' dtype (ExecutionError
    naming what it cannot do)."""
    if device != "cpu" or precision != "compute":
        raise ExecutionError(
            f"the simulated backend runs numpy on this CPU in the sources' dtype; device "
            f"{device!r} and precision {precision!r} need --backend torch",
            device=device,
            precision=precision,
        )


def check_nproc(nproc: int | None, mesh: Mesh) -> None:
    """ExecutionError unless `nproc` (processes asked for; None: any) equals the mesh size."""
    if nproc is not None and nproc != mesh.size:
        raise ExecutionError(
            f"--nproc {nproc} does not match the mesh {mesh}, which has {mesh.size} ranks "
            "and runs one process per rank",
            nproc=nproc,
            mesh_size=mesh.size,
        )
