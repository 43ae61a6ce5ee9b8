"""The simulated mesh: run a DistProgram for every rank inside one process (numpy).

Each rank holds its local blocks; compute ops run their rule's local kernel on every rank
in lockstep (`runtime.sharded`), comm ops run their collective over the rank groups of their
mesh axis (`runtime.reshard_exec`). Ops run in program order (synchronous semantics).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from shardlab.ops.base import Array
from shardlab.program import DistProgram
from shardlab.runtime.distribute import assemble, distribute
from shardlab.runtime.reshard_exec import apply_step
from shardlab.runtime.sharded import run_sharded_op
from shardlab.spmd.result import RuleResult

Blocks = dict[str, dict[int, Array]]


def run_simulated(program: DistProgram, sources: Mapping[str, Array], seed: int = 0) -> Blocks:
    """Every program value's block on every rank, from the global values of the sources."""
    rng = np.random.default_rng(seed)
    blocks: Blocks = {}
    for name, data in sources.items():
        blocks[name] = distribute(np.asarray(data), program.specs[name], rng)
    for op in program.ops:
        if op.comm is not None:
            (src,) = op.inputs
            (dst,) = op.outputs
            blocks[dst] = apply_step(blocks[src], program.mesh, op.comm)
            continue
        rule = RuleResult(
            tuple(program.specs[v] for v in op.inputs),
            tuple(program.specs[v] for v in op.outputs),
            op.reason,
            kernel=op.kernel,
        )
        local = {r: [blocks[v][r] for v in op.inputs] for r in program.mesh.ranks}
        outs = run_sharded_op(
            op.kind,
            op.attrs,
            rule,
            [program.types[v] for v in op.inputs],
            [program.types[v] for v in op.outputs],
            local,
        )
        for j, v in enumerate(op.outputs):
            blocks[v] = {r: np.asarray(outs[r][j]) for r in program.mesh.ranks}
    return blocks


def global_view(program: DistProgram, blocks: Blocks, value: str) -> Array:
    """The global value of program value `value`, reassembled from every rank's block."""
    return assemble(blocks[value], program.specs[value], program.types[value].shape)
