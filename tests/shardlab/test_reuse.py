"""The caches candidates of a search share (`shardlab.reuse`) change no plan: two pipelined
candidates that share a lowering (1F1B and interleaved at the same micro-batches) and two
siblings that share their units (dp and ZeRO-1) plan the same with the caches as without,
and the cached programs stay as they were made."""

from __future__ import annotations

from typing import Any

import pytest

from shardlab import reuse
from shardlab.cost.clusters import load_cluster
from shardlab.cost.pipeline_memory import HELD
from shardlab.cost.pipeline_units import UNITS
from shardlab.models import build_model
from shardlab.plan import build_plan
from shardlab.plan_pipeline import LOWERED
from shardlab.search.space import Candidate, Mesh3

SMALL = {"layers": 8, "hidden": 256, "heads": 8, "kv_heads": 4, "ffn": 768, "vocab": 1024,
         "seq": 256, "batch": 16}  # fmt: skip


def _figures(candidate: Candidate, model: Any, cluster: Any) -> tuple[Any, ...]:
    plan = build_plan(model, candidate.strategy(), cluster=cluster)
    cost = plan.pipeline.cost
    ops = [(op.name, op.kind, op.inputs, op.outputs, op.comm) for op in plan.program.ops]
    stages = [(st.memory.to_json(), st.tail_s, st.busy_s) for st in cost.stages]
    return (cost.step_time, cost.peak_memory_bytes, ops, cost.summary(), plan.summary(), stages)


def _fingerprint(entries: Any) -> list[Any]:
    return [[(op.name, op.kind, op.inputs, op.outputs, op.deps) for op in program.ops]
            for _, _, program in entries]  # fmt: skip


MESH = Mesh3(2, 2, 2)
PAIRS = {
    # one lowering for both schedules
    "schedules": (Candidate(MESH, "dp", True, "none", "1f1b", 4),
                  Candidate(MESH, "dp", True, "none", "interleaved", 4, 2)),
    # the same forward and backward units
    "siblings": (Candidate(MESH, "dp", True, "none", "interleaved", 4, 2),
                 Candidate(MESH, "zero1", True, "none", "interleaved", 4, 2)),
}  # fmt: skip


@pytest.mark.parametrize("pair", list(PAIRS))
def test_cached_plans_equal_uncached(pair):
    model = build_model("llama3-8b", SMALL)
    cluster = load_cluster("h100-sxm-1x8")
    first, second = PAIRS[pair]
    with reuse.enabled(False):
        alone = [_figures(c, model, cluster) for c in (first, second)]
    reuse.clear_all()
    shared = [_figures(first, model, cluster)]
    made = _fingerprint(LOWERED.entries.values())
    shared.append(_figures(second, model, cluster))
    assert shared == alone
    if pair == "schedules":
        assert (LOWERED.hits, LOWERED.misses) == (1, 1)
    else:  # the second plan's forward and backward units were simulated by the first
        assert UNITS.hits >= 2 * MESH.pp * 2
    assert _fingerprint(list(LOWERED.entries.values())[: len(made)]) == made  # not mutated


def test_twin_stages_are_simulated_and_profiled_once():
    """The middle stages of a model of repeated layers take the first one's units, tail and
    memory (their tensor-parallel collectives name values of other layers), and the plan is
    the one made without the caches."""
    model = build_model("llama3-8b", SMALL)
    cluster = load_cluster("h100-sxm-1x8")
    candidate = Candidate(Mesh3(4, 1, 2), None, True, "none", "1f1b", 4)
    with reuse.enabled(False):
        alone = _figures(candidate, model, cluster)
    reuse.clear_all()
    assert _figures(candidate, model, cluster) == alone
    assert HELD.hits >= 1  # stages 1 and 2 hold 2 layers each
    assert UNITS.hits >= 3  # their forward, backward and tail


def test_a_bounded_cache_drops_its_oldest_entry():
    cache = reuse.Reuse[int]("test cache", 2)
    made = []
    for key in (1, 2, 1, 3, 2):
        cache.get(key, lambda k=key: made.append(k) or k)
    assert made == [1, 2, 3, 2]  # 2 was dropped when 3 came (1 had been used since)
    assert (cache.hits, cache.misses) == (1, 4)
    with reuse.enabled(False):
        assert cache.get(1, lambda: 7) == 7
    assert cache.keys() == [3, 2]
