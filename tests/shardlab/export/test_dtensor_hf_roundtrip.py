"""Bring your own model and take the plan back to PyTorch: a real `transformers` model's
config is imported (`graph_from_hf_config`), planned, exported as a DTensor module, and that
module applied on gloo ranks to the `transformers` model itself. Every parameter's DTensor
placements equal the plan's (imported graphs are already in torch's layout) and one SGD step
(logits from `model(input_ids).logits`, next-token cross entropy) matches a single-process
step of the same model.

The models: a grouped-query Llama (tp, tp + sequence parallelism, FSDP, dp x tp) and GPT-2
(Conv1D, tied lm_head; tp). The rank job and the comparison live in `dtensor_ranks.py`
(model "hf").
"""

from __future__ import annotations

import pytest

from shardlab.plan import build_plan
from shardlab.strategy import Strategy

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed")
pytest.importorskip("transformers")

from shardlab.importers.hf_config import graph_from_hf_config  # noqa: E402
from tests.shardlab.export.dtensor_ranks import HfCase, round_trip  # noqa: E402

#: grouped-query attention (4 heads, 2 kv heads), untied embeddings (Llama's default)
LLAMA = {"model_type": "llama", "hidden_size": 32, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 64,
         "vocab_size": 128, "max_position_embeddings": 64}  # fmt: skip
BATCH, SEQ = 4, 16
#: Conv1D projections (weight [in, out]), a fused c_attn, lm_head tied to the token embedding;
#: no dropout, so that the ranks and the reference draw nothing at random
GPT2 = {"model_type": "gpt2", "n_embd": 32, "n_layer": 2, "n_head": 4, "vocab_size": 128,
        "n_positions": 64, "bos_token_id": 0, "eos_token_id": 0, "resid_pdrop": 0.0,
        "embd_pdrop": 0.0, "attn_pdrop": 0.0}  # fmt: skip
#: (mesh, templates)
CASES = [
    ("tp=2", ["megatron_tp"]),
    ("tp=2", ["megatron_tp", "sequence_parallel"]),
    ("dp=2", ["fsdp"]),
    ("dp=2,tp=2", ["dp", "megatron_tp"]),
]


@pytest.fixture(scope="module")
def llama_graph():  # type: ignore[no-untyped-def]
    return graph_from_hf_config(LLAMA, batch=BATCH, seq=SEQ)


@pytest.mark.parametrize(("mesh", "templates"), CASES,
                         ids=[f"{m}:{'+'.join(t)}" for m, t in CASES])  # fmt: skip
def test_hf_llama_takes_the_plan_back_to_pytorch(
    llama_graph: object, mesh: str, templates: list[str]
) -> None:
    plan = build_plan(llama_graph, Strategy.build(mesh, templates), optimizer="sgd", lr=0.5,
                      passes=False)  # fmt: skip
    assert plan.model.meta["importer"]
    round_trip(plan, "hf", HfCase(LLAMA, BATCH, SEQ), "sgd", 0.5)


def test_hf_gpt2_conv1d_and_tied_lm_head_take_the_plan_back_to_pytorch() -> None:
    """megatron_tp with the attention kept replicated (a column shard of the fused c_attn has
    no DTensor form: test_dtensor_export checks the refusal): the MLP's Conv1Ds through the
    generated module's Conv1D styles, the vocab-sharded wte and the lm_head tied to it."""
    graph = graph_from_hf_config(GPT2, batch=BATCH, seq=SEQ)
    keep = ["transformer.h.*.attn.c_attn.*=tp:R", "transformer.h.*.attn.c_proj.weight=tp:R"]
    plan = build_plan(graph, Strategy.build("tp=2", ["megatron_tp"], keep), optimizer="sgd",
                      lr=0.5, passes=False)  # fmt: skip
    round_trip(plan, "hf", HfCase(GPT2, BATCH, SEQ), "sgd", 0.5)
