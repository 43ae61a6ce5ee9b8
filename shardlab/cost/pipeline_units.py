"""A pipeline unit's time (a stage's forward or backward of one chunk and micro-batch, or
its tail), simulated once per distinct unit.

`unit_time` runs a unit's ops on the stage's ranks alone with the timeline engine
(`fragment_timeline`: dependencies on ops outside it are met when it starts). Units whose
ops match one already simulated, op for op (the same kinds, shapes, placements,
collectives and dependencies; only the layer numbers in their names differ, as in the
middle stages of a model of repeated layers), on ranks of the same roles in a mesh of the
same shape, on the same cluster and table, take its time and events, renamed
(`_shape_key`, `UNITS`): each distinct unit is simulated once per worker process,
whichever plan, schedule or sibling recipe meets it first.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import replace

from shardlab.cost.clusters import Cluster
from shardlab.cost.comm import step_time
from shardlab.cost.compute import CalibrationTable, program_op_times
from shardlab.cost.model import role_of_ranks, roles_of
from shardlab.cost.timeline import Event, Timeline, simulate
from shardlab.mesh import Mesh
from shardlab.program import DistOp, DistProgram
from shardlab.reuse import Hashed, Reuse, hashed

#: Simulated units kept per worker process, by their content (`unit_time`): the stages of a
#: plan, its schedules and its sibling recipes (dp, ZeRO-1, ZeRO-2 run the same units) meet
#: the same units again and again.
#: An entry keeps the unit's op names and scopes, not its ops (they would keep each
#: plan's programs alive).
UNITS = Reuse[tuple[float, tuple[Event, ...], tuple[tuple[str, str], ...]]]("pipeline units", 2048)


def unit_time(
    program: DistProgram,
    indices: Sequence[int],
    mesh: Mesh,
    cluster: Cluster,
    table: CalibrationTable | None,
) -> tuple[float, tuple[Event, ...], Hashable | None]:
    """The seconds and events of the unit made of the ops `indices` of `program` on
    `mesh`'s ranks, and its key (None: not hashable, not reused). A unit whose ops match
    one already simulated, op for op (module docstring), takes its time and events,
    renamed."""
    ops = [program.ops[i] for i in indices]
    key = _shape_key(program, ops, mesh, cluster)
    if key is None:
        timeline = fragment_timeline(program, indices, mesh, cluster, table)
        return timeline.step_time, tuple(timeline.events[min(timeline.events)]), None

    names = tuple((op.name, op.scope) for op in ops)

    def simulate_unit() -> tuple[float, tuple[Event, ...], tuple[tuple[str, str], ...]]:
        timeline = fragment_timeline(program, indices, mesh, cluster, table)
        return timeline.step_time, tuple(timeline.events[min(timeline.events)]), names

    seconds, events, twin = UNITS.get((key, mesh.axis_names, mesh.shape, cluster, table),
                                      simulate_unit)  # fmt: skip
    if twin == names:
        return seconds, events, key
    name = {a[0]: b for a, b in zip(twin, ops, strict=True)}
    return (
        seconds,
        tuple(replace(e, name=name[e.name].name, scope=name[e.name].scope) for e in events),
        key,
    )


#: Op attributes that name things or seed them without changing what an op costs: the value
#: a collective moves (`value`: its layer's number differs from stage to stage) and a
#: dropout's seed.
NAMING_ATTRS = frozenset({"value", "seed"})


def _shape_key(
    program: DistProgram, ops: list[DistOp], mesh: Mesh, cluster: Cluster
) -> Hashed | None:
    """What a unit's time depends on, without the ops' names (None: not hashable), its
    hash taken once (a unit's key has a part per op, and the stage memory's key holds it
    again)."""
    position = {op.name: i for i, op in enumerate(ops)}
    types, specs = program.types, program.specs
    parts = []
    for op in ops:
        attrs = op.attrs
        kept = [a for a in attrs.items() if a[0] not in NAMING_ATTRS] if attrs else []
        named = repr(sorted(kept)) if kept else ""
        parts.append((
            op.kind, op.stream, op.kernel, op.comm, named,
            tuple([(types[v], specs[v].placements) for v in op.inputs + op.outputs]),
            tuple([position.get(d, -1) for d in op.deps]) if op.deps else (),
        ))  # fmt: skip
    return hashed((roles_of(mesh, cluster.devices_per_node), tuple(parts)))


def fragment_timeline(
    program: DistProgram,
    indices: Sequence[int],
    mesh: Mesh,
    cluster: Cluster,
    table: CalibrationTable | None,
) -> Timeline:
    """The ops `indices` of `program` run on `mesh`'s ranks on their own (dependencies on
    ops outside them are met when they start)."""
    if not indices:
        first = mesh.ranks[0]
        return Timeline(0.0, {first: []}, dict.fromkeys(mesh.ranks, first), 0.0)
    ops = [program.ops[i] for i in indices]
    names = {op.name for op in ops}
    ops = [op if all(d in names for d in op.deps) else
           replace(op, deps=tuple(d for d in op.deps if d in names)) for op in ops]  # fmt: skip
    fragment = DistProgram(mesh, ops, program.types, program.specs, {})
    compute = program_op_times(fragment, cluster, table)

    def durations(op: DistOp, rank: int) -> float:
        if op.comm is None:
            return compute[op.name]
        return step_time(op.comm, mesh.group_of(rank, op.comm.axis), cluster)

    roles = role_of_ranks(fragment, cluster)
    return simulate(
        fragment, durations, overlap_slowdown=cluster.overlap_slowdown, role_of=roles.__getitem__
    )
