"""One case of the scale benchmark, run in a fresh process: `python -m bench.scale_case CASE`.

Prints one JSON line: the seconds of the timed part, the process's peak RSS, and what the
case planned (step, memory, folded layers). A fresh process per run keeps caches of one run
(rule results, reshard plans) from flattering the next, and gives each run its own RSS.
"""

from __future__ import annotations

import importlib
import json
import resource
import sys
import time
from pathlib import Path
from typing import Any

from shardlab.models import build_model
from shardlab.plan import build_plan
from shardlab.strategy import Strategy

GPT_175B = {"hidden": 12288, "layers": 96, "heads": 96, "seq": 2048, "vocab": 51200}
GPT_1T = {"hidden": 25600, "layers": 128, "heads": 160, "seq": 2048, "vocab": 51200}


def _pipeline(schedule: str, microbatches: int, v: int = 1) -> dict[str, Any]:
    return {"pipeline": {"schedule": schedule, "microbatches": microbatches,
                         "virtual_stages": v, "balance": "even"}}  # fmt: skip


def _gpt(shape: dict[str, int], batch: int) -> Any:
    return build_model("gpt", {**shape, "ffn": 4 * shape["hidden"], "batch": batch,
                               "tie_embeddings": False})  # fmt: skip


def llama8b(layers: int) -> dict[str, Any]:
    """Whole `build_plan` of llama3-8b on dp=8,tp=8 + sequence parallel, costed."""
    model = build_model("llama3-8b", {"layers": layers})
    strategy = Strategy.build("dp=8,tp=8", ["dp", "megatron_tp", "sequence_parallel"])
    start = time.perf_counter()
    plan = build_plan(model, strategy, cluster="h100-sxm-8x8")
    seconds = time.perf_counter() - start
    assert plan.cost is not None
    return {"seconds": seconds, "step_s": plan.cost.step_time,
            "peak_bytes": plan.cost.peak_memory_bytes,
            "folded": plan.completed.folded_segments}  # fmt: skip


def gpt_pipeline(size: str, microbatches: int) -> dict[str, Any]:
    """Whole plan of GPT 175B (pp=8,tp=8, interleaved v=3, 64 A100) or GPT 1T (pp=64,tp=8,
    1F1B, 512 A100), micro-batch size 1 and `microbatches` micro-batches per step."""
    if size == "175b":
        model = _gpt(GPT_175B, microbatches)
        strategy = Strategy.build("pp=8,tp=8", ["megatron_tp"],
                                  options=_pipeline("interleaved", microbatches, 3))  # fmt: skip
        cluster = "a100-80g-8x8"
    else:
        model = _gpt(GPT_1T, microbatches)
        strategy = Strategy.build("pp=64,tp=8", ["megatron_tp"],
                                  options=_pipeline("1f1b", microbatches))  # fmt: skip
        cluster = "a100-80g-64x8"
    start = time.perf_counter()
    plan = build_plan(model, strategy, cluster=cluster)
    seconds = time.perf_counter() - start
    assert plan.pipeline is not None and plan.pipeline.cost is not None
    cost = plan.pipeline.cost
    return {"seconds": seconds, "step_s": cost.step_time, "peak_bytes": cost.peak_memory_bytes,
            "folded": plan.completed.folded_segments}  # fmt: skip


def llama70b_schedule(microbatches: int) -> dict[str, Any]:
    """The 1F1B schedule alone of llama3-70b on pp=8,dp=8,tp=8 (h100-sxm-64x8): the plan's
    unit costs laid out as slots (`cost.pipeline_slots.schedule_step`), best of 20."""
    from shardlab.cost.pipeline_layout import schedule_step

    model = build_model("llama3-70b", {"batch": 8 * microbatches})
    strategy = Strategy.build("pp=8,dp=8,tp=8", ["dp", "megatron_tp", "sequence_parallel"],
                              options=_pipeline("1f1b", microbatches))  # fmt: skip
    plan = build_plan(model, strategy, cluster="h100-sxm-64x8")
    assert plan.pipeline is not None and plan.pipeline.cost is not None
    cost = plan.pipeline.cost
    times = {}
    for st in cost.stages:
        for c, f, b in zip(st.chunks, st.forward_s, st.backward_s, strict=True):
            times[(c, "F")], times[(c, "B")] = f, b
    p2p = {}
    for key, t in cost.p2p_s.items():
        hop, phase = key.split(" ")
        a, b = hop.split("->")
        p2p[(int(a), int(b), phase)] = t
    best = float("inf")
    for _ in range(20):
        start = time.perf_counter()
        _, ends, _ = schedule_step("1f1b", 8, microbatches, 1, times, p2p)
        best = min(best, time.perf_counter() - start)
    return {"seconds": best, "step_s": cost.step_time, "peak_bytes": cost.peak_memory_bytes,
            "schedule_end_s": max(ends)}  # fmt: skip


def completion(layers: int) -> dict[str, Any]:
    """Completion alone of the llama3-8b forward graph (dp=8,tp=8, dp + megatron_tp), cold:
    no rule answer cached; the graph's structure index is built first and timed apart."""
    from shardlab.repeats import repeats_of

    complete = importlib.import_module("shardlab.spmd.complete").complete
    graph = build_model("llama3-8b", {"layers": layers})
    strategy = Strategy.build("dp=8,tp=8", ["dp", "megatron_tp"])
    start = time.perf_counter()
    repeats_of(graph)
    index = time.perf_counter() - start
    start = time.perf_counter()
    done = complete(graph, strategy)
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "index_s": index, "ops": len(graph.ops),
            "folded": done.folded_segments}  # fmt: skip


CASES = {
    "llama8b-32": lambda: llama8b(32),
    "llama8b-64": lambda: llama8b(64),
    "llama70b-schedule-16": lambda: llama70b_schedule(16),
    "llama70b-schedule-64": lambda: llama70b_schedule(64),
    "gpt175b-64": lambda: gpt_pipeline("175b", 64),
    "gpt175b-128": lambda: gpt_pipeline("175b", 128),
    "gpt1t-256": lambda: gpt_pipeline("1t", 256),
    "gpt1t-512": lambda: gpt_pipeline("1t", 512),
    "completion-32": lambda: completion(32),
    "completion-320": lambda: completion(320),
}


def peak_rss_mb() -> float:
    """This process's peak resident memory (VmHWM: unlike `ru_maxrss`, it starts afresh at
    exec, so the forking benchmark's own memory is not counted)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    result = CASES[sys.argv[1]]()
    result["rss_mb"] = peak_rss_mb()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
