"""Clusters as data: the devices a plan runs on, how fast they compute and how they talk.

A `Cluster` is read from JSON, either a preset shipped in `shardlab/cost/presets/` or a user's
file (the calibration job writes one), and feeds the compute, communication and memory models.
Every figure is per device (one GPU, or one CPU process for `cpu-local`), in FLOP/s, bytes,
bytes per second and seconds. Devices are numbered node by node: device d sits on node
`d // devices_per_node`, and the ranks of a mesh are device indices.

Preset names (`preset_names()`): `<family>-<nodes>x<devices_per_node>` for the GPU families
`h100-sxm`, `h200` and `a100-80g` (e.g. `h100-sxm-8x8`: 8 nodes of 8 GPUs), whose JSON file
holds one node's figures, plus `cpu-local` (this machine, 2 gloo ranks). `peak_flops` are dense
(no sparsity); `float32` is the non-tensor-core rate, `tfloat32` the TF32 tensor-core rate.
Memory sizes of GPU presets are the datasheets' decimal gigabytes (80 GB = 80e9 bytes); each
file's `description` and `source` fields say where its numbers come from.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from shardlab.errors import ClusterError
from shardlab.mesh import Mesh

#: dtype names `peak_flops` may use (`tfloat32`: float32 matmuls on TF32 tensor cores).
KNOWN_DTYPES = ("float64", "float32", "tfloat32", "bfloat16", "float16")
#: GPU families: their JSON holds one node; users name a shape `<family>-<nodes>x<per node>`.
FAMILIES = ("h100-sxm", "h200", "a100-80g")
#: Presets whose JSON is the whole cluster, named as is.
FIXED_PRESETS = ("cpu-local",)
_LISTED = ("h100-sxm-8x8", "h100-sxm-1x8", "h100-sxm-64x8", "h200-8x8", "a100-80g-8x8")
_LINK_FIELDS = ("bandwidth", "latency")
_REQUIRED = (
    "name",
    "nodes",
    "devices_per_node",
    "peak_flops",
    "hbm_bytes",
    "hbm_bandwidth",
    "intra_node",
    "inter_node",
    "overlap_slowdown",
    "launch_overhead",
    "matmul_efficiency",
    "memory_efficiency",
)
_OPTIONAL = (
    "description", "source", "kernel_scale", "kernel_overhead", "comm_scale", "op_overhead",
    "straggle",
)  # fmt: skip
#: collective kinds `comm_scale` may name (`shardlab.cost.comm` prices them)
COMM_KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send", "recv")


@dataclass(frozen=True, slots=True)
class Link:
    """What a ring over one kind of link achieves (validated by the `Cluster` holding it)."""

    #: bytes/s per device per direction: the bus bandwidth a ring reaches, not the line rate
    bandwidth: float
    #: seconds per ring step
    latency: float

    def to_json(self) -> dict[str, float]:
        """The JSON form: `{"bandwidth": ..., "latency": ...}`."""
        return {"bandwidth": self.bandwidth, "latency": self.latency}


@dataclass(frozen=True, slots=True)
class Cluster:
    """Devices grouped into nodes, with per-device speed, memory and link figures."""

    name: str
    nodes: int
    devices_per_node: int
    #: dense FLOP/s per dtype name (see KNOWN_DTYPES)
    peak_flops: dict[str, float] = field(hash=False)
    hbm_bytes: float
    #: bytes/s of device memory
    hbm_bandwidth: float
    intra_node: Link
    inter_node: Link
    #: fraction by which compute slows while communication runs on the same device
    overlap_slowdown: float
    #: seconds: the floor of any kernel's time
    launch_overhead: float
    #: fraction of peak FLOP/s the best large matmul reaches
    matmul_efficiency: float
    #: fraction of hbm_bandwidth memory-bound kernels reach
    memory_efficiency: float
    description: str = ""
    #: where the numbers come from
    source: str = ""
    #: per op kind, a factor on its roofline time (a calibrated device's kernels that run
    #: slower or faster than the roofline says); kinds not named keep 1
    kernel_scale: dict[str, float] = field(default_factory=dict, hash=False)
    #: per op kind, seconds each op of the kind costs beside its scaled roofline time (a
    #: calibrated backend's fixed cost of the kind's kernel: its temporaries and passes,
    #: whatever the op's size); kinds not named add 0
    kernel_overhead: dict[str, float] = field(default_factory=dict, hash=False)
    #: per collective kind (`COMM_KINDS`), a factor on its ring time: what a calibrated
    #: backend's collectives cost inside a training step against the same ones timed alone
    #: (ranks arriving apart, the collective's threads sharing the cores); kinds not named
    #: keep 1
    comm_scale: dict[str, float] = field(default_factory=dict, hash=False)
    #: seconds a calibrated backend spends running each op of a program beside its kernel
    #: or collective (its interpreter's bookkeeping): added to every compute op, views
    #: included, and every communication step; 0 for the GPU presets
    op_overhead: float = 0.0
    #: the fraction by which the slowest rank's compute of a step exceeds the sum of its ops'
    #: own times (ranks sharing cores are descheduled for whole time slices, and the step
    #: waits for the rank that lost the most): every compute op's kernel time grows by it;
    #: 0 for the GPU presets
    straggle: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ClusterError(
                f"cluster field 'name' must be a non-empty string, got {self.name!r}",
                field="name",
                value=repr(self.name),
            )
        check = _Checker(self.name)
        for name in ("description", "source"):
            if not isinstance(getattr(self, name), str):
                raise check.error(name, "must be a string", getattr(self, name))
        values: dict[str, Any] = {
            "nodes": check.count("nodes", self.nodes),
            "devices_per_node": check.count("devices_per_node", self.devices_per_node),
            "peak_flops": check.flops(self.peak_flops),
            "hbm_bytes": check.number("hbm_bytes", self.hbm_bytes),
            "hbm_bandwidth": check.number("hbm_bandwidth", self.hbm_bandwidth),
            "intra_node": check.link("intra_node", self.intra_node),
            "inter_node": check.link("inter_node", self.inter_node),
            "overlap_slowdown": check.number("overlap_slowdown", self.overlap_slowdown, zero=True),
            "launch_overhead": check.number("launch_overhead", self.launch_overhead, zero=True),
            "matmul_efficiency": check.fraction("matmul_efficiency", self.matmul_efficiency),
            "memory_efficiency": check.fraction("memory_efficiency", self.memory_efficiency),
            "kernel_scale": check.scales(self.kernel_scale),
            "kernel_overhead": check.overheads(self.kernel_overhead),
            "comm_scale": check.comm_scales(self.comm_scale),
            "op_overhead": check.number("op_overhead", self.op_overhead, zero=True),
            "straggle": check.number("straggle", self.straggle, zero=True),
        }
        for name, value in values.items():
            object.__setattr__(self, name, value)

    @property
    def world_size(self) -> int:
        """Number of devices in the cluster."""
        return self.nodes * self.devices_per_node

    def node_of(self, device: int) -> int:
        """The node that holds `device` (devices are numbered node by node)."""
        if not 0 <= device < self.world_size:
            raise ClusterError(
                f"device {device} is outside cluster {self.name!r}, which has "
                f"{self.world_size} devices ({self.nodes} nodes x {self.devices_per_node})",
                cluster=self.name,
                device=device,
            )
        return device // self.devices_per_node

    def to_json(self) -> dict[str, Any]:
        """The JSON form, accepted back by `from_json` and `load_cluster`."""
        return {
            "name": self.name,
            "description": self.description,
            "source": self.source,
            "nodes": self.nodes,
            "devices_per_node": self.devices_per_node,
            "peak_flops": dict(self.peak_flops),
            "hbm_bytes": self.hbm_bytes,
            "hbm_bandwidth": self.hbm_bandwidth,
            "intra_node": self.intra_node.to_json(),
            "inter_node": self.inter_node.to_json(),
            "overlap_slowdown": self.overlap_slowdown,
            "launch_overhead": self.launch_overhead,
            "matmul_efficiency": self.matmul_efficiency,
            "memory_efficiency": self.memory_efficiency,
            **({"kernel_scale": dict(self.kernel_scale)} if self.kernel_scale else {}),
            **({"kernel_overhead": dict(self.kernel_overhead)} if self.kernel_overhead else {}),
            **({"comm_scale": dict(self.comm_scale)} if self.comm_scale else {}),
            **({"op_overhead": self.op_overhead} if self.op_overhead else {}),
            **({"straggle": self.straggle} if self.straggle else {}),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Cluster:
        """A cluster from its JSON form: known keys only, every required field, sane values."""
        if not isinstance(data, Mapping):
            raise ClusterError(f"cluster JSON must be an object, got {type(data).__name__}")
        if "name" not in data:
            raise ClusterError("cluster JSON: field 'name' is missing", field="name")
        check = _Checker(data["name"])
        check.keys("", data, _REQUIRED, _OPTIONAL)
        links: dict[str, Link] = {}
        for name in ("intra_node", "inter_node"):
            link = data[name]
            if not isinstance(link, Mapping):
                raise check.error(name, "must be an object with bandwidth and latency", link)
            check.keys(f"{name}.", link, _LINK_FIELDS, ())
            links[name] = Link(link["bandwidth"], link["latency"])
        flops = data["peak_flops"]
        if not isinstance(flops, Mapping):
            raise check.error("peak_flops", "must be an object of dtype -> FLOP/s", flops)
        fields = {k: data[k] for k in (*_REQUIRED, *_OPTIONAL) if k in data}
        fields.update(links, peak_flops=dict(flops))
        return cls(**fields)


class _Checker:
    """Validates one cluster's fields; every error names the cluster, the field and the value."""

    def __init__(self, cluster: object) -> None:
        self.cluster = cluster

    def error(self, path: str, what: str, value: object) -> ClusterError:
        return ClusterError(
            f"cluster {self.cluster!r}: field {path!r} {what}, got {value!r}",
            cluster=str(self.cluster),
            field=path,
            value=repr(value),
        )

    def keys(
        self,
        prefix: str,
        data: Mapping[str, Any],
        required: tuple[str, ...],
        optional: tuple[str, ...],
    ) -> None:
        known = (*required, *optional)
        for key in data:
            if key not in known:
                raise ClusterError(
                    f"cluster {self.cluster!r}: unknown field {prefix + str(key)!r}; "
                    f"known fields: {', '.join(prefix + k for k in known)}",
                    cluster=str(self.cluster),
                    field=prefix + str(key),
                )
        for key in required:
            if key not in data:
                raise ClusterError(
                    f"cluster {self.cluster!r}: field {prefix + key!r} is missing",
                    cluster=str(self.cluster),
                    field=prefix + key,
                )

    def count(self, path: str, value: object) -> int:
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise self.error(path, "must be a positive integer", value)
        return value

    def number(self, path: str, value: object, *, zero: bool = False) -> float:
        what = f"must be a {'non-negative' if zero else 'positive'} number"
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.error(path, what, value)
        try:
            number = float(value)
        except OverflowError:
            raise self.error(path, what, value) from None
        if not math.isfinite(number) or number < 0 or (number == 0 and not zero):
            raise self.error(path, what, value)
        return number

    def fraction(self, path: str, value: object) -> float:
        number = self.number(path, value)
        if number > 1:
            raise self.error(path, "must be a fraction in (0, 1]", value)
        return number

    def link(self, path: str, value: object) -> Link:
        if not isinstance(value, Link):
            raise self.error(path, "must be a Link", value)
        return Link(
            self.number(f"{path}.bandwidth", value.bandwidth),
            self.number(f"{path}.latency", value.latency, zero=True),
        )

    def scales(self, value: object) -> dict[str, float]:
        if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
            raise self.error("kernel_scale", "must be an object of op kind -> factor", value)
        return {k: self.number(f"kernel_scale.{k}", v) for k, v in value.items()}

    def overheads(self, value: object) -> dict[str, float]:
        if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
            raise self.error("kernel_overhead", "must be an object of op kind -> seconds", value)
        return {k: self.number(f"kernel_overhead.{k}", v, zero=True) for k, v in value.items()}

    def comm_scales(self, value: object) -> dict[str, float]:
        if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
            raise self.error("comm_scale", "must be an object of collective kind -> factor", value)
        return self.keyed_numbers("comm_scale", value, COMM_KINDS, "collective kind")

    def flops(self, value: object) -> dict[str, float]:
        if not isinstance(value, Mapping) or not value:
            raise self.error("peak_flops", "must be a non-empty object of dtype -> FLOP/s", value)
        return self.keyed_numbers("peak_flops", value, KNOWN_DTYPES, "dtype")

    def keyed_numbers(
        self, name: str, value: Mapping[Any, object], known: Sequence[str], what: str
    ) -> dict[str, float]:
        """`value`'s positive numbers by key, every key one of `known` (else an error naming
        the field and the key)."""
        for key in value:
            if key not in known:
                raise ClusterError(
                    f"cluster {self.cluster!r}: field {name!r} has unknown {what} {key!r}; "
                    f"known {what}s: {', '.join(known)}",
                    cluster=str(self.cluster),
                    field=f"{name}.{key}",
                )
        return {key: self.number(f"{name}.{key}", v) for key, v in value.items()}


