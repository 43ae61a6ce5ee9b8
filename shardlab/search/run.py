"""`search`: the best strategies for a model on a cluster (see `shardlab.search`).

1. The space: every mesh that can run (`space.meshes`), each pruned one with its reason.
2. Every mesh without a pipeline is planned with each data-parallel recipe, with and without
   sequence parallelism (`space.base_candidates`), except where the parameters with their
   gradients and optimizer state cannot fit alone (`bound.state_bound`).
3. The pipelined candidates (every schedule and micro-batch count) and the leaner recipes
   of what did not fit (`space.leaner`: more recomputation; gradient accumulation over 2,
   4, 8 micro-batches) follow (`walk`): each group's leanest first, then by a lower bound
   on their step (`bound`: the flat plans' work, the schedule's bubble and the busiest
   stage; the step without recomputation). A candidate is skipped, with its reason, where
   a leaner one did not fit or where its bound cannot beat the best so far. A candidate of
   a deep model is screened on two shallow copies of the model first (`screen`), and
   planned in full only where it may fit and win.
4. The two fastest screened candidates that were skipped only because they could not beat
   the winner are planned in full (the runner-up the ranking shows is then the true one);
   meanwhile the fastest fitting tensor-parallel plan without a pipeline is refined op by
   op: an integer program over its layer's placements (`refine`, `layer_ilp`), planned and
   costed like the others.
5. The evaluations are ranked and their Pareto front drawn (`results`).

Candidates are planned in parallel worker processes (`workers`, default one per core), or
on a Ray cluster (`ray_address`, `ray_pool`).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

from shardlab.cost.clusters import Cluster, load_cluster
from shardlab.errors import ShardlabError
from shardlab.ir import Graph
from shardlab.search.bound import state_bound, too_big_reason, wide_params
from shardlab.search.evaluate import Evaluation, evaluate
from shardlab.search.floors import Floors, stage_params
from shardlab.search.refine import Refinement, refine
from shardlab.search.results import SearchResult, rank
from shardlab.search.screen import Screener, least_memory, screening_report
from shardlab.search.space import (
    Candidate,
    Limits,
    ModelShape,
    Pruned,
    Space,
    base_candidates,
    meshes,
    schedules,
)
from shardlab.search.walk import Walk, walk

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
    refine_ops: bool = True,
    ray_address: str | None = None,
) -> SearchResult:
    """Search the strategies of preset `model` (with `overrides`) on `cluster`'s devices
    (or the first `gpus` of them) for a global batch of `global_batch` sequences.
    `refine_ops`: refine the best tensor-parallel plan op by op (`refine`). `ray_address`
    (or the environment's `SHARDLAB_RAY_ADDRESS`): plan the candidates on that Ray cluster
    instead of local worker processes."""
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
    per_node = limits.devices_per_node
    round_one = [
        c
        for m in space.meshes
        for plan in schedules(m, shape)
        for c in base_candidates(m, plan, per_node)
    ]
    usable = cluster.hbm_bytes * (1.0 - headroom)
    params, wide = graph.num_params(), wide_params(graph)
    skipped: list[Pruned] = []
    for c in list(round_one):  # what cannot hold its parameter state is not planned
        least = state_bound(c, params, wide)
        if least > usable:
            round_one.remove(c)
            skipped.append(Pruned(c.label(), too_big_reason(least, usable), least))
    ray_address = ray_address or os.environ.get("SHARDLAB_RAY_ADDRESS") or None
    with _Pool(graph, cluster, headroom, workers, ray_address) as pool:
        floors = Floors(cluster, stage_params(graph))
        # with worker processes, this one refines while they plan the pipelines
        refining = _Refining(graph, cluster, headroom) if refine_ops else None
        early = refining.start if refining is not None and pool.workers > 1 else None
        walked = walk(round_one, shape, pool, pool.workers, report,
                      _references(round_one, space), floors, early)  # fmt: skip
        evaluations = walked.evaluations
        runners_up = _runners_up(walked)
        for c in runners_up:  # planned in the pool while this process refines
            pool.submit(c)
        refinement = refining.finish(walked, report) if refining is not None else None
        confirmed = [pool.next_done() for _ in runners_up]
    evaluations += confirmed
    if refinement is not None:
        evaluations += refinement.planned
    labels = {e.candidate.label() for e in confirmed}
    skipped += [p for p in walked.skipped if p.what not in labels]
    report(1.0, "ranked")
    result = SearchResult(
        model, cluster.name, n, shape.batch, rank(evaluations), space.pruned, skipped
    )
    result.refinement = refinement.refinement if refinement is not None else None
    result.screening = screening_report(walked.screened, evaluations)
    result.seconds = time.perf_counter() - started
    return result


#: How many screened candidates the search plans in full after the walk, so that the
#: runner-up of "why this one" is a full plan.
RUNNERS_UP = 2


def _runners_up(walked: Walk) -> list[Candidate]:
    """The fastest screened candidates that may fit and were not planned in full (each
    skipped because it could not beat the winner), where faster than the second full plan:
    planned in full so that the ranking's runner-up is the true one."""
    full = [e for e in walked.evaluations if e.fits and e.step_time_s is not None]
    second = sorted(e.step_time_s or 0.0 for e in full)[1:2]
    screened = sorted(_screened_fitting(walked.evaluations, walked.screened),
                      key=lambda e: e.step_time_s or 0.0)  # fmt: skip
    return [e.candidate for e in screened[:RUNNERS_UP]
            if not second or (e.step_time_s or 0.0) < second[0]]  # fmt: skip


def _screened_fitting(planned: list[Evaluation], screened: list[Evaluation]) -> list[Evaluation]:
    """The screened candidates not planned in full that may fit (by their screened memory
    less its margin)."""
    full = {e.candidate for e in planned}
    return [e for e in screened if e.candidate not in full and e.step_time_s is not None
            and least_memory(e) <= e.usable_bytes]  # fmt: skip


@dataclass
class _Refined:
    """The per-op refinement and every plan it made (its base's, where the base was only
    screened, and the refined candidate's)."""

    refinement: Refinement | None
    planned: list[Evaluation]


def _refine(
    walked: Walk, graph: Graph, cluster: Cluster, headroom: float, report: Progress
) -> _Refined:
    """Refine the fastest fitting tensor-parallel plan op by op (`refine`), planning it in
    full first where it was only screened."""
    planned: list[Evaluation] = []
    base = None
    for _ in range(3):
        base = _refinable(walked.evaluations + planned, walked.screened)
        if base is None or base.screened is None:
            break
        report(0.95, f"planning {base.candidate.label()} in full")
        planned.append(evaluate(base.candidate, graph, cluster, headroom))
    if base is None or base.screened is not None:
        return _Refined(None, planned)
    report(0.96, f"per-op refinement of {base.candidate.label()}")
    refinement = refine(base, graph, cluster, headroom)
    if refinement.evaluation is not None:
        planned.append(refinement.evaluation)
    return _Refined(refinement, planned)


class _Refining:
    """The per-op refinement (`_refine`), in a thread of this process from the moment the
    walk has planned every candidate without stages (`walk`'s `flat_done`: the plans it
    stands on are all made then, and only pipelines follow, planned by the worker
    processes), or after the walk where it was not started."""

    def __init__(self, graph: Graph, cluster: Cluster, headroom: float) -> None:
        self.args = (graph, cluster, headroom)
        self.thread: threading.Thread | None = None
        self.result: _Refined | None = None
        self.error: BaseException | None = None

    def start(self, flat: Walk) -> None:
        snapshot = Walk(list(flat.evaluations), [], list(flat.screened))
        self.thread = threading.Thread(target=self._run, args=(snapshot,), daemon=True)
        self.thread.start()

    def _run(self, walked: Walk) -> None:
        try:  # progress is reported from the walk's thread only
            self.result = _refine(walked, *self.args, lambda fraction, message: None)
        except BaseException as exc:  # raised again in the search's thread
            self.error = exc

    def finish(self, walked: Walk, report: Progress) -> _Refined:
        """The refinement, waited for (or made now, with `walked`, where not started)."""
        if self.thread is None:
            return _refine(walked, *self.args, report)
        report(0.96, "per-op refinement")
        self.thread.join()
        if self.error is not None:
            raise self.error
        assert self.result is not None
        return self.result


def _references(candidates: list[Candidate], space: Space) -> list[Candidate]:
    """For each tensor-parallel degree of a pipelined mesh, one flat candidate planned for
    the pipelines' bound even where it cannot fit or is not a candidate (its parameter state
    is too large; the embedding does not split under FSDP): data parallelism, with sequence
    parallelism, on the flat mesh of that degree."""
    flat = {m.tp: m for m in sorted(space.meshes, reverse=True) if m.pp == 1}
    out = []
    for tp in sorted({c.mesh.tp for c in candidates if c.mesh.pp > 1}):
        mesh = flat.get(tp)
        if mesh is not None:
            reference = Candidate(mesh, "dp" if mesh.dp > 1 else None, tp > 1, "none")
            if reference not in candidates:
                out.append(reference)
    return out


def _refinable(planned: list[Evaluation], screened: list[Evaluation]) -> Evaluation | None:
    """The fastest fitting template plan with tensor parallelism and no pipeline: fitting
    by its full plan, or by its screened figures where it has none (`screen`)."""
    fitting = [e for e in planned if e.fits] + _screened_fitting(planned, screened)
    options = [e for e in fitting if e.candidate.mesh.tp > 1 and e.candidate.mesh.pp == 1
               and e.step_time_s is not None]  # fmt: skip
    return min(options, key=lambda e: e.step_time_s or 0.0, default=None)


def _shape(graph: Graph) -> ModelShape:
    config = graph.meta.get("config")
    if not isinstance(config, Mapping) or "layers" not in config:
        raise SearchError(f"search needs a transformer preset, got graph {graph.name!r}",
                          model=graph.name)  # fmt: skip
    heads = int(config.get("heads", 1))
    return ModelShape(int(config["layers"]), heads, int(config.get("kv_heads") or heads),
                      int(config.get("batch", 1)), config.get("attention") == "flash")  # fmt: skip


_WORKER: dict[str, Any] = {}


def _init(graph: Graph, cluster: Cluster, headroom: float) -> None:
    _WORKER.update(graph=graph, cluster=cluster, headroom=headroom, screener=Screener(graph))


def _evaluate(candidate: Candidate, screen: bool = False) -> Evaluation:
    graph, cluster, headroom = _WORKER["graph"], _WORKER["cluster"], _WORKER["headroom"]
    if screen:
        screener: Screener = _WORKER["screener"]
        return screener.screen(candidate, cluster, headroom)
    return evaluate(candidate, graph, cluster, headroom)


class _Pool:
    """Evaluates candidates in worker processes (in this process with one worker), or on a
    Ray cluster when given its address (`ray_pool`)."""

    def __init__(
        self,
        graph: Graph,
        cluster: Cluster,
        headroom: float,
        workers: int | None,
        ray_address: str | None = None,
    ):
        self.args = (graph, cluster, headroom)
        self.workers = workers or os.cpu_count() or 1
        self.ray_address = ray_address
        self.executor: ProcessPoolExecutor | None = None
        self.ray: Any = None
        self.futures: set[Future[Evaluation]] = set()
        self.ready: list[Evaluation] = []

    def __enter__(self) -> _Pool:
        if self.ray_address:
            try:
                from shardlab.search.ray_pool import RayPool
            except ImportError:
                raise SearchError("--ray needs the ray package: pip install 'shardlab[ray]'",
                                  ray=self.ray_address) from None  # fmt: skip
            try:
                self.ray = RayPool(*self.args, self.ray_address)
            except ConnectionError as exc:
                raise SearchError(f"cannot join the Ray cluster at {self.ray_address!r}: "
                                  f"{exc}", ray=self.ray_address) from None  # fmt: skip
            self.workers = self.ray.workers
        elif self.workers > 1:
            self.executor = ProcessPoolExecutor(self.workers, initializer=_init,
                                                initargs=self.args)  # fmt: skip
        else:
            _init(*self.args)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.executor is not None:
            self.executor.shutdown(cancel_futures=True)
        if self.ray is not None:
            self.ray.close()

    def submit(self, candidate: Candidate, screen: bool = False) -> None:
        """Start planning `candidate`, or screening it (`screen`), in this process at once
        with one worker."""
        if self.ray is not None:
            self.ray.submit(candidate, screen)
        elif self.executor is not None:
            self.futures.add(self.executor.submit(_evaluate, candidate, screen))
        else:
            self.ready.append(_evaluate(candidate, screen))

    def next_done(self) -> Evaluation:
        """The next evaluation to finish."""
        if self.ray is not None:
            done: Evaluation = self.ray.next_done()
            return done
        if self.executor is not None:
            finished, _ = wait(self.futures, return_when=FIRST_COMPLETED)
            future = finished.pop()
            self.futures.remove(future)
            return future.result()
        return self.ready.pop(0)
