"""Run one op on every rank of a mesh in lockstep (numpy), as its rule prescribes.

Used by the rule tests and by the simulated mesh: each rank runs the rule's local kernel on
its blocks; collectives a kernel requests mid-op are reduced over the requested mesh axes.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Mapping, Sequence
from typing import Any

import numpy as np

from shardlab.errors import ExecutionError
from shardlab.ir import TensorType
from shardlab.mesh import Mesh
from shardlab.ops.base import Array
from shardlab.runtime.kernels import KERNELS, CollectiveRequest, LocalContext
from shardlab.spmd.result import RuleResult

_REDUCE: dict[str, Callable[..., Any]] = {"sum": np.sum, "max": np.max}


def axes_group(mesh: Mesh, rank: int, axes: Sequence[str]) -> tuple[int, ...]:
    """The ranks that differ from `rank` only along `axes`."""
    coord = mesh.coord(rank)
    ks = [mesh.axis_index(a) for a in axes]
    return tuple(
        r
        for r in mesh.ranks
        if all(c == coord[k] for k, c in enumerate(mesh.coord(r)) if k not in ks)
    )


def run_sharded_op(
    kind: str,
    attrs: Mapping[str, Any],
    rule: RuleResult,
    input_types: Sequence[TensorType],
    output_types: Sequence[TensorType],
    local_inputs: Mapping[int, Sequence[Array]],
) -> dict[int, list[Array]]:
    """Every rank's local outputs of one op whose inputs are in `rule.input_specs`."""
    mesh = rule.input_specs[0].mesh if rule.input_specs else rule.output_specs[0].mesh
    kernel = KERNELS[rule.kernel]
    running: dict[int, Generator[CollectiveRequest, Array, list[Array]]] = {}
    results: dict[int, list[Array]] = {}
    for rank in mesh.ranks:
        ctx = LocalContext(
            mesh, rank, tuple(input_types), tuple(output_types), rule.input_specs, rule.output_specs
        )
        out = kernel(kind, list(local_inputs[rank]), dict(attrs), ctx)
        if isinstance(out, list):
            results[rank] = out
        else:
            running[rank] = out
    replies: dict[int, Array | None] = {r: None for r in running}
    while running:
        requests: dict[int, CollectiveRequest] = {}
        finished = []
        for rank, gen in list(running.items()):
            try:
                reply = replies[rank]
                requests[rank] = next(gen) if reply is None else gen.send(reply)
            except StopIteration as stop:
                results[rank] = stop.value
                finished.append(rank)
                del running[rank]
        if requests and finished:
            raise ExecutionError(
                f"{kind}: ranks {sorted(finished)} finished while ranks {sorted(requests)} "
                "wait on a collective"
            )
        for rank, req in requests.items():
            group = axes_group(mesh, rank, req.axes)
            stacked = np.stack([requests[g].data for g in group])
            replies[rank] = np.asarray(_REDUCE[req.op](stacked, axis=0))
    return results
