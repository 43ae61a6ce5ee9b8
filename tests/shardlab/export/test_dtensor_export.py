"""`shardlab.export.dtensor`: the generated module for tp, tp+sp, fsdp, dp x tp plans, the
layout rule, and the placements it refuses (no torch needed here: text only)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from shardlab.errors import ShardlabError
from shardlab.export.dtensor import DATA, FSDP, TENSOR, derive_export, render_dtensor
from shardlab.export.parameters import ExportError, parameter_layouts
from shardlab.ir import Graph, OpRole
from shardlab.mesh import Mesh
from shardlab.models import GraphBuilder, build_model
from shardlab.placement import Replicate, Shard
from shardlab.plan import Plan, build_plan
from shardlab.strategy import Strategy

TINY = {"layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "ffn": 128, "vocab": 256,
        "seq": 16, "batch": 8}  # fmt: skip


def tiny_plan(mesh: str, templates: list[str], annotations: list[str] | None = None,
              **options: object) -> Plan:  # fmt: skip
    strategy = Strategy.build(mesh, templates, annotations or [], options)
    return build_plan(build_model("llama3-8b", TINY), strategy, passes=False)


def styles(plan: Plan) -> dict[str, str]:
    return {m: s.code() for m, s in derive_export(plan).tp_plan.items()}


def test_megatron_tp_columns_rows_vocab_and_head() -> None:
    plan = tiny_plan("tp=2", ["megatron_tp"])
    got = styles(plan)
    for module in ("attn.q_proj", "attn.k_proj", "attn.v_proj", "mlp.gate_proj", "mlp.up_proj"):
        assert got[f"layers.1.{module}"] == "ColwiseParallel()"
    assert got["layers.0.attn.o_proj"] == got["layers.1.mlp.down_proj"] == "RowwiseParallel()"
    assert got["embed"] == "RowwiseParallel(input_layouts=Replicate())"
    # the plan's loss is vocab-parallel: vocab-sharded logits for torch's loss_parallel()
    assert got["lm_head"] == "ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)"
    # q, k, v (gate, up) read one replicated input: the norm hands it on as one DTensor, so
    # its gradient is all-reduced once in backward, as the plan prices it
    gathered = "PrepareModuleOutput(output_layouts=Replicate(), desired_output_layouts=" \
        "Replicate(), use_local_output=False)"  # fmt: skip
    assert got["layers.0.attn_norm"] == got["layers.1.mlp_norm"] == gathered
    assert "final_norm" not in got  # one reader: lm_head converts its input itself
    export = derive_export(plan)
    assert export.roles == {"tp": TENSOR} and export.fsdp_axis is None
    text = render_dtensor(plan)
    ast.parse(text)
    assert "parallelize_module(model, mesh[TP_AXIS], tp_plan())" in text
    assert "LOSS_PARALLEL = True" in text
    assert "fully_shard" not in text and "replicate(" not in text
    assert '"layers.0.attn.q_proj.weight": ("S(0)",),' in text  # [in, out] S(1) -> torch S(0)
    assert '"layers.0.attn.o_proj.weight": ("S(1)",),' in text


def test_sequence_parallel_norms_and_layouts() -> None:
    got = styles(tiny_plan("tp=2", ["megatron_tp", "sequence_parallel"]))
    # a norm read by several column-parallel modules gathers its output once for them; the
    # final norm gathers it for lm_head too: every gathered activation is then kept as its
    # shard for backward and gathered again there, as the plan does
    for norm in ("layers.0.attn_norm", "layers.1.mlp_norm", "final_norm"):
        assert got[norm] == "SequenceParallelGathered()"
    assert got["layers.0.attn.q_proj"] == got["layers.1.mlp.up_proj"] == "ColwiseParallel()"
    # the sequence-sharded residual stream stays a DTensor (its global shape)
    local = "use_local_output=False"
    assert got["layers.1.mlp.down_proj"] == f"RowwiseParallel(output_layouts=Shard(1), {local})"
    assert got["embed"] == (
        f"RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1), {local})"
    )
    assert got["lm_head"] == "ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)"
    text = render_dtensor(tiny_plan("tp=2", ["megatron_tp", "sequence_parallel"]))
    assert "keep_shards_for_backward(model)" in text


def test_fsdp_units_and_shard_dims_follow_the_plan() -> None:
    plan = tiny_plan("dp=2", ["fsdp"])
    export = derive_export(plan)
    assert export.roles == {"dp": FSDP} and export.tp_plan == {}
    assert export.fsdp_units == ["layers.0", "layers.1"]
    # the template shards each parameter on its first dim: [in, out] -> torch dim 1
    assert export.fsdp_dims["layers.0.attn.q_proj.weight"] == 1
    assert export.fsdp_dims["embed.weight"] == 0
    assert export.fsdp_dims["final_norm.weight"] == 0
    assert len(export.fsdp_dims) == len(parameter_layouts(plan))
    text = render_dtensor(plan)
    ast.parse(text)
    assert export.fsdp_tail == ["final_norm", "lm_head"]  # gathered again for backward
    # AdamW: float32 masters, gradients reduced in float32 (autodiff); SGD: all bfloat16
    assert (export.param_dtype, export.reduce_dtype) == ("bfloat16", "float32")
    sgd = build_plan(build_model("llama3-8b", TINY), Strategy.build("dp=2", ["fsdp"]),
                     optimizer="sgd", passes=False)  # fmt: skip
    assert derive_export(sgd).reduce_dtype == "bfloat16"
    assert "model.get_submodule(unit), mesh=dp_mesh, shard_placement_fn=placement, mp_policy=mp" \
        in text  # fmt: skip
    assert "mp = MixedPrecisionPolicy(param_dtype=PARAM_DTYPE, reduce_dtype=REDUCE_DTYPE)" in text
    assert "PARAM_DTYPE = torch.bfloat16\nREDUCE_DTYPE = torch.float32" in text
    assert '"layers.1.mlp.down_proj.weight": 1,' in text


def test_dp_by_tp_replicates_on_the_data_axis() -> None:
    plan = tiny_plan("dp=2,tp=2", ["dp", "megatron_tp"])
    export = derive_export(plan)
    assert export.roles == {"dp": DATA, "tp": TENSOR} and export.data_axes == ["dp"]
    text = render_dtensor(plan)
    assert "replicate(model, mesh=mesh[DATA_AXES[0]], mp_policy=mp)" in text
    assert 'MESH_SHAPE = (2, 2)\nMESH_AXES = ("dp", "tp")' in text
    assert '"layers.0.attn.q_proj.weight": ("R", "S(0)"),' in text
    # HSDP: a data axis beside an FSDP axis shards on both as one mesh
    hsdp = render_dtensor(tiny_plan("r=2,dp=2", ["dp:r", "fsdp:dp"]))
    assert "dp_mesh = mesh[(*DATA_AXES, FSDP_AXIS)]" in hsdp


def test_zero1_is_exported_as_data_parallelism_with_a_note() -> None:
    plan = tiny_plan("dp=2", ["dp", "zero1"])
    export = derive_export(plan)
    assert export.roles == {"dp": DATA}
    assert any("zero1" in n and "no exact DTensor form" in n for n in export.notes)
    assert "no exact DTensor form" in render_dtensor(plan)


def test_recompute_full_wraps_the_layers_and_pipeline_stages_are_listed() -> None:
    text = render_dtensor(tiny_plan("dp=2", ["fsdp"], recompute="full"))
    assert "checkpoint_wrapper(owner.get_submodule(child))" in text
    piped = tiny_plan("pp=2,tp=2", ["megatron_tp"], pipeline={"schedule": "1f1b"})
    export = derive_export(piped)
    assert export.pipeline_stages == {0: ["layers.0"], 1: ["layers.1"]}
    assert "PIPELINE_STAGES = {\n    0: [\"layers.0\"],\n    1: [\"layers.1\"],\n}" in \
        render_dtensor(piped)  # fmt: skip


def test_refusals_name_the_parameter_axis_and_placement() -> None:
    with pytest.raises(ExportError, match=r"'layers\.0\.mlp\.up_proj\.weight' is placed P\(sum\)"):
        derive_export(tiny_plan("tp=2", ["megatron_tp"], ["layers.0.mlp.up_proj.weight=tp:P(sum)"]))
    with pytest.raises(
        ExportError, match=r"'final_norm\.weight' is placed S\(0\) on mesh axis 'tp'"
    ):
        derive_export(tiny_plan("tp=2", ["megatron_tp"], ["final_norm.weight=tp:S(0)"]))
    with pytest.raises(ExportError, match="mixes tensor parallelism"):  # q_proj pinned, rest fsdp
        derive_export(tiny_plan("tp=2", ["fsdp:tp"], ["layers.0.attn.q_proj.weight=tp:S(1)"]))
    with pytest.raises(ExportError, match="both tensor-parallel"):
        derive_export(tiny_plan("a=2,b=2", ["megatron_tp:a", "megatron_tp:b"]))
    assert issubclass(ExportError, ShardlabError)


#: a tiny Hugging Face Llama (grouped-query: 4 heads, 2 kv heads), imported from its config
HF_LLAMA = {"model_type": "llama", "hidden_size": 32, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 64,
            "vocab_size": 128, "max_position_embeddings": 64}  # fmt: skip


def hf_plan(mesh: str, templates: list[str]) -> Plan:
    pytest.importorskip("transformers")
    from shardlab.importers.hf_config import graph_from_hf_config

    graph = graph_from_hf_config(HF_LLAMA, batch=4, seq=16)
    return build_plan(graph, Strategy.build(mesh, templates), passes=False)


def test_hf_llama_names_take_the_styles_of_their_placements() -> None:
    got = styles(hf_plan("tp=2", ["megatron_tp", "sequence_parallel"]))
    local = "use_local_output=False"
    for norm in ("model.layers.0.input_layernorm", "model.layers.1.post_attention_layernorm",
                 "model.norm"):  # fmt: skip
        assert got[norm] == "SequenceParallelGathered()"
    for proj in ("q_proj", "k_proj", "v_proj"):  # 2 kv heads: one per rank
        assert got[f"model.layers.1.self_attn.{proj}"] == "ColwiseParallel()"
    assert got["model.layers.0.self_attn.o_proj"] == (
        f"RowwiseParallel(output_layouts=Shard(1), {local})"
    )
    # the embedding's output keeps its global shape: Hugging Face numbers the rotary
    # positions from it
    assert got["model.embed_tokens"] == (
        f"RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1), {local})"
    )
    assert got["lm_head"] == "ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)"
    assert "model.rotary_emb" not in got and len(got) == 2 * 9 + 3
    plain = styles(hf_plan("tp=2", ["megatron_tp"]))
    assert plain["model.layers.0.mlp.down_proj"] == "RowwiseParallel()"
    assert "model.norm" not in plain


def test_replicated_kv_heads_under_split_query_heads_are_refused() -> None:
    # 2 kv heads over 4 ranks: megatron_tp keeps k/v replicated, which no DTensor style gives
    with pytest.raises(ExportError, match=r"'model\.layers\.0\.self_attn\.k_proj\.weight' "
                       r"\(its keys and values\) replicated.*2 kv heads do not divide over 4 "
                       "ranks") as caught:  # fmt: skip
        derive_export(hf_plan("tp=4", ["megatron_tp"]))
    assert caught.value.detail["axis"] == "tp"
    assert caught.value.detail["op"] == "model.layers.0.self_attn.sdpa"
    with pytest.raises(ExportError, match=r"query heads on mesh axis 'tp'.*'layers\.0\.attn\.k"):
        derive_export(tiny_plan("tp=4", ["megatron_tp"]))


#: a tiny GPT-2 (Conv1D projections, fused c_attn, lm_head tied to the token embedding)
HF_GPT2 = {"model_type": "gpt2", "n_embd": 32, "n_layer": 2, "n_head": 4, "vocab_size": 128,
           "n_positions": 64, "bos_token_id": 0, "eos_token_id": 0}  # fmt: skip
#: megatron_tp with the attention kept replicated (its fused c_attn cannot be split)
GPT2_ATTN_REPLICATED = ["transformer.h.*.attn.c_attn.*=tp:R",
                        "transformer.h.*.attn.c_proj.weight=tp:R"]  # fmt: skip


def gpt2_plan(templates: list[str], annotations: list[str]) -> Plan:
    pytest.importorskip("transformers")
    from shardlab.importers.hf_config import graph_from_hf_config

    graph = graph_from_hf_config(HF_GPT2, batch=4, seq=16)
    return build_plan(graph, Strategy.build("tp=2", templates, annotations), passes=False)


def test_gpt2_conv1d_styles_and_the_tied_lm_head() -> None:
    plan = gpt2_plan(["megatron_tp"], GPT2_ATTN_REPLICATED)
    export = derive_export(plan)
    fc = next(p for p in export.params if p.name == "transformer.h.0.mlp.c_fc.weight")
    assert (fc.kind, fc.transposed, fc.torch_placement("tp")) == ("conv1d", False, Shard(1))
    got = styles(plan)
    assert got["transformer.h.1.mlp.c_fc"] == "Conv1DColwiseParallel()"  # weight [in, out]
    assert got["transformer.h.1.mlp.c_proj"] == "Conv1DRowwiseParallel()"
    assert got["transformer.wte"] == "RowwiseParallel(input_layouts=Replicate())"
    # the tied lm_head reads the vocab-sharded table as nn.Linear's [vocab, hidden]
    assert got["lm_head"] == "ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)"
    assert export.tied == {"lm_head.weight": "transformer.wte.weight"}
    assert "transformer.h.0.attn.c_attn" not in got
    text = render_dtensor(plan)
    ast.parse(text)
    assert "class Conv1DColwiseParallel(ColwiseParallel):" in text
    assert '    "lm_head.weight": "transformer.wte.weight",' in text
    assert "model.get_submodule(owner).register_parameter(attr, model.get_parameter(source))" \
        in text  # fmt: skip
    assert "Conv1D" not in render_dtensor(tiny_plan("tp=2", ["megatron_tp"]))


def test_gpt2_fused_c_attn_split_by_columns_is_refused() -> None:
    with pytest.raises(
        ExportError,
        match=r"'transformer\.h\.0\.attn\.c_attn\.weight' is "
        r"placed S\(1\) on mesh axis 'tp': .*fused projection .*split",
    ) as caught:
        derive_export(gpt2_plan(["megatron_tp"], []))
    assert caught.value.detail["op"] == "transformer.h.0.attn.split"
    # c_attn replicated, the heads split after it (a local slice): refused, naming c_attn
    mlp_only = ["transformer.h.*.mlp.c_fc.weight=tp:S(1)", "transformer.h.*.mlp.c_fc.bias=tp:S(0)",
                "transformer.h.*.mlp.c_proj.weight=tp:S(0)"]  # fmt: skip
    with pytest.raises(ExportError, match=r"keeps 'transformer\.h\.\d\.attn\.c_attn\.weight'.*"
                       r"shard the projection's columns"):  # fmt: skip
        derive_export(gpt2_plan([], mlp_only))


def _torch_layout_graph(conv1d: bool = False) -> Graph:
    """A linear written as torch's (w [out, in], matmul with transpose_b), as importers do;
    `conv1d`: Hugging Face's Conv1D instead (w [in, out] read by `linear`), imported."""
    b = GraphBuilder("torchish", meta={"importer": "torch.export"} if conv1d else None)
    x = b.input("x", (4, 8))
    labels = b.input("labels", (4,), "int64")
    with b.scope("proj"):
        if conv1d:
            w = b.param("weight", (8, 16), "float32")
            y = b.op("linear", [x, w])
        else:
            w = b.param("weight", (16, 8), "float32")
            y = b.op("matmul", [x, w], attrs={"transpose_b": True})
    with b.scope("loss"):
        loss = b.op("cross_entropy", [y, labels], role=OpRole.LOSS)
    return b.build([loss])


