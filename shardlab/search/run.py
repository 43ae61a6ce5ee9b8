"""`search`: the best strategies for a model on a cluster (see `shardlab.search`).

1. The space: every mesh that can run (`space.meshes`), each pruned one with its reason.
2. Round 1 plans the fastest recipes of every mesh and schedule (`space.base_candidates`).
3. Each later round gives every candidate that does not fit its next leaner recipe
   (`space.leaner`: ZeRO-1, ZeRO-2, FSDP, then selective and full recomputation), until one
   fits on that mesh or none is left.
4. The evaluations are ranked and their Pareto front drawn (`results`).

Candidates are planned in parallel worker processes (`workers`, default one per core).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from shardlab.cost.clusters import Cluster, load_cluster
from shardlab.errors import ShardlabError
from shardlab.ir import Graph
from shardlab.search.evaluate import Evaluation, evaluate
from shardlab.search.results import SearchResult, rank
from shardlab.search.space import (
    Candidate,
    Limits,
    ModelShape,
    base_candidates,
    leaner,
    meshes,
    schedules,
)

Progress = Callable[[float, str], None]


class SearchError(ShardlabError):
    """A search that cannot start: no devices, a model that is not a preset, ..."""

    code = "invalid_search"


def search(
    model: str,
    cluster: Cluster | str,
    *,
    overrides: Mapping[str, Any] | None = None,
    gpus: int | None = None,
    global_batch: int | None = None,
    headroom: float = 0.1,
    max_tp: int | None = None,
    min_dp: int = 1,
    cross_node_tp: bool = False,
    workers: int | None = None,
    progress: Progress | None = None,
) -> SearchResult:
    """Search the strategies of preset `model` (with `overrides`) on `cluster`'s devices
    (or the first `gpus` of them) for a global batch of `global_batch` sequences."""
    from shardlab.models import build_model

    report = progress or (lambda fraction, message: None)
    started = time.perf_counter()
    cluster = load_cluster(cluster) if isinstance(cluster, str) else cluster
    n = cluster.world_size if gpus is None else gpus
    if not isinstance(n, int) or n < 1 or n > cluster.world_size:
        raise SearchError(f"--gpus must be 1 to {cluster.world_size} (the devices of cluster "
                          f"{cluster.name!r}), got {n!r}", gpus=n)  # fmt: skip
    if not 0.0 <= headroom < 1.0:
        raise SearchError(f"memory headroom must be in [0, 1), got {headroom!r}", headroom=headroom)
    settings = dict(overrides or {})
    if global_batch is not None:
        if global_batch < 1:
            raise SearchError(f"--global-batch must be at least 1, got {global_batch}",
                              global_batch=global_batch)  # fmt: skip
        settings["batch"] = global_batch
    graph = build_model(model, settings)
    shape = _shape(graph)
    limits = Limits(n, cluster.devices_per_node, max_tp, min_dp, cross_node_tp)
    space = meshes(shape, limits)
    if not space.meshes:
        raise SearchError(
            f"no mesh of {n} GPUs can run {model}: "
            + "; ".join(f"{p.what}: {p.reason}" for p in space.pruned[:4]),
            gpus=n,
        )
    round_one = [
        c for m in space.meshes for plan in schedules(m, shape) for c in base_candidates(m, plan)
    ]
    evaluations: list[Evaluation] = []
    with _Pool(graph, cluster, headroom, workers) as pool:
        pending = round_one
        steps = 1 + max(len(leaner(c)) for c in round_one)
        for r in range(steps):
            if not pending:
                break
            report(0.05 + 0.9 * r / steps, f"round {r + 1}: planning {len(pending)} candidates")
            done = pool.map(pending)
            evaluations += done
            pending = [
                c
                for e in done
                if e.error is None and not e.fits and (c := _next_leaner(e)) is not None
            ]
    report(1.0, "ranked")
    result = SearchResult(model, cluster.name, n, shape.batch, rank(evaluations), space.pruned)
    result.seconds = time.perf_counter() - started
    return result


def _next_leaner(e: Evaluation) -> Candidate | None:
    """The next leaner recipe than `e`'s, where `e` ran short of memory (a tensor-parallel
    candidate without sequence parallelism has none: its twin with it is leaner already)."""
    c = e.candidate
    if c.mesh.tp > 1 and not c.sequence_parallel:
        return None
    options = leaner(c)
    return options[0] if options else None


def _shape(graph: Graph) -> ModelShape:
    config = graph.meta.get("config")
    if not isinstance(config, Mapping) or "layers" not in config:
        raise SearchError(f"search needs a transformer preset, got graph {graph.name!r}",
                          model=graph.name)  # fmt: skip
    heads = int(config.get("heads", 1))
    return ModelShape(int(config["layers"]), heads, int(config.get("kv_heads") or heads),
                      int(config.get("batch", 1)))  # fmt: skip


_WORKER: dict[str, Any] = {}


def _init(graph: Graph, cluster: Cluster, headroom: float) -> None:
    _WORKER.update(graph=graph, cluster=cluster, headroom=headroom)


def _evaluate(candidate: Candidate) -> Evaluation:
    return evaluate(candidate, _WORKER["graph"], _WORKER["cluster"], _WORKER["headroom"])


class _Pool:
    """Evaluates candidates in worker processes (in this process with one worker)."""

    def __init__(self, graph: Graph, cluster: Cluster, headroom: float, workers: int | None):
        self.args = (graph, cluster, headroom)
        self.workers = workers or os.cpu_count() or 1
        self.executor: ProcessPoolExecutor | None = None

    def __enter__(self) -> _Pool:
        if self.workers > 1:
            self.executor = ProcessPoolExecutor(self.workers, initializer=_init,
                                                initargs=self.args)  # fmt: skip
        else:
            _init(*self.args)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.executor is not None:
            self.executor.shutdown(cancel_futures=True)

    def map(self, candidates: list[Candidate]) -> list[Evaluation]:
        if self.executor is None:
            return [_evaluate(c) for c in candidates]
        return list(self.executor.map(_evaluate, candidates, chunksize=1))
