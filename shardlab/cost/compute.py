"""Compute time of ops: FLOPs and bytes from the op catalog, a roofline, calibrated tables.

What it is for: give every compute op of a `DistProgram` a duration on one rank, which the
timeline turns into a step time, and count the FLOPs of a serial (training) graph for MFU.

The model, per op on one device (`roofline_time`):

    t = max(flops / (peak[dtype] * eff), bytes / (hbm_bandwidth * memory_efficiency))
        + launch_overhead

- matmul-like kinds (`MATMUL_KINDS`) reach `eff = matmul_efficiency * f / (f + f_half)`:
  large ones approach `matmul_efficiency`, small ones run far below it (tile quantization,
  too few thread blocks to fill the device). `f_half` is the size that reaches half of it,
  `peak * matmul_efficiency * MATMUL_RAMP_SECONDS` (~1.5 GFLOP on an H100 in bfloat16, about
  a 900^3 matmul); scaling it by the device keeps the ramp sensible on a CPU, where 2 GFLOP
  would be seconds of work. Equivalently a matmul costs `MATMUL_RAMP_SECONDS` more than it
  would at full efficiency.
- every other kind (elementwise, norms, softmax, losses, gathers, optimizer steps) reaches
  `VECTOR_EFFICIENCY` of the dtype's peak: those kernels run on the vector units, not the
  tensor cores the presets' 16-bit peaks quote, and are almost always memory-bound anyway.
- a dtype missing from `peak_flops` (e.g. an integer op) uses the float32 peak.
- an op that neither computes nor moves bytes (a reshape: a view) takes no time at all.

A calibrated cluster's `kernel_scale` multiplies `max(...)` of the kinds it names (a CPU's
kernels run some kinds far from the roofline: einsum attention, many-pass optimizers), its
`kernel_overhead` adds a kind's fixed seconds per op (the part of a kernel's time that does
not grow with its size), and its `op_overhead` (seconds a backend spends running any op
beside its kernel) is added to every compute op of a program, views and waits included,
whose kernel time grows by its `straggle` (the slowest rank's share of time slices lost
when ranks share cores; `program_op_times`; both 0 on presets).
A `CalibrationTable` of measured (kind, flops, bytes, seconds) overrides the roofline for the
kinds it holds (see `CalibrationTable.seconds`). Communication kinds are costed elsewhere;
the few all-reduces a local kernel runs inside its op (vocab-parallel cross entropy) are
priced by `cost.kernel_comm` and added to that op's time.
"""

from __future__ import annotations

import bisect
import json
import math
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from shardlab.cost.clusters import Cluster
from shardlab.cost.kernel_comm import midop_seconds
from shardlab.errors import ClusterError, ShardlabError
from shardlab.ir import Graph, Op, OpRole, TensorType
from shardlab.ops import get_op
from shardlab.placement import DistSpec, local_shape
from shardlab.program import DistOp, DistProgram
from shardlab.reuse import Memo

#: Kinds that run on the tensor cores (or the BLAS of a CPU) and follow the matmul ramp.
#: embedding / embedding_grad are gathers and scatter-adds, not matmuls: they are costed like
#: every other memory-bound kind.
MATMUL_KINDS = frozenset({"matmul", "linear", "scaled_dot_product_attention", "attention_grad"})
#: Seconds a matmul loses to its size ramp: f_half = peak * matmul_efficiency * this.
MATMUL_RAMP_SECONDS = 2e-6
#: Fraction of the dtype's peak FLOP/s that non-matmul kinds reach (vector units: an H100 does
#: ~134 TFLOP/s of bfloat16 vector math against 989 on its tensor cores).
VECTOR_EFFICIENCY = 0.1
#: The dtype whose peak stands in for a dtype the device does not list.
FALLBACK_DTYPE = "float32"


class ComputeDevice(Protocol):
    """What the compute model reads of a device (a `shardlab.cost.clusters.Cluster`)."""

    @property
    def peak_flops(self) -> Mapping[str, float]: ...  # FLOP/s per dtype name

    @property
    def hbm_bandwidth(self) -> float: ...  # bytes/s

    @property
    def launch_overhead(self) -> float: ...  # seconds per kernel

    @property
    def matmul_efficiency(self) -> float: ...  # fraction of peak large matmuls reach

    @property
    def memory_efficiency(self) -> float: ...  # fraction of hbm_bandwidth kernels reach


