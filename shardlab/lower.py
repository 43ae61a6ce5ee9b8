"""Lowering: a completed graph -> the `DistProgram` every rank runs, built in one pass.

Seed 000: reshards are inserted while the new op list is built, never by re-scanning the
program after each insertion, so lowering is linear in the number of ops. A value needed
in the same spec by several consumers is resharded once (the resharded version is reused).
Outputs that completion placed differently from what their rule produces (annotations,
in-place state) are resharded right after the op.
"""

from __future__ import annotations

from shardlab.ir import OpRole
from shardlab.placement import DistSpec
from shardlab.program import DistOp, DistProgram
from shardlab.reshard import CommStep, plan_transition
from shardlab.spmd.complete import CompletedGraph


class _Builder:
    """Accumulates program ops and tracks where each version of a value lives."""

    def __init__(self, done: CompletedGraph) -> None:
        self.done = done
        self.graph = done.graph
        self.mesh = done.strategy.mesh
        self.ops: list[DistOp] = []
        self.types = {name: v.type for name, v in self.graph.values.items()}
        self.specs: dict[str, DistSpec] = {}
        #: (serial value, spec) -> program value holding it in that spec
        self.versions: dict[tuple[str, DistSpec], str] = {}
        self.producer: dict[str, str] = {}

    def deps(self, inputs: tuple[str, ...]) -> tuple[str, ...]:
        """The ops producing `inputs` (program values defined so far)."""
        return tuple(sorted({self.producer[v] for v in inputs if v in self.producer}))

    def add(self, op: DistOp) -> None:
        self.ops.append(op)
        for out in op.outputs:
            self.producer[out] = op.name

    def define(self, serial: str, program_value: str, spec: DistSpec) -> None:
        self.types[program_value] = self.graph.type_of(serial)
        self.specs[program_value] = spec
        self.versions[(serial, spec)] = program_value

    def reshard(
        self, serial: str, src: str, dst: DistSpec, why: str, consumer: str, scope: str
    ) -> str:
        """The program value holding `serial` in `dst`, inserting comm ops once.

        `consumer` names who asked: an op kind, or "placement" when completion placed an
        output differently from what its rule produced; `scope` is the asking op's scope
        (comm time is attributed to it).
        """
        cached = self.versions.get((serial, dst))
        if cached is not None:
            return cached
        have = self.specs[src]
        t = self.graph.type_of(serial)
        steps = plan_transition(t.shape, t.dtype, self.mesh, have, dst)
        current = src
        for i, step in enumerate(steps):
            last = i == len(steps) - 1
            out = f"{serial}@{dst}" if last else f"{serial}@{dst}.{i}"
            spec = dst if last else _after(self.specs[current], step)
            reason = (
                f"{serial}: {have} -> {dst}; {why}; {step.reason}, "
                f"{step.bytes_per_rank:,.0f} bytes per rank"
            )
            name = f"{step.kind}:{out}"
            stream = f"comm:{step.axis}"
            attrs = {"value": serial, "from": str(have), "to": str(dst), "consumer": consumer}
            self.add(
                DistOp(name, step.kind, (current,), (out,), stream, OpRole.COMM, scope=scope,
                       attrs=attrs, comm=step, reason=reason, deps=self.deps((current,)))
            )  # fmt: skip
            self.types[out] = t
            self.specs[out] = spec
            current = out
        self.versions[(serial, dst)] = current
        return current


def _after(spec: DistSpec, step: CommStep) -> DistSpec:
    """The spec after one per-axis step."""
    placements = list(spec.placements)
    placements[spec.mesh.axis_index(step.axis)] = step.dst
    return DistSpec(spec.mesh, tuple(placements))


def lower(done: CompletedGraph) -> DistProgram:
    """The DistProgram of a completed graph (one pass over its ops)."""
    b = _Builder(done)
    graph = done.graph
    current: dict[str, str] = {}
    for value in graph.values.values():
        if graph.producer(value.name) is None:
            b.define(value.name, value.name, done.specs[value.name])
            current[value.name] = value.name
    for op in graph.ops:
        rule = done.rules[op.name]
        inputs = []
        for v, need in zip(op.inputs, rule.input_specs, strict=True):
            held = b.versions.get((v, need))
            if held is None:
                why = f"op {op.name!r} ({op.kind}) needs it as {need}: {rule.reason}"
                held = b.reshard(v, current[v], need, why, op.kind, op.scope)
            inputs.append(held)
        outputs = []
        for v, produced in zip(op.outputs, rule.output_specs, strict=True):
            name = v if done.specs[v] == produced else f"{v}~{produced}"
            b.define(v, name, produced)
            outputs.append(name)
        ins = tuple(inputs)
        b.add(
            DistOp(op.name, op.kind, ins, tuple(outputs), "compute", op.role, scope=op.scope,
                   attrs=dict(op.attrs), kernel=rule.kernel, reason=rule.reason,
                   deps=b.deps(ins))
        )  # fmt: skip
        for v, name in zip(op.outputs, outputs, strict=True):
            if name != v:
                why = f"completion places {v!r} as {done.specs[v]} (annotation or in-place state)"
                final = b.reshard(v, name, done.specs[v], why, "placement", op.scope)
                b.versions[(v, done.specs[v])] = final
                current[v] = final
            else:
                current[v] = v
    return DistProgram(b.mesh, b.ops, b.types, b.specs, current)
