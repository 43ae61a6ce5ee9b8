"""What a worker has (`Devices`), what a job needs (`Requirement`), and whether one serves it.

Shared by the service and the workers: the API stores a verification's requirement on its
job row (`jobs.requires_device`, `jobs.requires_nproc`), a worker registers its `Devices`
(`backend/workers.py`) and claims only the jobs it can serve (`backend/ledger.claim`). How a
worker finds its devices is the worker's business (`worker/devices.py`).

The rule (`can_serve`), one process per rank:

- a job without a requirement (plans, searches, simulated verifications) runs anywhere;
- `device = "cuda"`: the worker has torch and at least `nproc` CUDA devices;
- `device = "cpu"` (the torch backend over gloo): the worker has torch and `nproc` is at most
  its `max_cpu_ranks`, `max(8, 4 x cpu_cores)`: gloo ranks on CPU may share a core (a
  verification step is small), but not without bound, as every rank is a process holding
  torch. A worker may state its own bound instead (`cpu_ranks`: the Ray engine's is the
  largest node's CPUs, as it reserves a CPU per rank).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: where a torch-backend job's ranks run
DEVICES = ("cpu", "cuda")
#: CPU ranks a worker runs at least, and per core (`max_cpu_ranks`)
MIN_CPU_RANKS, CPU_RANKS_PER_CORE = 8, 4


@dataclass(frozen=True, slots=True)
class CudaDevice:
    """One CUDA device as torch reports it."""

    index: int
    name: str
    memory_bytes: int


@dataclass(frozen=True, slots=True)
class Devices:
    """What one worker can run on: its CPU cores, its CUDA devices, and whether it has torch
    (None: the torch backend cannot run there; else its version)."""

    cpu_cores: int
    cuda: tuple[CudaDevice, ...] = ()
    torch: str | None = None
    #: the most CPU ranks of one job, when not the default rule's
    cpu_ranks: int | None = None

    @property
    def max_cpu_ranks(self) -> int:
        """The most gloo ranks on CPU this worker runs for one job."""
        if self.cpu_ranks is not None:
            return self.cpu_ranks
        return max(MIN_CPU_RANKS, CPU_RANKS_PER_CORE * self.cpu_cores)

    def to_json(self) -> dict[str, Any]:
        return {
            "cpu_cores": self.cpu_cores,
            "cuda": [
                {"index": d.index, "name": d.name, "memory_bytes": d.memory_bytes}
                for d in self.cuda
            ],
            "torch": self.torch,
            "cpu_ranks": self.cpu_ranks,
            "max_cpu_ranks": self.max_cpu_ranks,
        }

    @staticmethod
    def from_json(data: dict[str, Any]) -> Devices:
        """The inverse of `to_json` (`max_cpu_ranks` is derived, not read); ValueError or
        KeyError on a malformed document."""
        ranks = data.get("cpu_ranks")
        cores = int(data["cpu_cores"])
        if cores < 1:
            raise ValueError(f"cpu_cores must be at least 1, not {cores}")
        cuda = tuple(
            CudaDevice(int(d["index"]), str(d["name"]), int(d["memory_bytes"]))
            for d in data.get("cuda") or ()
        )
        torch = data.get("torch")
        return Devices(
            cores,
            cuda,
            None if torch is None else str(torch),
            None if ranks is None else int(ranks),
        )

    def describe(self) -> str:
        """One line for logs and messages: `4 CPU cores, 2 x NVIDIA H100 (80 GiB), torch 2.13`."""
        parts = [f"{self.cpu_cores} CPU core{'s' if self.cpu_cores != 1 else ''}"]
        if self.cuda:
            names: dict[str, int] = {}
            for d in self.cuda:
                label = f"{d.name} ({d.memory_bytes / 1024**3:.0f} GiB)"
                names[label] = names.get(label, 0) + 1
            parts += [f"{n} x {label}" for label, n in names.items()]
        else:
            parts.append("no CUDA")
        parts.append(f"torch {self.torch}" if self.torch else "no torch")
        return ", ".join(parts)


@dataclass(frozen=True, slots=True)
class Requirement:
    """What a job needs of its worker: `nproc` ranks on `device` (torch backend)."""

    device: str
    nproc: int

    def describe(self) -> str:
        if self.device == "cuda":
            return f"{self.nproc} CUDA device{'s' if self.nproc != 1 else ''}"
        return f"torch and room for {self.nproc} CPU ranks"


@dataclass(frozen=True, slots=True)
class RunOn:
    """How a verification runs: `backend` ("simulated" | "torch"), and for torch `nproc`
    ranks on `device`. Stored in the job's payload; its `requirement` on the job's row."""

    backend: str = "simulated"
    nproc: int | None = None
    device: str | None = None

    @property
    def requirement(self) -> Requirement | None:
        if self.backend != "torch":
            return None
        return Requirement(self.device or "cpu", self.nproc or 1)

    def to_json(self) -> dict[str, Any]:
        return {"backend": self.backend, "nproc": self.nproc, "device": self.device}


def can_serve(devices: Devices, need: Requirement | None) -> bool:
    """Whether a worker with `devices` may claim a job needing `need` (the module's rule)."""
    if need is None:
        return True
    if devices.torch is None:
        return False
    if need.device == "cuda":
        return len(devices.cuda) >= need.nproc
    return need.nproc <= devices.max_cpu_ranks