def test_layout_rule_reads_the_op_that_reads_the_weight() -> None:
    plan = build_plan(_torch_layout_graph(), Strategy.build("tp=2", [], ["proj.weight=tp:S(0)"]),
                      passes=False)  # fmt: skip
    (w,) = parameter_layouts(plan)
    assert (w.kind, w.transposed, w.torch_shape) == ("linear", False, (16, 8))
    assert w.torch_placement("tp") == Shard(0)  # already torch's: no flip
    assert derive_export(plan).tp_plan["proj"].cls == "ColwiseParallel"
    preset = parameter_layouts(tiny_plan("tp=2", ["megatron_tp"]))
    q = next(p for p in preset if p.name == "layers.0.attn.q_proj.weight")
    assert q.transposed and q.placements["tp"] == Shard(1) and q.torch_placement("tp") == Shard(0)
    norm = next(p for p in preset if p.name == "final_norm.weight")
    assert not norm.transposed and norm.torch_placement("tp") == Replicate()
    conv1d = Strategy.build("tp=2", [], ["proj.weight=tp:S(1)"])
    imported = build_plan(_torch_layout_graph(conv1d=True), conv1d, passes=False)
    (conv,) = parameter_layouts(imported)
    assert not conv.transposed and conv.torch_placement("tp") == Shard(1)  # stored [in, out]


