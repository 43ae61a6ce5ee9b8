"""What this worker runs on: its CPU cores, its CUDA devices, whether it has torch.

`discover()` asks the machine (`os.sched_getaffinity` for the cores this process may use;
torch, when importable, for its version and `torch.cuda` devices with name and memory).
`SHARDLAB_WORKER_DEVICES` overrides it with a JSON document in the shape of
`Devices.to_json` (`{"cpu_cores": 4, "cuda": [{"index": 0, "name": "...",
"memory_bytes": ...}], "torch": "2.13.0"}`), so tests (and operators who want to hold a
worker to less than it has) can give a worker devices it does not own.
"""

from __future__ import annotations

import json
import os

from backend.devices import CudaDevice, Devices

__all__ = ["ENV", "Devices", "discover", "from_env"]

#: the variable that overrides discovery
ENV = "SHARDLAB_WORKER_DEVICES"


def cpu_cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def torch_devices() -> tuple[str | None, tuple[CudaDevice, ...]]:
    """torch's version and its CUDA devices; (None, ()) without torch."""
    try:
        import torch
    except ImportError:
        return None, ()
    version = str(torch.__version__).split("+")[0]
    if not torch.cuda.is_available():
        return version, ()
    found = []
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        found.append(CudaDevice(index, str(props.name), int(props.total_memory)))
    return version, tuple(found)


def from_env(env: dict[str, str] | None = None) -> Devices | None:
    """The devices `SHARDLAB_WORKER_DEVICES` names (None when unset); ValueError naming the
    variable when it is not a devices document."""
    raw = (os.environ if env is None else env).get(ENV)
    if raw is None:
        return None
    try:
        data = json.loads(raw)
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        return Devices.from_json(data)
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{ENV}={raw!r} is not a devices document: {exc}") from exc


def discover(env: dict[str, str] | None = None) -> Devices:
    """This worker's devices: `SHARDLAB_WORKER_DEVICES` if set, else the machine's."""
    given = from_env(env)
    if given is not None:
        return given
    version, cuda = torch_devices()
    return Devices(cpu_cores(), cuda, version)
