"""Model presets: published parameter counts, overrides, module-path names."""

from __future__ import annotations

from fractions import Fraction

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
        (
            "llama3-8b",
            {"hidden": str(2**62)},
            r"hidden must be at most 2147483647 \(2\^31 - 1\), got 4611686018427387904",
        ),
        ("mlp_demo", {"batch": 2**31}, r"batch must be at most 2147483647"),
        ("gpt2", {"heads": "7"}, r"hidden \(768\) must be divisible by heads \(7\)"),
        ("llama3-8b", {"kv_heads": "5"}, r"heads \(32\) must be divisible by kv_heads \(5\)"),
        ("gpt2", {"seq": "2048"}, r"seq \(2048\) exceeds the 1024 learned positions"),
        ("gpt2", {"dtype": "int64"}, r"dtype must be one of bfloat16, float16, float32"),
        ("mlp_demo", {"layers": "2"}, r"mlp_demo has no setting 'layers'"),
        ("gpt", {"attention": "fast"}, r"attention must be one of flash, eager, got 'fast'"),
        ("llama3-8b", {"attention": "1"}, r"attention must be one of flash, eager, got '1'"),
        ("gpt", {"dropout": "1.5"}, r"dropout must be in \[0, 1\), got 1.5"),
        ("gpt", {"dropout": "-0.1"}, r"dropout must be in \[0, 1\), got -0.1"),
        ("gpt", {"dropout": "lots"}, r"dropout must be a number, got 'lots'"),
        ("gpt", {"dropout": True}, r"dropout must be a number, got True"),
        ("gpt", {"tie_embeddings": "maybe"}, r"tie_embeddings must be true or false"),
        ("gpt", {"tie_embeddings": 2}, r"tie_embeddings must be true or false"),
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


def narayanan_eq2(layers: int, hidden: int, vocab: int, seq: int) -> int:
    """Narayanan et al. (2021), eq. 2: P = 12 l h^2 (1 + 13/(12h) + (V + s)/(12 l h))."""
    l, h = layers, hidden
    p = Fraction(12 * l * h * h) * (1 + Fraction(13, 12 * h) + Fraction(vocab + seq, 12 * l * h))
    assert p.denominator == 1
    return int(p)


@pytest.mark.parametrize(
    "overrides",
    [
        {},  # the default: layers 24, hidden 2048, heads 16, vocab 51200, seq 2048
        {"layers": 24, "hidden": 2048, "heads": 16, "vocab": 51200, "seq": 2048},
        {"layers": 4, "hidden": 512, "heads": 8, "vocab": 1000, "seq": 128, "attention": "eager"},
    ],
)
def test_gpt_parameter_count_is_narayanan_eq2(overrides: dict[str, object]) -> None:
    """Eq. 2 counts each layer's 12h^2 + 13h and the (V + s) h embeddings; it leaves out the
    final LayerNorm (weight and bias, 2h), which the model has."""
    tied = build_model("gpt", overrides)
    cfg = tied.meta["config"]
    l, h, v, s = cfg["layers"], cfg["hidden"], cfg["vocab"], cfg["seq"]
    assert cfg["ffn"] == 4 * h and cfg["tie_embeddings"] is True
    assert tied.num_params() == narayanan_eq2(l, h, v, s) + 2 * h
    untied = build_model("gpt", {**overrides, "tie_embeddings": "false"})
    assert untied.num_params() == narayanan_eq2(l, h, v, s) + 2 * h + v * h
    assert untied.type_of("lm_head.weight").shape == (h, v)
    assert untied.op("lm_head").kind == "linear"


def test_gpt_defaults_and_every_setting() -> None:
    g = build_model("gpt")
    assert g.num_params() == 1_317_654_528
    cfg = g.meta["config"]
    assert (cfg["family"], cfg["layers"], cfg["hidden"], cfg["heads"], cfg["ffn"]) == (
        "gpt", 24, 2048, 16, 8192)  # fmt: skip
    assert (cfg["vocab"], cfg["seq"], cfg["batch"], cfg["dropout"], cfg["attention"]) == (
        51200, 2048, 8, 0.1, "flash")  # fmt: skip
    small = build_model("gpt", parse_overrides([
        "hidden=64", "heads=4", "layers=2", "ffn=96", "vocab=128", "seq=16", "batch=4",
        "dropout=0.2", "attention=eager", "tie_embeddings=0", "dtype=float32"]))  # fmt: skip
    cfg = small.meta["config"]
    assert (cfg["ffn"], cfg["dropout"], cfg["attention"], cfg["tie_embeddings"]) == (
        96, 0.2, "eager", False)  # fmt: skip
    assert small.type_of("layers.1.mlp.up_proj.weight").shape == (64, 96)
    assert build_model("gpt", {"hidden": 256, "heads": 4}).meta["config"]["ffn"] == 1024


def test_gpt_positions_follow_seq_where_gpt2_is_refused() -> None:
    g = build_model("gpt", {"layers": 1, "seq": 4096})
    assert g.type_of("pos_embed.weight").shape == (4096, 2048)
    assert g.type_of("tokens").shape == (8, 4096)
    with pytest.raises(PresetError, match=r"seq \(2048\) exceeds the 1024 learned positions"):
        build_model("gpt2", {"seq": 2048})


def test_boolean_and_choice_settings_parse() -> None:
    for raw, want in [("true", True), ("1", True), ("False", False), ("0", False), (True, True)]:
        g = build_model("llama3-8b", {"layers": 1, "tie_embeddings": raw})
        assert g.meta["config"]["tie_embeddings"] is want
        assert ("lm_head.weight" in g.values) is not want
    g = build_model("llama3-8b", {"layers": 1, "attention": "eager", "dropout": "0.1"})
    assert g.meta["config"]["attention"] == "eager" and g.meta["config"]["dropout"] == 0.1
    with pytest.raises(PresetError) as err:
        build_model("gpt", {"attention": "fast"})
    assert err.value.detail == {"key": "attention"}


def test_pad_vocab_rounds_the_vocab_rows_up() -> None:
    small = {"layers": 1, "hidden": 16, "heads": 4, "seq": 4, "batch": 2}
    padded = build_model("gpt2", {**small, "pad_vocab": "512"})  # 50257 -> 50688
    assert padded.type_of("embed.weight").shape == (50688, 16)
    untied = build_model("llama3-8b", {**small, "kv_heads": 2, "vocab": 257, "pad_vocab": 8})
    assert untied.type_of("embed.weight").shape == (264, 16)
    assert untied.type_of("lm_head.weight").shape == (16, 264)
    assert build_model("gpt2", small).type_of("embed.weight").shape == (50257, 16)
    with pytest.raises(PresetError, match="pad_vocab must be positive"):
        build_model("gpt2", {**small, "pad_vocab": 0})
