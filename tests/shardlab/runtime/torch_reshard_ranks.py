"""A rank job for `test_torch_uneven`: run reshard plans through the torch backend's
collectives (`runtime.torch_comm.start_step`) on gloo ranks, one process per mesh rank.

`reshard_job(proc, common, mine)`: `common["mesh"]` is the mesh, `common["cases"]` a list of
(shape, src placements, steps); `mine` is this rank's block under each case's source. The
job runs every case's steps in order, passing each step the group's block sizes as
`runtime.torch_rank` does (`placement.group_sizes`), and returns this rank's final blocks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def reshard_job(proc: int, common: dict[str, Any], mine: Sequence[Any]) -> list[Any]:
    import torch

    from shardlab.placement import Shard, group_sizes
    from shardlab.runtime.torch_comm import make_groups, start_step

    mesh = common["mesh"]
    groups = make_groups([mesh], {r: r for r in mesh.ranks}, proc)
    out = []
    for (shape, src, steps), block in zip(common["cases"], mine, strict=True):
        state = list(src)
        x = torch.from_numpy(np.array(block, copy=True))
        for step in steps:
            k = mesh.axis_index(step.axis)
            sizes = None
            if isinstance(step.src, Shard):
                sizes = [group_sizes(shape, mesh, tuple(state), k, proc)]
            handle, finish = start_step([x], step, groups[(step.axis,)], sizes)
            if handle is not None:
                handle.wait()
            (x,) = finish()
            state[k] = step.dst
        out.append(x.numpy().copy())
    return out