# -- counts -------------------------------------------------------------------------------


def op_flops(
    kind: str,
    in_types: Sequence[TensorType],
    out_types: Sequence[TensorType],
    attrs: Mapping[str, Any],
) -> int:
    """FLOPs of one application of `kind`, as its OpDef declares them."""
    return get_op(kind).flops(in_types, out_types, attrs)


def op_bytes(
    kind: str,
    in_types: Sequence[TensorType],
    out_types: Sequence[TensorType],
    attrs: Mapping[str, Any],
) -> int:
    """Bytes one application of `kind` reads and writes, as its OpDef declares them."""
    return get_op(kind).bytes(in_types, out_types, attrs)


def training_flops(graph: Graph) -> int:
    """Global FLOPs of every op of a serial graph: forward, loss, backward and optimizer for a
    training graph (the same catalog counts `Graph.flops` uses for a forward graph). Hardware
    FLOPs: attention_grad includes the flash-attention recomputation of the scores."""
    return graph.flops()


def _op_flops(graph: Graph, op: Op) -> int:
    ins = [graph.type_of(v) for v in op.inputs]
    outs = [graph.type_of(v) for v in op.outputs]
    return op_flops(op.kind, ins, outs, op.attrs)


def model_flops(graph: Graph) -> int:
    """Model FLOPs of one training step: three times the forward's (forward and loss ops),
    the convention of MFU in PaLM and Megatron-LM (the backward does twice the forward's
    work). Recomputation, the backward kernels' own recomputation (flash attention) and the
    optimizer step are not model FLOPs. Causal attention counts the pairs its mask keeps."""
    forward = (OpRole.FORWARD, OpRole.LOSS)
    return 3 * sum(_op_flops(graph, op) for op in graph.ops if op.role in forward)


def hardware_flops(graph: Graph) -> int:
    """FLOPs the devices execute in one training step: every forward, loss and backward op
    as the catalog counts it (recomputed ops, flash attention's recomputed scores included);
    the optimizer step is left out, as in Korthikanti et al.'s HFU."""
    return sum(_op_flops(graph, op) for op in graph.ops if op.role != OpRole.OPTIMIZER)


def flops_by_kind(graph: Graph) -> dict[str, int]:
    """Global FLOPs of a serial graph per op kind, largest first."""
    out: dict[str, int] = {}
    for op in graph.ops:
        ins = [graph.type_of(v) for v in op.inputs]
        outs = [graph.type_of(v) for v in op.outputs]
        out[op.kind] = out.get(op.kind, 0) + op_flops(op.kind, ins, outs, op.attrs)
    return dict(sorted(out.items(), key=lambda kv: (-kv[1], kv[0])))


# -- roofline -----------------------------------------------------------------------------


def peak_for(device: ComputeDevice, dtype: str) -> float:
    """The device's peak FLOP/s for `dtype`, else its float32 peak."""
    peak = device.peak_flops.get(dtype, device.peak_flops.get(FALLBACK_DTYPE))
    if peak is None or peak <= 0:
        raise ClusterError(
            f"the device has no positive peak_flops for {dtype!r} nor {FALLBACK_DTYPE!r}",
            field="peak_flops",
        )
    return peak


def efficiency(kind: str, flops: int, dtype: str, device: ComputeDevice) -> float:
    """Fraction of the dtype's peak an op of `kind` with `flops` FLOPs reaches."""
    if kind not in MATMUL_KINDS:
        return VECTOR_EFFICIENCY
    f_half = peak_for(device, dtype) * device.matmul_efficiency * MATMUL_RAMP_SECONDS
    return device.matmul_efficiency * flops / (flops + f_half)


def roofline_time(kind: str, flops: int, bytes_: int, dtype: str, device: ComputeDevice) -> float:
    """Seconds of one op on `device` by the roofline (module docstring); 0 for a view."""
    if flops <= 0 and bytes_ <= 0:
        return 0.0
    compute = 0.0
    if flops > 0:
        compute = flops / (peak_for(device, dtype) * efficiency(kind, flops, dtype, device))
    memory = bytes_ / (device.hbm_bandwidth * device.memory_efficiency)
    # a calibrated device's per-kind factor and fixed cost (`Cluster.kernel_scale`,
    # `Cluster.kernel_overhead`; presets have neither)
    scale = getattr(device, "kernel_scale", None)
    factor = scale.get(kind, 1.0) if scale else 1.0
    fixed = getattr(device, "kernel_overhead", None)
    extra = fixed.get(kind, 0.0) if fixed else 0.0
    return max(compute, memory) * factor + extra + device.launch_overhead


