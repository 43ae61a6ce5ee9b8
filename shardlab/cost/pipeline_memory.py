"""Memory per pipeline stage as the schedule holds it: the model states of the stage's
layers (a tied weight's replica on each of its stages), the activations one micro-batch
keeps for the backward per chunk times the micro-batches in flight at the worst moment of
the schedule (p - s for stage s of 1F1B: the first stage holds p, Korthikanti et al. 2022),
plus the temporaries of one unit.

What it is for: `cost.pipeline_slots` reports each stage's `StageMemory` next to its time.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from shardlab.cost.clusters import Cluster
from shardlab.cost.memory import CATEGORIES, MODEL_STATE, memory_profile
from shardlab.ir import Graph
from shardlab.passes.pipeline_split import Split
from shardlab.program import DistProgram
from shardlab.reuse import Reuse


@dataclass(frozen=True, slots=True)
class StageMemory:
    """What one rank of a pipeline stage holds at the worst moment of the schedule."""

    model_state: dict[str, int]  # parameters, gradients, optimizer_state of its layers
    activations_per_microbatch: tuple[int, ...]  # kept for the backward, per local chunk
    in_flight: tuple[int, ...]  # micro-batches held per local chunk at the peak
    activations: int  # sum of kept x in flight at the peak
    temporaries: int  # the largest unit's own temporaries and comm buffers
    peak_bytes: int
    capacity_bytes: int

    @property
    def fits(self) -> bool:
        return self.peak_bytes <= self.capacity_bytes

    def to_json(self) -> dict[str, Any]:
        return {
            "peak_bytes": self.peak_bytes,
            "capacity_bytes": self.capacity_bytes,
            "fits": self.fits,
            "model_state_bytes": dict(self.model_state),
            "activations_bytes": self.activations,
            "activations_per_microbatch": list(self.activations_per_microbatch),
            "in_flight": list(self.in_flight),
            "temporaries_bytes": self.temporaries,
        }


#: What one stage's program holds (`_held`), kept per worker process by the stage's shape
#: (its units' and tail's keys, `cost.pipeline_units.unit_time`) and training graph: the middle
#: stages of a model of repeated layers, and the sibling recipes' stages, hold alike.
HELD = Reuse[tuple[dict[str, int], tuple[int, ...], int]]("pipeline stage memory", 256)


def stage_memory(
    program: DistProgram,
    training: Graph,
    split: Split,
    s: int,
    order: Sequence[Any],
    chunks: Sequence[int],
    cluster: Cluster,
    twin: Hashable | None = None,
) -> StageMemory:
    """Stage s's memory over the schedule (module docstring). `twin`: what the stage's
    program is by its shape (None: profiled anew)."""

    def profile() -> tuple[dict[str, int], tuple[int, ...], int]:
        return _held(program, training, split, s, chunks)

    if twin is None:
        state, kept_per_chunk, temporaries = profile()
    else:
        key = (twin, id(training), program.mesh.shape)
        state, kept_per_chunk, temporaries = HELD.get(key, profile)
    pp = split.assignment.pp
    kept = dict(zip(chunks, kept_per_chunk, strict=True))
    count = dict.fromkeys(chunks, 0)
    worst, at_worst = 0, dict(count)
    for unit in order:
        g = unit.chunk * pp + s
        count[g] += 1 if unit.phase == "F" else -1
        held = sum(count[c] * kept[c] for c in chunks)
        if held > worst:
            worst, at_worst = held, dict(count)
    return StageMemory(
        model_state=dict(state),
        activations_per_microbatch=tuple(kept[c] for c in chunks),
        in_flight=tuple(at_worst[c] for c in chunks),
        activations=worst,
        temporaries=temporaries,
        peak_bytes=sum(state.values()) + worst + temporaries,
        capacity_bytes=int(cluster.hbm_bytes),
    )


def _held(
    program: DistProgram, training: Graph, split: Split, s: int, chunks: Sequence[int]
) -> tuple[dict[str, int], tuple[int, ...], int]:
    """Stage s's model state, the activations one micro-batch keeps per local chunk, and its
    largest unit's temporaries, from the memory profile of the ops it runs."""
    ops = [program.ops[i] for i in split.on_stage.get(s, [])]
    made = {x for op in ops for x in op.outputs}
    values = {k: x for k, x in program.values.items() if x in made}
    stage_program = DistProgram(program.mesh, ops, program.types, program.specs, values)
    profile = memory_profile(stage_program, training)
    kept = dict.fromkeys(chunks, 0)
    for buf in profile.kept_for_backward:
        chunk = split.assignment.chunk_of_scope(buf.scope)
        kept[chunk if chunk in kept else chunks[0]] += buf.bytes
    state = {k: profile.model_state[k] for k in MODEL_STATE}
    breakdown = profile.breakdown_at_peak
    temporaries = sum(breakdown[c] for c in CATEGORIES if c in ("temporaries", "comm_buffers"))
    temporaries += breakdown["inputs"]
    return state, tuple(kept[c] for c in chunks), temporaries
