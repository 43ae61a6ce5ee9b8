"""Model presets: published parameter counts, overrides, module-path names."""

from __future__ import annotations

import pytest

from shardlab.errors import PresetError
from shardlab.ir import ValueKind
from shardlab.models import build_model, parse_overrides
from shardlab.summary import count_layers
from shardlab.validate import validate_graph

#: Published parameter counts (HF model cards / configs; Llama papers).
PUBLISHED = {
    "gpt2": 124_439_808,
    "gpt2-medium": 354_823_168,
    "gpt2-large": 774_030_080,
    "gpt2-xl": 1_557_611_200,
    "llama2-7b": 6_738_415_616,
    "llama2-13b": 13_015_864_320,
    "llama2-70b": 68_976_648_192,
    "llama3-8b": 8_030_261_248,
    "llama3-70b": 70_553_706_496,
}


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_parameter_count_equals_the_published_one(name: str) -> None:
    graph = build_model(name)
    assert graph.num_params() == PUBLISHED[name]
    assert count_layers(graph) == graph.meta["config"]["layers"]


@pytest.mark.parametrize("name", ["gpt2", "llama3-8b"])
def test_presets_validate_against_the_catalog(name: str) -> None:
    validate_graph(build_model(name, {"layers": 2}))


def test_llama_block_has_module_path_names() -> None:
    g = build_model("llama3-8b", {"layers": 1, "seq": 16, "batch": 2})
    params = {v.name: v.type.shape for v in g.values_of_kind(ValueKind.PARAM)}
    assert params["layers.0.attn.q_proj.weight"] == (4096, 4096)
    assert params["layers.0.attn.k_proj.weight"] == (4096, 1024)
    assert params["layers.0.mlp.gate_proj.weight"] == (4096, 14336)
    assert params["lm_head.weight"] == (4096, 128256)
    assert g.op("layers.0.attn.q_proj").scope == "layers.0.attn.q_proj"
    assert g.op("layers.0.attn.sdpa").attrs == {"causal": True}
    assert g.type_of("layers.0.attn.k_heads").shape == (2, 16, 8, 128)
    assert g.outputs == ("loss",)
    assert g.type_of("loss").shape == ()


def test_gpt2_ties_the_lm_head_to_the_embedding() -> None:
    g = build_model("gpt2", {"layers": 1})
    lm_head = g.op("lm_head")
    assert lm_head.inputs[1] == "embed.weight" and lm_head.attrs == {"transpose_b": True}


def test_mlp_demo_is_the_seed_net() -> None:
    g = build_model("mlp_demo")
    assert [op.kind for op in g.ops] == ["matmul", "matmul", "mse_loss"]
    assert g.type_of("w0").shape == (32, 32) and g.type_of("w1").shape == (32, 8)


def test_overrides_apply_with_coercion() -> None:
    g = build_model(
        "llama3-8b",
        parse_overrides(
            [
                "layers=2",
                "hidden=256",
                "heads=8",
                "kv_heads=2",
                "ffn=512",
                "vocab=1000",
                "seq=64",
                "batch=4",
                "dtype=float32",
            ]
        ),
    )
    assert g.meta["config"]["hidden"] == 256
    assert g.type_of("layers.1.attn.k_proj.weight").shape == (256, 64)
    assert g.type_of("tokens").shape == (4, 64)
    assert g.type_of("embed.weight").dtype == "float32"
    # heads alone keeps MHA models MHA
    g2 = build_model("gpt2", {"layers": 1, "heads": 4})
    assert g2.type_of("layers.0.attn.k_heads").shape == (8, 1024, 4, 192)


@pytest.mark.parametrize(
    ("name", "overrides", "pattern"),
    [
        ("llama9", {}, r"unknown model preset 'llama9'; known presets: mlp_demo"),
        ("gpt2", {"depth": "3"}, r"gpt2 has no setting 'depth'; settable: layers"),
        ("gpt2", {"layers": "two"}, r"layers must be an integer, got 'two'"),
        ("gpt2", {"layers": "0"}, r"layers must be positive, got 0"),
        ("gpt2", {"heads": "7"}, r"hidden \(768\) must be divisible by heads \(7\)"),
        ("llama3-8b", {"kv_heads": "5"}, r"heads \(32\) must be divisible by kv_heads \(5\)"),
        ("gpt2", {"seq": "2048"}, r"seq \(2048\) exceeds the 1024 learned positions"),
        ("gpt2", {"dtype": "int64"}, r"dtype must be one of bfloat16, float16, float32"),
        ("mlp_demo", {"layers": "2"}, r"mlp_demo has no setting 'layers'"),
    ],
)
def test_bad_presets_and_overrides_are_named(
    name: str, overrides: dict[str, str], pattern: str
) -> None:
    with pytest.raises(PresetError, match=pattern):
        build_model(name, overrides)


def test_malformed_override_pair() -> None:
    with pytest.raises(PresetError, match=r"override 'layers' is not of the form key=value"):
        parse_overrides(["layers"])
