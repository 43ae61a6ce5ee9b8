"""The structure index of repeated layers: segments, classes, renaming, folded matching."""

from __future__ import annotations

import pytest

from shardlab.autodiff import training_graph
from shardlab.ir import OpRole
from shardlab.models import build_model
from shardlab.repeats import layer_blind, layer_of, repeats_of, split_name, translate

SMALL = {"layers": 5, "hidden": 64, "heads": 4, "kv_heads": 2, "ffn": 128, "vocab": 128,
         "seq": 16, "batch": 4}  # fmt: skip


def test_forward_layers_form_classes_first_middle_last():
    graph = build_model("llama3-8b", SMALL)
    r = repeats_of(graph)
    layer_segments = [s for s in r.segments if s.family == "layers"]
    assert [s.layer for s in layer_segments] == [0, 1, 2, 3, 4]
    # layer 0 reads the embedding, the last layer feeds the final norm: the three middle
    # layers are one body
    classes = [s.cls for s in layer_segments]
    assert classes[1] == classes[2] == classes[3]
    assert len({classes[0], classes[1], classes[4]}) == 3
    assert repeats_of(graph) is r  # built once per graph


def test_training_graph_segments_per_layer_and_role():
    graph = training_graph(build_model("llama3-8b", SMALL))
    r = repeats_of(graph)
    roles = {}
    for s in r.segments:
        if s.family:
            roles.setdefault(s.layer, []).append(graph.ops[s.start].role)
    assert all(
        set(found) == {OpRole.FORWARD, OpRole.BACKWARD, OpRole.OPTIMIZER}
        for found in roles.values()
    )
    backward = [s for s in r.segments if s.family and graph.ops[s.start].role == OpRole.BACKWARD]
    middle = {s.cls for s in backward if s.layer in (1, 2, 3)}
    assert len(middle) == 1  # gradient sums are named per layer, so backward bodies repeat
    for s in r.segments:  # every op of a segment belongs to it
        assert all(r.op_segment[op.name] == s.index for op in graph.ops[s.start : s.stop])


def test_values_belong_to_the_segment_that_writes_them_or_reads_a_parameter_first():
    graph = build_model("llama3-8b", SMALL)
    r = repeats_of(graph)
    seg = r.segments[r.op_segment["layers.2.attn.q_proj"]]
    assert r.value_segment["layers.2.attn.q_proj"] == seg.index
    assert r.value_segment["layers.2.attn.q_proj.weight"] == seg.index
    assert "rope.cos" not in r.value_segment or r.segments[r.value_segment["rope.cos"]].cls < 0


def test_names_move_between_layers():
    assert layer_of("layers.12.mlp.up_proj") == ("layers", 12)
    assert layer_of("embed.weight") is None
    assert split_name("layers.3.attn", "layers") == (3, ".attn")
    assert translate("layers.2.mlp_residual", "layers", 3, 7) == "layers.6.mlp_residual"
    assert translate("rope.cos", "layers", 3, 7) == "rope.cos"
    assert translate("layers.0.x", "layers", 3, 1) is None
    assert layer_blind("layers.*.attn.q_proj.weight")
    assert not layer_blind("layers.1*.attn")
    assert not layer_blind("layers.?.attn")


@pytest.mark.parametrize(
    "pattern",
    ["layers.*.attn.q_proj.weight", "*.weight", "layers.*", "layers.1*", "*norm*",
     "layers.3.mlp.up_proj.weight", "embed.weight"],
)  # fmt: skip
def test_folded_matching_equals_matching_every_name(pattern):
    from shardlab.annotation import match_values

    graph = training_graph(build_model("llama3-8b", SMALL))
    names = graph.values.keys()
    assert sorted(repeats_of(graph).match(pattern, names)) == sorted(match_values(pattern, names))
