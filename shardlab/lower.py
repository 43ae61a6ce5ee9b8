"""Lowering: a completed graph -> the `DistProgram` every rank runs, built in one pass.

Seed 000: reshards are inserted while the new op list is built, never by re-scanning the
program after each insertion, so lowering is linear in the number of ops. A value needed
in the same spec by several consumers is resharded once (the resharded version is reused).
Outputs that completion placed differently from what their rule produces (annotations,
in-place state) are resharded right after the op.

Every serial value has one `_Held` record: where it lives now and every version made of
it so far. One lookup per input finds the program value to read and the op it depends on;
this keeps the per-op work (and the memory it touches) small and constant.
"""

from __future__ import annotations

from shardlab.ir import OpRole, TensorType
from shardlab.placement import DistSpec
from shardlab.program import DistOp, DistProgram
from shardlab.reshard import CommStep, plan_transition
from shardlab.spmd.complete import CompletedGraph

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
        for i, step in enumerate(steps):
            last = i == len(steps) - 1
            out = f"{serial}@{dst}" if last else f"{serial}@{dst}.{i}"
            spec = dst if last else _after(self.specs[current], step)
            reason = (
                f"{serial}: {have} -> {dst}; {why}; {step.reason}, "
                f"{step.bytes_per_rank:,.0f} bytes per rank"
            )
            name = f"{step.kind}:{out}"
            attrs = {"value": serial, "from": str(have), "to": str(dst), "consumer": consumer}
            self.ops.append(
                DistOp(name, step.kind, (current,), (out,), f"comm:{step.axis}", OpRole.COMM,
                       scope=scope, attrs=attrs, comm=step, reason=reason,
                       deps=(producer,) if producer else ())
            )  # fmt: skip
            self.types[out] = t
            self.specs[out] = spec
            current, producer = out, name
        version = held.versions[dst] = (current, producer)
        return version


def _after(spec: DistSpec, step: CommStep) -> DistSpec:
    """The spec after one per-axis step."""
    placements = list(spec.placements)
    placements[spec.mesh.axis_index(step.axis)] = step.dst
    return DistSpec(spec.mesh, tuple(placements))


def lower(done: CompletedGraph) -> DistProgram:
    """The DistProgram of a completed graph (one pass over its ops)."""
    b = _Builder(done)
    graph, held, specs = done.graph, b.held, b.specs
    for value in graph.values.values():
        if graph.producer(value.name) is None:
            spec = specs[value.name] = done.specs[value.name]
            held[value.name] = _Held(spec, (value.name, ""))
    for op in graph.ops:
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
                final = b.reshard(v, record, (name, op.name), done.specs[v], why, "placement",
                                  op.scope)  # fmt: skip
                record.current = final[0]
    values = {v: record.current for v, record in held.items()}
    return DistProgram(b.mesh, b.ops, b.types, b.specs, values)
