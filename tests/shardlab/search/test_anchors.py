"""Sanity anchors of the search at full size: what practitioners run must come out on top."""

from __future__ import annotations

from shardlab.search.run import search


def test_sharded_data_parallelism_beats_tensor_parallelism_on_one_node():
    """llama3-8b on one node of 8 H100 with a modest batch (8 sequences of 8192 tokens):
    FSDP/ZeRO data parallelism wins, as torchtitan's published configurations use; plain
    data parallelism does not fit (18 bytes per parameter is 135 GiB per rank; the
    parameters and optimizer state alone take 105 GiB)."""
    result = search("llama3-8b", "h100-sxm-1x8", global_batch=8)
    win = result.winner
    assert win is not None
    assert win.candidate.mesh.tp == 1 and win.candidate.mesh.pp == 1
    assert win.candidate.dp_recipe in ("zero1", "zero2", "fsdp")
    plain = [p for p in result.skipped if p.what == "dp=8 dp"]  # not even planned
    assert plain and plain[0].reason.startswith("needs at least 105 GiB of 67.1 GiB usable")
    # tensor parallelism over the node is slower: planned and ranked below, or screened
    # (`search.screen`) and skipped because it cannot beat the winner
    tensor = [e for e in result.feasible if e.candidate.mesh.tp == 8]
    beaten = [p for p in result.skipped if p.what.startswith("tp=8 ")
              and p.reason.startswith(f"cannot beat {win.step_time_s * 1e3:.1f} ms")]  # fmt: skip
    assert tensor or beaten
    assert all(e.step_time_s > win.step_time_s for e in tensor)
    # a candidate that does not fit is never ranked above one that does
    fits = [e.fits for e in result.ranked]
    assert fits == sorted(fits, reverse=True)


def test_tensor_parallelism_stays_inside_a_node_even_when_allowed_to_cross():
    """llama3-70b's layers (8 of its 80, to keep the test short) on 64 H100 in 8 nodes, with
    tensor parallelism allowed across nodes: the winner keeps tp inside a node, and the best
    plan with tp=16 (over InfiniBand) is slower than the best with tp=8 (over NVLink)."""
    result = search("llama3-70b", "h100-sxm-8x8", overrides={"layers": 8}, global_batch=64,
                    cross_node_tp=True)  # fmt: skip
    assert result.winner is not None and result.winner.candidate.mesh.tp <= 8
    best = {tp: min(e.step_time_s for e in result.feasible if e.candidate.mesh.tp == tp)
            for tp in (8, 16)}  # fmt: skip
    assert best[16] > 1.2 * best[8]
