"""The branch-and-bound's lower bounds hold: no pipelined candidate of a whole small space
steps faster than the bound computed from the flat candidates nor than its siblings'
stages, and none holds less memory
than its parameter state, and no candidate needs less memory than a heavier one."""

from __future__ import annotations

from dataclasses import replace

import pytest

from shardlab.cost.clusters import load_cluster
from shardlab.models import build_model
from shardlab.search.bound import (
    MEMORY_SLACK,
    SAME_UNITS,
    FlatWork,
    bubble_factor,
    busiest_stage,
    cannot_win,
    flat_work,
    last_stage,
    leaner_or_equal,
    one_f_one_b,
    sibling_bound,
    sibling_work,
    state_bound,
    step_bound,
    unit_work,
    units_bound,
)
from shardlab.search.evaluate import evaluate, layer_units
from shardlab.search.floors import gather_floor, gathered, stage_params, tail_floor
from shardlab.search.space import Limits, ModelShape, every_candidate

SHAPES = {
    # 6 layers: on 4 stages the busiest holds 2, a third above the average
    "tiny, launch-bound": {"layers": 6, "hidden": 128, "heads": 8, "kv_heads": 2, "ffn": 256,
                           "vocab": 256, "seq": 64},
    "small, compute-bound": {"layers": 4, "hidden": 1024, "heads": 8, "kv_heads": 4,
                             "ffn": 3584, "vocab": 8192, "seq": 1024},
}  # fmt: skip


@pytest.mark.parametrize("name", list(SHAPES))
def test_no_pipelined_candidate_beats_its_bound(name):
    config = SHAPES[name]
    cluster = load_cluster("h100-sxm-1x8")
    model = build_model("llama3-8b", {**config, "batch": 16})
    shape = ModelShape(config["layers"], config["heads"], config["kv_heads"], 16)
    every = [evaluate(c, model, cluster, 0.1) for c in every_candidate(shape, Limits(8, 8))]
    work = flat_work(every)
    assert set(work) == {1, 2, 4, 8}
    params = model.num_params()
    for e in every:  # no candidate holds less than its parameter state
        if e.error is None:
            assert e.peak_memory_bytes >= state_bound(e.candidate, params), e.candidate.label()
    planned = [e for e in every if e.error is None]
    for lean in planned:  # what a leaner candidate cannot fit, a heavier one cannot either
        for heavy in planned:
            if leaner_or_equal(lean.candidate, heavy.candidate):
                assert lean.peak_memory_bytes <= heavy.peak_memory_bytes * (1 + MEMORY_SLACK), (
                    lean.candidate.label(), heavy.candidate.label())  # fmt: skip
    piped = [e for e in every if e.candidate.mesh.pp > 1 and e.error is None]
    assert len(piped) > 20
    units, held = unit_work(planned), stage_params(model)
    tighter = 0
    for e in piped:
        c = e.candidate
        # the first stage ends its units last, and its tail reduces at least the embedding's
        # and a layer per chunk's float32 gradients
        tail = tail_floor(c, cluster, held)
        if c.dp_recipe in SAME_UNITS and c.mesh.dp > 1:
            assert 0 < tail <= e.terms["first_reduce_s"] * (1 + 1e-9), c.label()
        else:
            assert tail == 0
        # under FSDP every forward unit gathers its layers' matrices over dp
        gather = gather_floor(c, cluster, held)
        assert (gather > 0) == (c.dp_recipe == "fsdp" and c.mesh.dp > 1), c.label()
        if "layer_forward_s" in e.terms:
            assert gather <= e.terms["layer_forward_s"], c.label()
        flat = {tp: gathered(w, c, gather, config["layers"]) for tp, w in work.items()}
        bound = step_bound(c, flat, config["layers"])
        assert bound is not None
        assert e.step_time_s >= bound + tail, c.label()
        by_units = units_bound(c, units, work, config["layers"], gather)
        if by_units is not None:
            assert e.step_time_s >= by_units[0] + tail, (c.label(), by_units)
            tighter += by_units[0] > bound
    # layer units of the same micro-batch bound some pipelines better than the flat plans do
    assert tighter > 0
    # no pipelined candidate steps faster than its siblings' stages (dp, ZeRO-1 and ZeRO-2
    # share their units exactly; FSDP's are longer)
    siblings = sibling_work(planned)
    checked = [e for e in piped if e.candidate.dp_recipe is not None]  # dp=1: no recipes
    assert len(checked) > 20
    for e in checked:
        bound = sibling_bound(e.candidate, siblings)
        assert bound is not None
        assert e.step_time_s >= bound[0], (e.candidate.label(), bound)
    same = [e for e in checked if e.candidate.dp_recipe in ("dp", "zero1", "zero2")]
    own = {e.candidate: max(e.terms["stages_end_s"],
                            e.terms["first_tail_at_s"] + e.terms["first_reduce_s"])
           for e in same}  # fmt: skip
    assert any(sibling_bound(e.candidate, siblings)[0] == own[e.candidate] for e in same)
    # the first stage's tail reduces its gradients after its units: the bound of a sibling
    # with data parallelism stands on it somewhere
    assert any(own[e.candidate] > e.terms["stages_end_s"] for e in same if e.candidate.mesh.dp > 1)
    # the last stage with the head binds on the compute-bound space's deeper pipelines
    last = [e for e in piped if last_stage(e.candidate, work[e.candidate.mesh.tp], config["layers"])
            > work[e.candidate.mesh.tp].step * bubble_factor(e.candidate)]  # fmt: skip
    assert last or name == "tiny, launch-bound"
    # the bound is not vacuous: it skips some candidates against the best flat plan
    best = min(e.step_time_s for e in every if e.candidate.mesh.pp == 1 and e.fits)
    assert any(cannot_win(step_bound(e.candidate, work, config["layers"]), best) for e in piped)