def compute_time(
    kind: str,
    flops: int,
    bytes_: int,
    dtype: str,
    device: ComputeDevice,
    table: CalibrationTable | None = None,
) -> float:
    """Seconds of one op: the calibrated table's estimate when it holds `kind`, else the
    roofline."""
    if flops <= 0 and bytes_ <= 0:
        return 0.0
    if table is not None:
        measured = table.seconds(
            kind, flops, bytes_, lambda f, b: roofline_time(kind, f, b, dtype, device)
        )
        if measured is not None:
            return measured
    return roofline_time(kind, flops, bytes_, dtype, device)


# -- programs -----------------------------------------------------------------------------


def local_types(program: DistProgram, names: Iterable[str]) -> list[TensorType]:
    """The type of the block one rank holds of each program value (Partial keeps the shape)."""
    out = []
    for name in names:
        t, spec = program.types[name], program.specs[name]
        out.append(t.with_shape(local_shape(t.shape, spec.mesh, spec.placements)))
    return out


def op_dtype(types: Sequence[TensorType]) -> str:
    """The dtype an op computes in: its first floating-point type (inputs first)."""
    for t in types:
        if t.is_float:
            return t.dtype
    return types[0].dtype if types else FALLBACK_DTYPE


#: What `program_op_times` remembers between programs that share ops (a plan's stages):
#: op name -> (the op, the specs of its inputs and outputs, its seconds).
OpTimeMemo = dict[str, tuple[DistOp, tuple[DistSpec, ...], float]]


def program_op_times(
    program: DistProgram,
    device: ComputeDevice,
    table: CalibrationTable | None = None,
    memo: OpTimeMemo | None = None,
) -> dict[str, float]:
    """Seconds of every compute op of `program` on one rank, by op name; comm ops are skipped.

    Every rank is costed on the largest block of each value (DTensor's uneven shards: the
    first blocks are the largest), so one rank's times stand for all of them, the slowest's; each
    includes the device's `op_overhead` when it has one (a calibrated cluster's). A local
    kernel (e.g. vocab-parallel cross entropy) is counted by its kind's OpDef on the local
    blocks, plus, on a `Cluster`, the all-reduces it runs mid-op (`cost.kernel_comm`); an op
    computes in the dtype of its first floating-point input (`op_dtype`).
    With a `memo` (one per device and table, e.g. one per `build_plan`), an op that is the
    very object of an earlier program, with the same specs, keeps its earlier time: a pass
    changes a few ops, and the plan's stages are costed without re-pricing the rest.
    """
    times: dict[str, float] = {}
    specs = program.specs
    # a calibrated backend's per-op time beside the kernel (`Cluster.op_overhead`) and its
    # slowest rank's share of time slices lost (`Cluster.straggle`)
    overhead = float(getattr(device, "op_overhead", 0.0))
    stretch = 1.0 + float(getattr(device, "straggle", 0.0))
    _alike_for(device, table)
    for op in program.ops:
        if op.is_comm:
            continue
        layout = tuple(specs[v] for v in (*op.inputs, *op.outputs))
        known = memo.get(op.name) if memo is not None else None
        if known is not None and known[0] is op and known[1] == layout:
            times[op.name] = known[2]
            continue
        signature = _signature(program, op, layout)
        seconds = ALIKE_OPS.get(signature) if signature is not None else None
        if seconds is None:
            ins, outs = local_types(program, op.inputs), local_types(program, op.outputs)
            flops = op_flops(op.kind, ins, outs, op.attrs)
            bytes_ = op_bytes(op.kind, ins, outs, op.attrs)
            seconds = overhead + stretch * compute_time(
                op.kind, flops, bytes_, op_dtype([*ins, *outs]), device, table
            )
            if isinstance(device, Cluster):  # a kernel's own all-reduces (`cost.kernel_comm`)
                seconds += midop_seconds(program, op, device)
            if signature is not None:
                ALIKE_OPS.put(signature, seconds)
        times[op.name] = seconds
        if memo is not None:
            memo[op.name] = (op, layout, times[op.name])
    return times


