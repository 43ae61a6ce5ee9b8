"""Where a torch rank keeps its blocks and computes: the device, its collective backend, and
the precision its values run in.

What it is for: the torch backend's ranks (`runtime.torch_rank`) keep every block as a
torch tensor on their device from the first op to the last, and the launcher
(`runtime.torch_launch`) joins the group with the device's collective library. This module
is the one place that knows the difference between a CPU rank and a GPU rank, and between
running in the verification's compute dtype and in the graph's own mixed precision.

- `device`: "cpu" (collectives over gloo) or "cuda" (NCCL; process i of a node drives GPU
  `i % torch.cuda.device_count()`, and NCCL needs one GPU per rank, `check_devices`).
- `precision`: "compute" runs every float value in the dtype the caller's sources have
  (float64 or float32: the verification's compute dtype); "graph" runs every float value in
  the dtype its graph declares: a bfloat16 model's params, activations and gradients in
  bfloat16, its float32 master weights and Adam moments in float32 (a float64 declaration
  runs in float32). That is bf16 training with fp32 masters, as Megatron and torchtitan run
  it; `runtime.mixed_precision.precision_of` maps the verification's compute dtype "bfloat16" to it.

Blocks cross the process boundary as numpy arrays (`to_host`): a bfloat16 tensor, which
numpy cannot hold, comes back as float32 (exact: bf16 is float32's upper half).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from shardlab.errors import ExecutionError
from shardlab.ops.base import Array

#: Devices a torch rank may run on, with the collective library each uses.
COLLECTIVE_BACKENDS = {"cpu": "gloo", "cuda": "nccl"}
#: Precisions a torch rank may run in (module doc).
PRECISIONS = ("compute", "graph")
#: A declared float dtype -> the torch dtype it runs in under precision "graph".
_GRAPH_FLOATS = {
    "bfloat16": "bfloat16",
    "float16": "float16",
    "float32": "float32",
    "float64": "float32",
}


@dataclass(frozen=True, slots=True)
class RankDevice:
    """A rank's device ("cpu" | "cuda") and precision ("compute" | "graph"); module doc."""

    device: str = "cpu"
    precision: str = "compute"

    def __post_init__(self) -> None:
        if self.device not in COLLECTIVE_BACKENDS:
            raise ExecutionError(
                f"device {self.device!r}: the torch backend runs on "
                f"{' or '.join(COLLECTIVE_BACKENDS)}",
                device=self.device,
            )
        if self.precision not in PRECISIONS:
            raise ExecutionError(
                f"precision {self.precision!r}: expected one of {', '.join(PRECISIONS)}",
                precision=self.precision,
            )

    @property
    def collective_backend(self) -> str:
        """The torch.distributed backend of this device: gloo on CPU, NCCL on CUDA."""
        return COLLECTIVE_BACKENDS[self.device]

    @property
    def is_cuda(self) -> bool:
        return self.device == "cuda"

    def check_devices(self, nproc: int) -> None:
        """ExecutionError unless this machine has the devices `nproc` ranks need (CUDA: a
        GPU per rank; NCCL refuses two ranks on one GPU)."""
        if not self.is_cuda:
            return
        import torch

        if not torch.cuda.is_available():
            raise ExecutionError(
                "device 'cuda': this machine has no CUDA device (torch.cuda.is_available() is "
                "False); run on device 'cpu' (gloo)",
                device=self.device,
            )
        have = torch.cuda.device_count()
        if nproc > have:
            raise ExecutionError(
                f"device 'cuda': {nproc} ranks need {nproc} GPUs (NCCL runs one rank per GPU), "
                f"this machine has {have}",
                device=self.device,
                nproc=nproc,
                gpus=have,
            )

    def bind(self, local_index: int) -> Any:
        """The torch device of process `local_index` on its node (CUDA: made current)."""
        import torch

        if not self.is_cuda:
            return torch.device("cpu")
        index = local_index % max(1, torch.cuda.device_count())
        torch.cuda.set_device(index)
        return torch.device("cuda", index)

    def current(self) -> Any:
        """The torch device this process computes on (CUDA: the one `bind` made current)."""
        import torch

        if not self.is_cuda:
            return torch.device("cpu")
        return torch.device("cuda", torch.cuda.current_device())

    def synchronize(self) -> None:
        """Wait for the work queued on the current stream (CUDA kernels run asynchronously;
        a wall clock read around an op must see it finished; a collective's own stream is
        joined by its handle's wait). Nothing to wait for on CPU."""
        if self.is_cuda:
            import torch

            torch.cuda.current_stream().synchronize()

    def run_dtype(self, declared: str) -> str | None:
        """The torch dtype name a float value declared `declared` runs in, or None to keep
        the dtype its block arrives in (precision "compute", or not a float)."""
        if self.precision != "graph":
            return None
        return _GRAPH_FLOATS.get(declared)


def bind_torch(namespace: dict[str, Any]) -> None:
    """Bind `torch` in a module's globals on first use: the torch backend's op modules keep
    the engine torch-free until a rank computes (`torch_ops.load_torch`)."""
    if "torch" not in namespace:
        import torch

        namespace["torch"] = torch


def to_device(block: Array, where: Any, dtype: str | None = None) -> Any:
    """A numpy block as a tensor on torch device `where` (no copy on CPU where possible),
    cast to torch dtype `dtype` when given and the block is a float."""
    import torch

    arr = np.asarray(block)
    if not (arr.flags.c_contiguous and arr.flags.writeable):
        arr = np.array(arr, order="C", copy=True)
    t = torch.from_numpy(arr)
    if dtype is not None and t.is_floating_point():
        t = t.to(getattr(torch, dtype))
    return t.to(where) if where.type != "cpu" else t


def to_host(t: Any) -> Array:
    """A tensor as a numpy array on the host (bfloat16 as float32, which holds it exactly)."""
    import torch

    if t.dtype == torch.bfloat16:
        t = t.to(torch.float32)
    return np.asarray(t.detach().cpu().numpy())