def test_the_bubble_factor_of_each_schedule():
    from shardlab.search.space import Candidate, Mesh3

    one_f = Candidate(Mesh3(4, 2, 1), "dp", False, "none", "1f1b", 8, None)
    inter = Candidate(Mesh3(4, 2, 1), "dp", False, "none", "interleaved", 8, 2)
    assert bubble_factor(one_f) == pytest.approx(1 + 3 / 8)
    assert bubble_factor(inter) == pytest.approx(1 + 3 / 16)
    flat = Candidate(Mesh3(1, 8, 1), "dp", False, "none")
    assert step_bound(flat, {1: FlatWork(1.0, 0.8)}, 4) is None
    # the busiest of 4 stages holds 2 of 5 layers: 2 x 4 / 5 of the layers' work
    assert step_bound(one_f, {1: FlatWork(1.0, 0.9)}, 5) == pytest.approx(0.9 * 8 / 5)
    assert step_bound(one_f, {1: FlatWork(1.0, 0.9)}, 4) == pytest.approx(1 + 3 / 8)


def test_a_1f1b_stage_waits_in_its_warm_up():
    """Four stages of two layers, eight micro-batches, a layer's forward 1 s and backward
    2 s: 1F1B takes (m + pp - 1) units of a stage, 11 x 6 s, and the bound is exact."""
    from shardlab.search.space import Candidate, Mesh3

    c = Candidate(Mesh3(4, 2, 1), "dp", False, "none", "1f1b", 8, None)
    share = 4 / 8  # a micro-batch is half a flat rank's share of the sequences
    work = FlatWork(48.0, 48.0, forward=8 / share, backward=16 / share)
    assert one_f_one_b(c, work, 8) == pytest.approx(66.0)
    # a ninth layer goes where it costs least, the first stage, which runs 4 forwards in
    # its warm-up while the first micro-batch goes round (27 s): 27 + 3 x (7 x 2 + 4 x 1)
    nine = replace(work, layers=54.0, forward=9 / share, backward=18 / share)
    assert one_f_one_b(c, nine, 9) == pytest.approx(27 + 3 * (7 * 2 + 4 * 1))
    inter = Candidate(Mesh3(4, 2, 1), "dp", False, "none", "interleaved", 8, 2)
    assert one_f_one_b(inter, work, 8) == 0.0