#: Op times by what they depend on (`_signature`), kept per worker process: the repeated
#: layers of a model, its pipeline stages and the plans of a search meet the same ops under
#: other names again and again.
ALIKE_OPS = Memo[float]("op times", 1 << 16)


def _signature(program: DistProgram, op: DistOp, layout: tuple[DistSpec, ...]) -> Hashable | None:
    """What an op's time depends on, without its name (for `ALIKE_OPS`' device and table):
    its kind, kernel and attributes (not a dropout's seed), its values' types and layouts,
    and the ranks it runs on (a kernel's own collectives); None where not hashable."""
    attrs = tuple(sorted((k, repr(v)) for k, v in op.attrs.items() if k != "seed"))
    types = tuple(program.types[v] for v in (*op.inputs, *op.outputs))
    key = (op.kind, op.kernel, len(op.inputs), attrs, types, layout, program.mesh)
    try:
        hash(key)
    except TypeError:
        return None
    return key


def _alike_for(device: ComputeDevice, table: CalibrationTable | None) -> None:
    """Empty `ALIKE_OPS` when asked about another device or table than its entries are for
    (by identity: one of each per search worker; the memo holds them while it is theirs)."""
    if _ALIKE_FOR[0] is not device or _ALIKE_FOR[1] is not table:
        ALIKE_OPS.clear()
        _ALIKE_FOR[:] = [device, table]


_ALIKE_FOR: list[object] = [None, None]


# -- calibration --------------------------------------------------------------------------

Roofline = Callable[[int, int], float]


@dataclass(frozen=True, slots=True)
class CalibrationEntry:
    """One measured op on one device: kind, FLOPs and bytes (per rank) and its seconds."""

    kind: str
    flops: int
    bytes: int
    seconds: float


