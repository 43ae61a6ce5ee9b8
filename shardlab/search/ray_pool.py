"""Candidate evaluation on a Ray cluster (`shardlab search --ray ADDRESS`), so a large
search uses many machines.

One `Evaluator` actor per CPU the cluster offers holds the model, the cluster and the
headroom, as a local worker process does: the caches kept on the model (its training
graphs, its repeats) serve every candidate that actor plans. `ray` is an optional extra
(`pip install shardlab[ray]`); this module is imported only when a search asks for Ray.
"""

from __future__ import annotations

from typing import Any

import ray
from ray.util import ActorPool

from shardlab.cost.clusters import Cluster
from shardlab.ir import Graph
from shardlab.search.evaluate import Evaluation, evaluate
from shardlab.search.screen import Screener
from shardlab.search.space import Candidate


@ray.remote
class Evaluator:
    """Plans candidates of one search on one CPU of the Ray cluster."""

    def __init__(self, graph: Graph, cluster: Cluster, headroom: float) -> None:
        self.args = (graph, cluster, headroom)
        self.screener = Screener(graph)

    def evaluate(self, candidate: Candidate, screen: bool) -> Evaluation:
        graph, cluster, headroom = self.args
        if screen:
            return self.screener.screen(candidate, cluster, headroom)
        return evaluate(candidate, graph, cluster, headroom)


class RayPool:
    """Evaluates candidates on the actors of a Ray cluster (joined at `address`, or the one
    this process has already started with `ray.init`)."""

    def __init__(self, graph: Graph, cluster: Cluster, headroom: float, address: str) -> None:
        if not ray.is_initialized():
            ray.init(address=address, log_to_driver=False)
        self.workers = max(1, int(ray.cluster_resources().get("CPU", 1)))
        shared = ray.put((graph, cluster, headroom))
        remote: Any = Evaluator  # ray.remote gives the class its .remote
        self.actors: list[Any] = [remote.remote(*ray.get(shared)) for _ in range(self.workers)]
        self.pool = ActorPool(self.actors)

    def submit(self, candidate: Candidate, screen: bool = False) -> None:
        self.pool.submit(lambda actor, job: actor.evaluate.remote(*job), (candidate, screen))

    def next_done(self) -> Evaluation:
        done: Evaluation = self.pool.get_next_unordered()
        return done

    def close(self) -> None:
        for actor in self.actors:
            ray.kill(actor)
