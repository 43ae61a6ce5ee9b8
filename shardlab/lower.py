"""Lowering: a completed graph -> the `DistProgram` every rank runs, built in one pass.

Seed 000: reshards are inserted while the new op list is built, never by re-scanning the
program after each insertion, so lowering is linear in the number of ops. A value needed
in the same spec by several consumers is resharded once (the resharded version is reused).
Outputs that completion placed differently from what their rule produces (annotations,
in-place state) are resharded right after the op.

Every serial value has one `_Held` record: where it lives now and every version made of
it so far. One lookup per input finds the program value to read and the op it depends on;
this keeps the per-op work (and the memory it touches) small and constant.

Versions that communication made during the forward are not reused by the backward (local
slices are: they cost nothing and are smaller than what they were cut from): the backward
reshards again from the value as stored (Megatron's sequence parallelism gathers
the norm output again for the weight gradient; FSDP gathers parameters again). A gathered
copy kept from the forward to the backward would hold memory the recipes free. A version
made again in the backward is named `<value>@<spec>.bw`.

The gradient of a parameter FSDP shards is reduced over the tensor-parallel axes first,
then over FSDP's (`spmd.fsdp_grads.fsdp_stage`: FSDP2's order).

Parameters gathered before use (FSDP, ZeRO-3) are prefetched one layer ahead, as FSDP does:
the gathers a layer's ops need move up to right after the first op of the layer before
(in the same phase) and wait for it, so at most two layers' gathered parameters are live
and the gathers overlap the previous layer's compute instead of all running at the start.
"""

from __future__ import annotations

from dataclasses import replace

from shardlab.ir import OpRole, TensorType
from shardlab.placement import DistSpec
from shardlab.program import DistOp, DistProgram
from shardlab.reshard import COLLECTIVES, CommStep, plan_transition
from shardlab.scopes import layer_scope
from shardlab.spmd.complete import CompletedGraph
from shardlab.spmd.fsdp_grads import fsdp_stage, tensor_axes

#: A program value and the program op that writes it ("" for graph inputs).
_Version = tuple[str, str]


class _Held:
    """Where one serial value lives in the program built so far."""

    __slots__ = ("current", "versions")

    def __init__(self, spec: DistSpec, version: _Version) -> None:
        #: the program value holding it in its completed spec (once its producer is lowered)
        self.current = version[0]
        #: every spec it has been made available in, and the program value holding it so
        self.versions: dict[DistSpec, _Version] = {spec: version}


class _Builder:
    """Accumulates program ops, value types and specs."""

    def __init__(self, done: CompletedGraph) -> None:
        self.mesh = done.strategy.mesh
        self.ops: list[DistOp] = []
        self.types: dict[str, TensorType] = {n: v.type for n, v in done.graph.values.items()}
        self.specs: dict[str, DistSpec] = {}
        self.held: dict[str, _Held] = {}
        #: versions made by local steps only (slices): kept across the forward/backward
        self.local: set[str] = set()

    def reshard(
        self, serial: str, held: _Held, src: _Version, dst: DistSpec, why: str,
        consumer: str, scope: str,
    ) -> _Version:  # fmt: skip
        """`serial` in `dst`, inserting comm ops after `src` (a version of it) once.

        `consumer` names who asked: an op kind, or "placement" when completion placed an
        output differently from what its rule produced; `scope` is the asking op's scope
        (comm time is attributed to it).
        """
        cached = held.versions.get(dst)
        if cached is not None:
            return cached
        have = self.specs[src[0]]
        t = self.types[serial]
        steps = plan_transition(t.shape, t.dtype, self.mesh, have, dst)
        current, producer = src
        base = f"{serial}@{dst}" + ("" if f"{serial}@{dst}" not in self.types else ".bw")
        for i, step in enumerate(steps):
            last = i == len(steps) - 1
            out = base if last else f"{base}.{i}"
            spec = dst if last else _after(self.specs[current], step)
            reason = (
                f"{serial}: {have} -> {dst}; {why}; {step.reason}, "
                f"{step.bytes_per_rank:,.0f} bytes per rank"
            )
            name = f"{step.kind}:{out}"
            attrs = {"value": serial, "from": str(have), "to": str(dst), "consumer": consumer}
            self.ops.append(
                DistOp(name, step.kind, (current,), (out,), _stream(step), OpRole.COMM,
                       scope=scope, attrs=attrs, comm=step, reason=reason,
                       deps=(producer,) if producer else ())
            )  # fmt: skip
            self.types[out] = t
            self.specs[out] = spec
            current, producer = out, name
        if all(step.kind not in COLLECTIVES for step in steps):
            self.local.add(current)
        version = held.versions[dst] = (current, producer)
        return version


def _stream(step: CommStep) -> str:
    """A collective runs on its mesh axis' comm stream; a local step (a slice, zero-padding
    to a partial value) moves no data between ranks and runs on the compute stream."""
    return "compute" if step.kind.startswith("local_") else f"comm:{step.axis}"


def _after(spec: DistSpec, step: CommStep) -> DistSpec:
    """The spec after one per-axis step."""
    placements = list(spec.placements)
    placements[spec.mesh.axis_index(step.axis)] = step.dst
    return DistSpec(spec.mesh, tuple(placements))