def cluster_from_dict(data: Mapping[str, Any]) -> Cluster:
    """A cluster from its parsed JSON form (see `Cluster.from_json`)."""
    return Cluster.from_json(data)


def preset_names() -> list[str]:
    """The preset names to show users; any `<family>-<nodes>x<per node>` also loads."""
    return [*_LISTED, *FIXED_PRESETS]


def load_cluster(name_or_path: str | os.PathLike[str]) -> Cluster:
    """A preset by name (`h100-sxm-8x8`, `cpu-local`) or a user's cluster JSON file.

    A path-like object, or a string that ends in `.json` or contains a path separator, is read
    as a file; anything else is a preset name.
    """
    if isinstance(name_or_path, os.PathLike):
        return _load_file(Path(name_or_path))
    text = str(name_or_path)
    if text.endswith(".json") or "/" in text or os.sep in text:
        return _load_file(Path(text))
    return _load_preset(text)


def _load_file(path: Path) -> Cluster:
    where = f"cluster file {str(path)!r}"
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ClusterError(f"{where} not found", path=str(path)) from None
    except (OSError, UnicodeDecodeError) as e:
        raise ClusterError(f"{where} cannot be read: {e}", path=str(path)) from e
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ClusterError(
            f"{where} is not valid JSON: {e.msg} at line {e.lineno}, column {e.colno}",
            path=str(path),
            line=e.lineno,
            column=e.colno,
        ) from e
    try:
        return cluster_from_dict(data)
    except ClusterError as e:
        raise ClusterError(f"{where}: {e.message}", path=str(path), **e.detail) from e


