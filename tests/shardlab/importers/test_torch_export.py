"""Importing PyTorch modules with torch.export: mapping, names, parameter counts, plans that
verify against one device, opaque fallbacks and export failures."""

from __future__ import annotations

import sys

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

from shardlab.errors import ModelImportError  # noqa: E402
from shardlab.importers.torch_export import graph_from_module  # noqa: E402
from shardlab.ir import ValueKind  # noqa: E402
from shardlab.plan import build_plan  # noqa: E402
from shardlab.runtime.verify import verify  # noqa: E402
from shardlab.strategy import Strategy  # noqa: E402
from shardlab.validate import validate_graph  # noqa: E402

HIDDEN, HEADS, FFN, VOCAB, BATCH, SEQ = 32, 4, 64, 128, 4, 8


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q_proj = nn.Linear(HIDDEN, HIDDEN)
        self.k_proj = nn.Linear(HIDDEN, HIDDEN)
        self.v_proj = nn.Linear(HIDDEN, HIDDEN)
        self.o_proj = nn.Linear(HIDDEN, HIDDEN)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(b, s, HEADS, HIDDEN // HEADS).transpose(1, 2)

        q, k, v = heads(self.q_proj(x)), heads(self.k_proj(x)), heads(self.v_proj(x))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(b, s, HIDDEN))


class Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up_proj = nn.Linear(HIDDEN, FFN)
        self.down_proj = nn.Linear(FFN, HIDDEN)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.gelu(self.up_proj(x)))


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.input_layernorm = nn.LayerNorm(HIDDEN)
        self.self_attn = Attention()
        self.post_attention_layernorm = nn.LayerNorm(HIDDEN)
        self.mlp = Mlp()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class TinyLM(nn.Module):
    """Embedding, blocks of attention (sdpa) and MLP with layer norms and residuals, a head
    and a cross-entropy loss."""

    def __init__(self, layers: int = 2, odd_op: bool = False) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(VOCAB, HIDDEN)
        self.layers = nn.ModuleList(Block() for _ in range(layers))
        self.norm = nn.LayerNorm(HIDDEN)
        self.lm_head = nn.Linear(HIDDEN, VOCAB, bias=False)
        self.odd_op = odd_op

    def forward(self, tokens: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        h = self.embed_tokens(tokens)
        if self.odd_op:  # an op without a mapping, on no parameter's path to the loss
            h = h + torch.cumsum(tokens.float(), dim=1).unsqueeze(-1)
        for layer in self.layers:
            h = layer(h)
        logits = self.lm_head(self.norm(h))
        return F.cross_entropy(logits.view(-1, VOCAB), labels.view(-1))


def _import(layers: int = 2, odd_op: bool = False) -> tuple[object, object]:
    with torch.device("meta"):
        model = TinyLM(layers, odd_op)
    ids = torch.zeros(BATCH, SEQ, dtype=torch.long, device="meta")
    return model, graph_from_module(model, (ids, ids), name="tiny")


def test_tiny_lm_maps_to_catalog_ops_with_torch_names_and_counts() -> None:
    model, graph = _import()
    validate_graph(graph)
    assert graph.num_params() == sum(p.numel() for p in model.parameters()) == 25_344
    params = {v.name: v.type.shape for v in graph.values_of_kind(ValueKind.PARAM)}
    assert params["layers.0.self_attn.q_proj.weight"] == (HIDDEN, HIDDEN)
    assert params["layers.1.mlp.up_proj.weight"] == (FFN, HIDDEN)  # torch's [out, in]
    assert params["lm_head.weight"] == (VOCAB, HIDDEN)
    assert [v.name for v in graph.values_of_kind(ValueKind.INPUT)] == ["tokens", "labels"]
    kinds = graph.ops_by_kind()
    assert kinds["scaled_dot_product_attention"] == 2
    assert kinds["layer_norm"] == 5
    assert kinds["cross_entropy"] == 1 and kinds["embedding"] == 1 and kinds["gelu"] == 2
    assert kinds["matmul"] == 2 * 6 + 1  # 6 linears per block and the head
    assert "opaque" not in kinds and graph.meta["opaque_ops"] == []
    sdpa = next(op for op in graph.ops if op.kind == "scaled_dot_product_attention")
    assert sdpa.attrs == {"causal": True}
    assert sdpa.scope == "layers.0.self_attn"
    q = graph.op("layers.0.self_attn.q_proj.linear")
    assert q.inputs == ("layers.0.input_layernorm.layer_norm", "layers.0.self_attn.q_proj.weight")
    assert q.attrs == {"transpose_b": True}
    # the loss is the op with role loss, read by autodiff
    (loss,) = graph.outputs
    assert graph.producer(loss).kind == "cross_entropy"
    assert graph.producer(loss).role.value == "loss"


@pytest.mark.parametrize(
    ("mesh", "templates"),
    [("dp=2", ["dp"]), ("tp=2", ["megatron_tp"]), ("dp=2,tp=2", ["dp", "megatron_tp"])],
)
def test_tiny_lm_plans_verify_against_one_device(mesh: str, templates: list[str]) -> None:
    _, graph = _import()
    plan = build_plan(graph, Strategy.build(mesh, templates))
    summary = plan.summary()
    assert summary["fallback_ops"] == []
    report = verify(plan)
    assert report.ok, report.failed()[:3]
    assert report.summary["compared"] >= 1 + 2 * 26  # loss, a grad and new value per param
    if "megatron_tp" in templates:
        placed = {v: str(s) for v, s in plan.completed.specs.items()}
        assert "S(0)" in placed["layers.0.self_attn.q_proj.weight"]  # column: torch's out dim
        assert "S(1)" in placed["layers.0.self_attn.o_proj.weight"]  # row: torch's in dim
        # Megatron: one all-reduce per attention and MLP block forward (and backward)
        assert summary["collectives"]["all_reduce"]["count"] >= 2 * 2


def test_unmapped_op_becomes_opaque_and_the_plan_lists_it() -> None:
    _, graph = _import(odd_op=True)
    opaque = [op for op in graph.ops if op.kind == "opaque"]
    assert [op.attrs["name"] for op in opaque] == ["aten.cumsum.default"]
    (entry,) = graph.meta["opaque_ops"]
    assert entry["aten"] == "aten.cumsum.default" and entry["op"] == opaque[0].name
    assert opaque[0].inputs == ("cast",)  # the float cast of the tokens (top level)
    assert graph.type_of(opaque[0].outputs[0]).shape == (BATCH, SEQ)  # from the export
    plan = build_plan(graph, Strategy.build("dp=2", ["dp"]))
    assert opaque[0].name in plan.summary()["fallback_ops"]


def test_four_layers_fold_like_the_presets() -> None:
    _, graph = _import(layers=4)
    plan = build_plan(graph, Strategy.build("tp=2", ["megatron_tp"]))
    rep = plan.summary()["repetition"]
    # forward, backward and optimizer segments of 4 layers: the first and last layers of a
    # pass read the embedding / loss side, the middle two share one body per role
    assert rep == {"layers": 4, "layer_segments": 12, "distinct_bodies": 7, "folded": 5}


class DataDependent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = int(torch.nonzero(x).shape[0])  # a data-dependent size
        return self.proj(x[:n]).sum()


def test_export_failure_shows_the_torch_error_and_op() -> None:
    x = torch.ones(3, 4)
    with pytest.raises(ModelImportError) as info:
        graph_from_module(DataDependent(), (x,), name="bad")
    message = info.value.message
    assert message.startswith("torch.export failed: ")
    assert "data-dependent" in message  # torch's words
    assert "torch.nonzero(x)" in message  # the op, on the module's line that stopped it
    assert info.value.detail["code"].startswith("n = int(torch.nonzero(x)")
    assert info.value.code == "import_error"


def test_importing_never_imports_torch_until_called() -> None:
    import subprocess

    code = "import shardlab, shardlab.importers, sys; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