def _forget_forward_copies(record: _Held, specs: dict[str, DistSpec], local: set[str]) -> None:
    """Keep the version a value lives in now and those cut from it locally (a slice is
    smaller and free to keep); readers reshard it again from there."""
    record.versions = {
        spec: version
        for spec, version in record.versions.items()
        if version[0] == record.current or version[0] in local
    }


def lower(done: CompletedGraph) -> DistProgram:
    """The DistProgram of a completed graph (one pass over its ops)."""
    b = _Builder(done)
    graph, held, specs = done.graph, b.held, b.specs
    for name in graph.sources:
        spec = specs[name] = done.specs[name]
        held[name] = _Held(spec, (name, ""))
    in_forward = True
    tensor = tensor_axes(graph, done.constraints)
    for op in graph.ops:
        if in_forward and op.role == OpRole.BACKWARD:
            in_forward = False
            for record in held.values():
                _forget_forward_copies(record, specs, b.local)
        rule = done.rules[op.name]
        inputs: list[str] = []
        deps: set[str] = set()
        for v, need in zip(op.inputs, rule.input_specs, strict=True):
            record = held[v]
            version = record.versions.get(need)
            if version is None:
                why = f"op {op.name!r} ({op.kind}) needs it as {need}: {rule.reason}"
                current = record.versions[specs[record.current]]
                version = b.reshard(v, record, current, need, why, op.kind, op.scope)
            inputs.append(version[0])
            if version[1]:
                deps.add(version[1])
        outputs: list[str] = []
        for v, produced in zip(op.outputs, rule.output_specs, strict=True):
            name = v if done.specs[v] == produced else f"{v}~{produced}"
            if name != v:
                b.types[name] = b.types[v]
            specs[name] = produced
            held[v] = _Held(produced, (name, op.name))
            outputs.append(name)
        b.ops.append(
            DistOp(op.name, op.kind, tuple(inputs), tuple(outputs), "compute", op.role,
                   scope=op.scope, attrs=dict(op.attrs), kernel=rule.kernel,
                   reason=rule.reason, deps=tuple(sorted(deps)))
        )  # fmt: skip
        for v, name in zip(op.outputs, outputs, strict=True):
            if name != v:
                why = f"completion places {v!r} as {done.specs[v]} (annotation or in-place state)"
                record = held[v]
                version = (name, op.name)
                stage = fsdp_stage(graph, done.constraints, tensor, v, specs[name], done.specs[v])
                if stage is not None:
                    first = f"{why}; FSDP2 reduces a gradient's tensor axes before its own"
                    version = b.reshard(v, record, version, stage, first, "placement", op.scope)
                final = b.reshard(v, record, version, done.specs[v], why, "placement", op.scope)
                record.current = final[0]
    values = {v: record.current for v, record in held.items()}
    return DistProgram(b.mesh, _prefetch_source_gathers(b.ops), b.types, b.specs, values)


def _prefetch_source_gathers(ops: list[DistOp]) -> list[DistOp]:
    """Move the comm ops that reshard a source value (a parameter gathered before use) up
    to right after the first compute op of the previous layer of the same phase, with a
    dependency on it: one layer of prefetch (module docstring)."""
    made = {v for op in ops for v in op.outputs}
    first: dict[tuple[bool, str], int] = {}  # (backward?, layer) -> its first compute op
    order: list[tuple[bool, str]] = []
    position: dict[tuple[bool, str], int] = {}  # group -> its index in `order`
    moved: dict[int, list[DistOp]] = {}  # anchor op index -> gathers placed right after it
    taken: set[int] = set()
    for i, op in enumerate(ops):
        if op.is_comm:
            continue
        group = (op.role not in (OpRole.FORWARD, OpRole.LOSS), layer_scope(op.scope))
        if group not in first:
            first[group] = i
            position[group] = len(order)
            order.append(group)
        k = position[group]
        if k == 0 or order[k - 1][0] != group[0]:
            continue
        anchor = first[order[k - 1]]
        for j in _source_chains_before(ops, i, made, taken):
            gather = ops[j]
            deps = tuple(sorted({*gather.deps, ops[anchor].name}))
            moved.setdefault(anchor, []).append(replace(gather, deps=deps))
            taken.add(j)
    out: list[DistOp] = []
    for i, op in enumerate(ops):
        if i not in taken:
            out.append(op)
        out += moved.get(i, [])
    return out


def _source_chains_before(ops: list[DistOp], i: int, made: set[str], taken: set[int]) -> list[int]:
    """Indices, in order, of the comm ops right before op i that turn a source value (one
    no op makes) into an input of op i, possibly in several steps."""
    wanted = set(ops[i].inputs)
    chain: list[int] = []
    j = i - 1
    while j >= 0 and ops[j].is_comm and j not in taken:
        if set(ops[j].outputs) & wanted:
            wanted |= set(ops[j].inputs)
            chain.append(j)
        j -= 1
    picked: list[int] = []
    inside: set[str] = set()
    for k in sorted(chain):
        if all(v not in made or v in inside for v in ops[k].inputs):
            picked.append(k)
            inside.update(ops[k].outputs)
    return picked