def test_layer_units_come_from_the_chunks_between_the_edges():
    chunks = [(0, 2), (2, 5), (5, 7), (7, 8)]
    unit_s = {(0, "F"): 9.0, (1, "F"): 3.3, (2, "F"): 2.0, (3, "F"): 9.0,
              (0, "B"): 9.0, (1, "B"): 6.0, (2, "B"): 4.4, (3, "B"): 9.0}  # fmt: skip
    assert layer_units(unit_s, chunks) == pytest.approx(
        {"layer_forward_s": 1.0, "layer_backward_s": 2.0}
    )
    assert layer_units(unit_s, chunks[:2]) == {}


def test_the_stages_bounds_deal_out_whole_layers_and_the_head():
    """The 30B GPT of the search benchmark on tp=4: a layer takes 14.1 ms of a flat rank,
    the embedding 0.7 ms and the head with its loss 16.6 ms."""
    from shardlab.search.space import Candidate, Mesh3

    work = FlatWork(0.717, 48 * 0.0141, 0.0007, 0.0166)
    deep = Candidate(Mesh3(24, 4, 4), "dp", True, "none", "1f1b", 48, None)
    # 24 stages of 2 layers, but the last with the head keeps 1 (14.1 + 16.6 = 30.7 ms),
    # so some other stage holds 3: 42.3 ms of a flat rank, 24 shares of it
    assert busiest_stage(deep, work, 48) == pytest.approx(24 * 3 * 0.0141)
    # the last stage (1 layer and the head) between the first and last micro-batch's trips
    # through the 23 stages before it: 1/48 of their work each way
    own = 24 * (0.0141 + 0.0166)
    total = 24 * (48 * 0.0141 + 0.0007 + 0.0166)
    assert last_stage(deep, work, 48) == pytest.approx(own + (total - own) / 48)
    assert step_bound(deep, {4: work}, 48) == pytest.approx(own + (total - own) / 48)
    assert step_bound(deep, {4: work}, 48) > 0.717 * bubble_factor(deep)
    # interleaved: one layer per chunk on the stages before the last, once each way
    inter = Candidate(Mesh3(8, 12, 4), "dp", True, "none", "interleaved", 16, 2)
    assert last_stage(inter, work, 48) == pytest.approx(
        8 * (2 * 0.0141 + 0.0166) + 8 * (7 * 0.0141 + 0.0007) / 16
    )
    # one stage cannot hold fewer than its chunks' layers: 2 stages x 2 chunks of 4 layers
    two = Candidate(Mesh3(2, 1, 4), None, True, "none", "interleaved", 4, 2)
    assert busiest_stage(two, FlatWork(1.0, 0.4, 0.0, 0.5), 4) == pytest.approx(2 * (0.2 + 0.5))


def test_fsdp_gathers_bound_a_pipelined_layer_at_full_size():
    """The 30B GPT of the search benchmark on 384 GPUs, pp=6 x dp=16 x tp=4 under FSDP:
    every forward unit gathers its layers' 308 MB of 16-bit matrices (per tp rank) over
    16 ranks, two on each of 8 nodes: at least 3.8 ms a layer, above the 2.5 ms a layer's
    forward takes in dp's units, which the bound stood on alone."""
    from shardlab.search.space import Candidate, Mesh3

    gpt = {"hidden": 7168, "heads": 56, "layers": 48, "ffn": 28672, "vocab": 131072,
           "seq": 4096, "dropout": 0.0, "batch": 192}  # fmt: skip
    model, cluster = build_model("gpt", gpt), load_cluster("h100-sxm-48x8")
    held = stage_params(model)
    assert held.layer_bytes == 2 * (4 * 7168 * 7168 + 2 * 7168 * 28672)
    fsdp = Candidate(Mesh3(6, 16, 4), "fsdp", True, "none", "interleaved", 12, 2)
    dp = replace(fsdp, dp_recipe="dp")
    gather = gather_floor(fsdp, cluster, held)
    assert gather_floor(dp, cluster, held) == 0.0
    assert 3.5e-3 < gather < 4.5e-3
    planned = evaluate(fsdp, model, cluster, 0.1)
    assert planned.terms["layer_forward_s"] >= gather
    units = unit_work([evaluate(dp, model, cluster, 0.1)])
    plain = units_bound(fsdp, units, {}, 48)
    lifted = units_bound(fsdp, units, {}, 48, gather)
    assert plain is not None and lifted is not None
    assert plain[0] * 1.15 < lifted[0] <= planned.step_time_s