@dataclass(frozen=True, slots=True)
class CalibrationTable:
    """Measured op times of one device, which override the roofline for the kinds they cover.

    JSON: `{"device": str, "entries": [{"kind", "flops", "bytes", "seconds"}, ...]}`.
    """

    device: str
    entries: tuple[CalibrationEntry, ...]
    _exact: dict[tuple[str, int, int], float] = field(init=False, repr=False, compare=False)
    _by_kind: dict[str, list[CalibrationEntry]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        exact: dict[tuple[str, int, int], float] = {}
        by_kind: dict[str, list[CalibrationEntry]] = {}
        for e in self.entries:
            exact[(e.kind, e.flops, e.bytes)] = e.seconds
            by_kind.setdefault(e.kind, []).append(e)
        object.__setattr__(self, "_exact", exact)
        object.__setattr__(self, "_by_kind", by_kind)

    @classmethod
    def from_json(cls, data: Any, source: str = "calibration table") -> CalibrationTable:
        """A table from its parsed JSON; ClusterError naming the entry and field otherwise."""
        if not isinstance(data, dict):
            raise ClusterError(f"{source}: expected a JSON object with 'device' and 'entries'")
        device = data.get("device")
        if not isinstance(device, str) or not device:
            raise ClusterError(f"{source}: 'device' must be a non-empty string", field="device")
        raw = data.get("entries")
        if not isinstance(raw, list):
            raise ClusterError(f"{source}: 'entries' must be a list", field="entries")
        entries: list[CalibrationEntry] = []
        seen: dict[tuple[str, int, int], int] = {}
        for i, item in enumerate(raw):
            entry = _parse_entry(item, i, source)
            key = (entry.kind, entry.flops, entry.bytes)
            if key in seen:
                raise ClusterError(
                    f"{source}: entry {i} repeats entry {seen[key]} ({entry.kind}, flops "
                    f"{entry.flops}, bytes {entry.bytes})",
                    entry=i,
                )
            seen[key] = i
            entries.append(entry)
        return cls(device, tuple(entries))

    @classmethod
    def load(cls, path: str | Path) -> CalibrationTable:
        """Read a table from a JSON file; ClusterError naming the file (and line) if invalid."""
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except OSError as exc:
            raise ClusterError(f"cannot read calibration table {path}: {exc}") from None
        except json.JSONDecodeError as exc:
            raise ClusterError(
                f"{path}: not JSON: {exc.msg} at line {exc.lineno}", line=exc.lineno
            ) from None
        return cls.from_json(data, str(path))

    def to_json(self) -> dict[str, Any]:
        """The JSON form `from_json` reads."""
        return {
            "device": self.device,
            "entries": [
                {"kind": e.kind, "flops": e.flops, "bytes": e.bytes, "seconds": e.seconds}
                for e in self.entries
            ],
        }

    def seconds(self, kind: str, flops: int, bytes_: int, roofline: Roofline) -> float | None:
        """Estimated seconds of an op from the table, or None when it has no entry of `kind`.

        An exact (kind, flops, bytes) entry wins. Otherwise the entries of `kind` are ordered
        by size (flops; bytes when some entry of the kind has no FLOPs, as for copies) and
        the time is interpolated log-log between the neighbours of the op's size; entries of
        equal size use the one with the nearest other count. Beyond the smallest or largest
        entry, the end's time is scaled by `roofline(op) / roofline(end)`.
        """
        hit = self._exact.get((kind, flops, bytes_))
        if hit is not None:
            return hit
        entries = self._by_kind.get(kind)
        if not entries:
            return None
        on_flops = all(e.flops > 0 for e in entries)

        def size(e: CalibrationEntry) -> int:
            return e.flops if on_flops else e.bytes

        def other(e: CalibrationEntry) -> int:
            return e.bytes if on_flops else e.flops

        q, q_other = (flops, bytes_) if on_flops else (bytes_, flops)
        by_size: dict[int, list[CalibrationEntry]] = {}
        for e in entries:
            if size(e) > 0:  # on bytes, an entry with FLOPs but no bytes has no place
                by_size.setdefault(size(e), []).append(e)
        sizes = sorted(by_size)

        def point(x: int) -> CalibrationEntry:
            return min(by_size[x], key=lambda e: abs(_log1(other(e)) - _log1(q_other)))

        i = bisect.bisect_left(sizes, q)
        if i < len(sizes) and sizes[i] == q:
            return point(q).seconds
        if i == 0 or i == len(sizes):  # beyond an end
            end = point(sizes[0] if i == 0 else sizes[-1])
            return end.seconds * roofline(flops, bytes_) / roofline(end.flops, end.bytes)
        lo, hi = point(sizes[i - 1]), point(sizes[i])
        frac = math.log(q / size(lo)) / math.log(size(hi) / size(lo))
        return lo.seconds * math.exp(frac * math.log(hi.seconds / lo.seconds))


def _log1(n: int) -> float:
    return math.log(n + 1)


def _parse_entry(item: Any, i: int, source: str) -> CalibrationEntry:
    where = f"{source}: entry {i}"
    if not isinstance(item, dict):
        raise ClusterError(f"{where} must be an object with kind, flops, bytes, seconds", entry=i)
    for key in ("kind", "flops", "bytes", "seconds"):
        if key not in item:
            raise ClusterError(f"{where} has no field {key!r}", entry=i, field=key)
    kind = item["kind"]
    if not isinstance(kind, str):
        raise ClusterError(f"{where}: field 'kind' must be a string", entry=i, field="kind")
    try:
        get_op(kind)
    except ShardlabError:
        raise ClusterError(
            f"{where}: field 'kind' is {kind!r}, which is not an op kind of the catalog",
            entry=i,
            field="kind",
        ) from None
    counts = [_count(item[key], where, i, key) for key in ("flops", "bytes")]
    if counts == [0, 0]:
        raise ClusterError(
            f"{where}: one of 'flops' and 'bytes' must be > 0", entry=i, field="flops"
        )
    seconds = item["seconds"]
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, int | float)
        or not math.isfinite(seconds)
        or seconds <= 0
    ):
        raise ClusterError(
            f"{where}: field 'seconds' must be a positive number, got {seconds!r}",
            entry=i,
            field="seconds",
        )
    return CalibrationEntry(kind, counts[0], counts[1], float(seconds))


def _count(val: Any, where: str, i: int, key: str) -> int:
    ok = isinstance(val, int) or (isinstance(val, float) and val.is_integer())
    if isinstance(val, bool) or not ok or val < 0:
        raise ClusterError(
            f"{where}: field {key!r} must be a whole number >= 0, got {val!r}", entry=i, field=key
        )
    return int(val)
