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
    tensor = [e for e in result.feasible if e.candidate.mesh.tp == 8]
    assert tensor and all(e.step_time_s > win.step_time_s for e in tensor)
    # a candidate that does not fit is never ranked above one that does
    fits = [e.fits for e in result.ranked]
    assert fits == sorted(fits, reverse=True)
