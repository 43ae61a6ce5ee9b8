"""Importing Hugging Face configs (tiny, inline: no download, no weights): parameter counts
equal transformers' own, plans verify against one device, bad configs name the field."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from shardlab.errors import ModelImportError  # noqa: E402
from shardlab.importers.hf_config import graph_from_hf_config  # noqa: E402
from shardlab.ir import ValueKind  # noqa: E402
from shardlab.models import build_model  # noqa: E402
from shardlab.plan import build_plan  # noqa: E402
from shardlab.runtime.verify import verify  # noqa: E402
from shardlab.strategy import Strategy  # noqa: E402
from shardlab.validate import validate_graph  # noqa: E402

_LLAMA_LIKE = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
               "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128,
               "max_position_embeddings": 64}  # fmt: skip
CONFIGS: dict[str, dict[str, Any]] = {
    "llama": {"model_type": "llama", "architectures": ["LlamaForCausalLM"], **_LLAMA_LIKE},
    "mistral": {"model_type": "mistral", **_LLAMA_LIKE, "sliding_window": None},
    "qwen2": {"model_type": "qwen2", **_LLAMA_LIKE},
    "gemma": {"model_type": "gemma", **_LLAMA_LIKE, "head_dim": 8},
    "gpt2": {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": 32,
             "n_layer": 2, "n_head": 4, "vocab_size": 128, "n_positions": 64,
             "bos_token_id": 0, "eos_token_id": 0},
}  # fmt: skip


def _transformers_count(config: dict[str, Any]) -> int:
    fields = {k: v for k, v in config.items() if k not in ("model_type", "architectures")}
    hf = transformers.AutoConfig.for_model(config["model_type"], **fields)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(hf)
    return int(model.num_parameters())


@pytest.mark.parametrize("family", list(CONFIGS))
def test_parameter_count_equals_transformers(family: str) -> None:
    graph = graph_from_hf_config(CONFIGS[family], batch=2, seq=16)
    validate_graph(graph)
    assert graph.num_params() == _transformers_count(CONFIGS[family])
    assert graph.meta["opaque_ops"] == []
    kinds = graph.ops_by_kind()
    assert kinds["scaled_dot_product_attention"] == 2
    assert kinds["cross_entropy"] == 1 and "opaque" not in kinds
    inputs = {v.name: v.type.shape for v in graph.values_of_kind(ValueKind.INPUT)}
    assert inputs == {"input_ids": (2, 16), "labels": (2, 16)}
    assert graph.producer("loss").role.value == "loss"
    sdpa = next(op for op in graph.ops if op.kind == "scaled_dot_product_attention")
    assert sdpa.attrs["causal"] is True  # the model's causal mask, recognised


def test_llama_names_layouts_and_fused_pieces() -> None:
    graph = graph_from_hf_config(CONFIGS["llama"], batch=2, seq=16)
    params = {v.name: v.type.shape for v in graph.values_of_kind(ValueKind.PARAM)}
    assert params["model.layers.0.self_attn.q_proj.weight"] == (32, 32)
    assert params["model.layers.1.self_attn.k_proj.weight"] == (16, 32)  # 2 kv heads x 8
    assert params["model.layers.0.mlp.gate_proj.weight"] == (64, 32)  # [out, in]
    assert params["lm_head.weight"] == (128, 32)
    kinds = graph.ops_by_kind()
    assert kinds["rms_norm"] == 5  # LlamaRMSNorm as one op: 2 per layer and the final one
    assert kinds["rope_cache"] == 1  # the rotary tables, rebuilt from the model's theta
    rope = next(op for op in graph.ops if op.kind == "rope_cache")
    assert rope.attrs["theta"] == 10000.0 and rope.scope == "constants"
    norm = graph.op("model.layers.0.input_layernorm.rms_norm")
    assert norm.attrs == {"eps": 1e-6}
    assert graph.meta["attention_heads"] == 4 and graph.meta["kv_heads"] == 2


@pytest.mark.parametrize("family", ["llama", "gpt2"])
@pytest.mark.parametrize(
    ("mesh", "templates"), [("dp=2", ["dp"]), ("dp=2,tp=2", ["dp", "megatron_tp"])]
)
def test_plans_verify_against_one_device(family: str, mesh: str, templates: list[str]) -> None:
    graph = graph_from_hf_config(CONFIGS[family], batch=4, seq=16)
    plan = build_plan(graph, Strategy.build(mesh, templates))
    summary = plan.summary()
    assert summary["fallback_ops"] == []
    report = verify(plan)
    assert report.ok, report.failed()[:3]
    n_params = len(graph.values_of_kind(ValueKind.PARAM))
    assert report.summary["compared"] >= 1 + 2 * n_params
    if "megatron_tp" not in templates:
        return
    assert summary["unmatched_template_patterns"] == []
    placed = {v: str(s) for v, s in plan.completed.specs.items()}
    if family == "llama":
        # nn.Linear [out, in]: column-parallel shards dim 0, row-parallel dim 1
        assert "S(0)" in placed["model.layers.0.self_attn.q_proj.weight"]
        assert "S(0)" in placed["model.layers.0.mlp.up_proj.weight"]
        assert "S(1)" in placed["model.layers.0.mlp.down_proj.weight"]
        assert "S(0)" in placed["lm_head.weight"] and "S(0)" in placed["model.embed_tokens.weight"]
        # Megatron: only all-reduces, as the preset Llama plans
        assert set(summary["collectives"]) == {"all_reduce"}
    else:
        # Conv1D [in, out]: column-parallel c_fc shards dim 1, row-parallel c_proj dim 0
        assert "S(1)" in placed["transformer.h.0.mlp.c_fc.weight"]
        assert "S(0)" in placed["transformer.h.0.mlp.c_proj.weight"]
        assert "S(0)" in placed["transformer.wte.weight"]


def test_four_layers_fold_one_body_per_layer_role() -> None:
    config = {**CONFIGS["llama"], "num_hidden_layers": 4}
    graph = graph_from_hf_config(config, batch=4, seq=16)
    plan = build_plan(graph, Strategy.build("tp=2", ["megatron_tp"]))
    # the same figures as the preset Llama of 4 layers: the middle layers of each pass share
    # a body, the first and last read the embedding / the loss side
    assert plan.summary()["repetition"] == {
        "layers": 4, "layer_segments": 12, "distinct_bodies": 7, "folded": 5,
    }  # fmt: skip


def test_default_seq_is_the_position_limit_up_to_2048() -> None:
    graph = graph_from_hf_config(CONFIGS["llama"])
    assert graph.type_of("input_ids").shape == (1, 64)


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({**CONFIGS["llama"], "model_type": "bert"}, "model_type"),
        ({k: v for k, v in CONFIGS["llama"].items() if k != "model_type"} | {
            "architectures": ["BertForMaskedLM"]}, "architectures"),
        ({"hidden_size": 32}, "model_type"),
        ({**CONFIGS["llama"], "architectures": ["LlamaForSequenceClassification"]},
         "architectures"),
    ],
)  # fmt: skip
def test_unsupported_architecture_names_the_field(config: dict[str, Any], field: str) -> None:
    with pytest.raises(ModelImportError) as info:
        graph_from_hf_config(config)
    assert info.value.detail["field"] == field
    assert f"'{field}'" in info.value.message


def test_seq_beyond_the_positions_names_seq() -> None:
    with pytest.raises(ModelImportError) as info:
        graph_from_hf_config(CONFIGS["gpt2"], seq=65)
    assert info.value.detail["field"] == "seq"
    assert "n_positions" in info.value.message


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_imported_models_pipeline_and_verify(family: str) -> None:
    """A pp mesh cuts the batch into micro-batches by importing the config again at the
    micro-batch size; the layers are `model.layers.N` / `transformer.h.N`, GPT-2's tied
    embedding is held by both stages and its dropouts draw the batch's masks."""
    graph = graph_from_hf_config(CONFIGS[family], batch=4, seq=16)
    options = {"pipeline": {"microbatches": 2}}
    plan = build_plan(graph, Strategy.build("pp=2,dp=2", ["dp"], options=options))
    assert plan.pipeline is not None
    assert [len(plan.pipeline.assignment.layers_of_stage(s)) for s in (0, 1)] == [1, 1]
    tied = plan.summary()["pipeline"]["tied_weights"]
    assert [t["param"] for t in tied] == (["transformer.wte.weight"] if family == "gpt2" else [])
    report = verify(graph, Strategy.build("pp=2,dp=2", ["dp"], options=options))
    assert report.ok, (report.first_divergence, report.failed()[:3])