def test_generated_modules_are_ruff_clean(tmp_path: Path) -> None:
    pytest.importorskip("ruff")
    plans = {
        "tp_sp": tiny_plan("tp=2", ["megatron_tp", "sequence_parallel"]),
        "fsdp_full": tiny_plan("dp=2", ["fsdp"], recompute="full"),
        "hsdp_tp": tiny_plan("r=2,dp=2,tp=2", ["dp:r", "fsdp:dp", "megatron_tp"]),
        "pp": tiny_plan("pp=2,tp=2", ["megatron_tp"], pipeline={"schedule": "1f1b"}),
        "hf_sp": hf_plan("tp=2", ["megatron_tp", "sequence_parallel"]),
        "gpt2": gpt2_plan(["megatron_tp"], GPT2_ATTN_REPLICATED),
        "ranks": build_plan(
            build_model("llama3-8b", TINY),
            Strategy.build(Mesh((2, 2), ("dp", "tp"), (0, 2, 1, 3)), ["dp", "megatron_tp"]),
            passes=False,
        ),
    }
    paths = []
    for name, plan in plans.items():
        path = tmp_path / f"{name}.py"
        path.write_text(render_dtensor(plan))
        paths.append(str(path))
    rules = ["--select", "E,F,W,I,B,UP", "--line-length", "100", "--target-version", "py311"]
    lint = [sys.executable, "-m", "ruff", "check", "--isolated", "--no-cache", *rules]
    checked = subprocess.run([*lint, *paths], capture_output=True, text=True, check=False)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    fmt = [sys.executable, "-m", "ruff", "format", "--isolated", "--no-cache", "--check",
           "--line-length", "100", *paths]  # fmt: skip
    formatted = subprocess.run(fmt, capture_output=True, text=True, check=False)
    assert formatted.returncode == 0, formatted.stdout + formatted.stderr


def test_a_plain_module_output_into_the_sequence_sharded_stream_is_refused() -> None:
    """GPT-2 with sequence parallelism and its attention kept replicated: the position table
    (transformer.wpe, no style, a plain tensor in torch) and the attention's c_proj are added
    to the sequence-sharded residual stream (a DTensor), which torch refuses at run time; the
    export refuses it first, naming the first such module."""
    plan = gpt2_plan(["megatron_tp", "sequence_parallel"], GPT2_ATTN_REPLICATED)
    with pytest.raises(ExportError, match=r"takes no DTensor style, so its output is a plain "
                       r"tensor, but op .* combines it") as caught:  # fmt: skip
        derive_export(plan)
    assert caught.value.detail["axis"] == "tp"
    assert caught.value.detail["value"] == "transformer.wpe.weight"
    assert "transformer.wpe" in caught.value.message
    # the same plan without sequence parallelism keeps the stream replicated: exported
    assert derive_export(gpt2_plan(["megatron_tp"], GPT2_ATTN_REPLICATED)).tp_plan