@functools.cache
def _preset_text(name: str) -> str:
    return (resources.files("shardlab.cost") / "presets" / f"{name}.json").read_text("utf-8")


def _unknown(name: str, hint: str = "") -> ClusterError:
    return ClusterError(
        f"unknown cluster {name!r}{hint}; known presets: {', '.join(preset_names())}, "
        f"or <family>-<nodes>x<devices_per_node> for family {', '.join(FAMILIES)}, "
        "or a path to a cluster JSON file",
        name=name,
        known=preset_names(),
    )


def _load_preset(name: str) -> Cluster:
    if name in FIXED_PRESETS:
        return cluster_from_dict(json.loads(_preset_text(name)))
    if name in FAMILIES:
        raise _unknown(name, f" (give the shape, e.g. '{name}-8x8')")
    family = next((f for f in FAMILIES if name.startswith(f + "-")), None)
    if family is None:
        raise _unknown(name)
    shape = re.fullmatch(r"(\d+)x(\d+)", name[len(family) + 1 :])
    if shape is None:
        raise _unknown(name, f" (expected '{family}-<nodes>x<devices_per_node>')")
    node = cluster_from_dict(json.loads(_preset_text(family)))
    nodes, per_node = int(shape[1]), int(shape[2])
    if nodes < 1 or not 1 <= per_node <= node.devices_per_node:
        raise ClusterError(
            f"cluster {name!r}: needs at least 1 node and 1 to {node.devices_per_node} devices "
            f"per node (each {family} node holds {node.devices_per_node}), got {nodes} nodes x "
            f"{per_node} devices",
            name=name,
            nodes=nodes,
            devices_per_node=per_node,
        )
    return dataclasses.replace(node, name=name, nodes=nodes, devices_per_node=per_node)


def check_mesh_fits(mesh: Mesh, cluster: Cluster) -> None:
    """A ClusterError naming both when the mesh needs more devices than the cluster has."""
    if mesh.size > cluster.world_size:
        raise ClusterError(
            f"mesh {mesh} has {mesh.size} devices but cluster {cluster.name!r} has "
            f"{cluster.world_size}",
            mesh=str(mesh),
            cluster=cluster.name,
        )