def test_full_width_llama3_8b_imports_as_the_preset_plans_it() -> None:
    """Llama 3 8B's published config (two of its 32 layers, bf16, rope theta 500000 at
    seq 2048): the same parameters as the preset, no opaque constants (its bf16 rotary
    tables are recognised), and Megatron TP moves exactly the preset's bytes."""
    config = {"model_type": "llama", "architectures": ["LlamaForCausalLM"],
              "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
              "num_hidden_layers": 2, "num_key_value_heads": 8, "vocab_size": 128256,
              "max_position_embeddings": 8192, "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
              "tie_word_embeddings": False, "torch_dtype": "bfloat16"}  # fmt: skip
    graph = graph_from_hf_config(config, batch=2, seq=2048)
    assert graph.meta["opaque_ops"] == []
    preset = build_model("llama3-8b", {"layers": 2, "batch": 2, "seq": 2048})
    # per layer 4096 x (4096 + 2 x 1024 + 4096) + 3 x 4096 x 14336 + 2 x 4096 norms;
    # embedding and head 2 x 128256 x 4096, final norm 4096
    assert graph.num_params() == preset.num_params() == 2 * 218_112_000 + 1_050_677_248
    strategy = Strategy.build("dp=2,tp=4", templates=["dp", "megatron_tp"])
    imported = build_plan(graph, strategy, passes=False)
    reference = build_plan(preset, strategy, passes=False)
    assert imported.program.comm_bytes_per_rank() == reference.program.comm_bytes_per_rank()
    collectives = [
        sorted(op.comm.kind for op in plan.program.ops if op.comm is not None)
        for plan in (imported, reference)
    ]
    assert collectives[0] == collectives[1]
