"""The models the DTensor round trips apply exported modules to, and the rank job doing it
(tests of `shardlab.export.dtensor`).

What it is for: the round-trip tests spawn gloo ranks (`runtime.torch_launch.spawn`) that
each build one model with the same seed, exec the generated module, call its
`parallelize`, report every parameter's DTensor placements and take one training step,
whose updated parameters the test compares with a single-process step. `common["model"]`
names the model (`MODELS`): "tiny" (below, default), or a real `transformers` model
"hf" (a `HfCase`: the config dict `graph_from_hf_config` imports, built on the CPU).
`round_trip` is the test side: spawn the ranks, compare with the plan and the reference.

The model mirrors `shardlab.models.transformer` (llama family): `embed`, `layers.{i}` with
`attn_norm`, `attn.{q,k,v,o}_proj`, `mlp_norm`, `mlp.{gate,up,down}_proj`, then
`final_norm` and `lm_head`; nn.Linear weights are [out, in] (torch's layout). Attention
infers its local head count from the projection's width (`view(b, s, -1, head_dim)`), as
tensor parallelism needs.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

WRAPPED = "._checkpoint_wrapped_module"


@dataclass(frozen=True)
class TinyConfig:
    layers: int = 2
    hidden: int = 64
    heads: int = 4
    kv_heads: int = 2
    ffn: int = 128
    vocab: int = 256
    seq: int = 16
    batch: int = 8

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


def _rope(x: torch.Tensor, theta: float = 10000.0) -> torch.Tensor:
    """Rotary embedding of x [b, s, n, d] (halves rotated)."""
    s, d = x.shape[1], x.shape[-1]
    freqs = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
    angles = torch.outer(torch.arange(s, dtype=torch.float32), freqs)
    cos = torch.cat([angles.cos(), angles.cos()], -1)[None, :, None, :].to(x.dtype)
    sin = torch.cat([angles.sin(), angles.sin()], -1)[None, :, None, :].to(x.dtype)
    a, b = x[..., : d // 2], x[..., d // 2 :]
    return x * cos + torch.cat([-b, a], -1) * sin


class Attention(nn.Module):
    def __init__(self, cfg: TinyConfig) -> None:
        super().__init__()
        hd = cfg.head_dim
        self.head_dim = hd
        self.q_proj = nn.Linear(cfg.hidden, cfg.heads * hd, bias=False)
        self.k_proj = nn.Linear(cfg.hidden, cfg.kv_heads * hd, bias=False)
        self.v_proj = nn.Linear(cfg.hidden, cfg.kv_heads * hd, bias=False)
        self.o_proj = nn.Linear(cfg.heads * hd, cfg.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, hd = x.shape[0], x.shape[1], self.head_dim
        q = _rope(self.q_proj(x).view(b, s, -1, hd))
        k = _rope(self.k_proj(x).view(b, s, -1, hd))
        v = self.v_proj(x).view(b, s, -1, hd)
        group = q.shape[2] // k.shape[2]
        k, v = k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        return self.o_proj(out.transpose(1, 2).reshape(b, s, -1))


class Mlp(nn.Module):
    def __init__(self, cfg: TinyConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden, cfg.ffn, bias=False)
        self.up_proj = nn.Linear(cfg.hidden, cfg.ffn, bias=False)
        self.down_proj = nn.Linear(cfg.ffn, cfg.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, cfg: TinyConfig) -> None:
        super().__init__()
        self.attn_norm = nn.RMSNorm(cfg.hidden, eps=1e-5)
        self.attn = Attention(cfg)
        self.mlp_norm = nn.RMSNorm(cfg.hidden, eps=1e-5)
        self.mlp = Mlp(cfg)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        h = h + self.attn(self.attn_norm(h))
        return h + self.mlp(self.mlp_norm(h))


class TinyLlama(nn.Module):
    def __init__(self, cfg: TinyConfig) -> None:
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab, cfg.hidden)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.final_norm = nn.RMSNorm(cfg.hidden, eps=1e-5)
        self.lm_head = nn.Linear(cfg.hidden, cfg.vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens)
        for layer in self.layers:
            h = layer(h)
        return self.lm_head(self.final_norm(h))


def batch(cfg: TinyConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch every rank and the reference draw (tokens, labels)."""
    g = torch.Generator().manual_seed(1234)
    tokens = torch.randint(0, cfg.vocab, (cfg.batch, cfg.seq), generator=g)
    labels = torch.randint(0, cfg.vocab, (cfg.batch, cfg.seq), generator=g)
    return tokens, labels


def build(cfg: TinyConfig) -> TinyLlama:
    torch.manual_seed(0)
    model = TinyLlama(cfg)
    with torch.no_grad():  # larger-than-default norm weights, so their gradients matter
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    return model


@dataclass(frozen=True)
class HfCase:
    """A tiny real `transformers` causal LM: the config dict the importer reads, and the batch."""

    config: dict[str, Any] = field(default_factory=dict)
    batch: int = 4
    seq: int = 16


def build_hf(case: HfCase) -> nn.Module:
    """The model `case.config` describes, on the CPU, seeded (every rank the same weights),
    built as `importers.hf_config` builds it (sdpa attention, no cache, training mode)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = {k: v for k, v in case.config.items() if k not in ("model_type", "architectures")}
    config = AutoConfig.for_model(case.config["model_type"], **fields, use_cache=False)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    with torch.no_grad():  # norm weights away from 1, so their gradients matter
        for module in model.modules():
            weight = getattr(module, "weight", None)
            if "norm" in type(module).__name__.lower() and weight is not None:
                weight.uniform_(0.5, 1.5)
    return model.train()


def hf_batch(case: HfCase) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens and their next-token labels (`importers.hf_config`: `labels` holds each
    position's next token; the loss covers every position): one stream of seq + 1 tokens."""
    g = torch.Generator().manual_seed(1234)
    stream = torch.randint(0, case.config["vocab_size"], (case.batch, case.seq + 1), generator=g)
    return stream[:, :-1].contiguous(), stream[:, 1:].contiguous()


@dataclass(frozen=True)
class Workload:
    """How to build a named model, run it to logits, and draw its global batch."""

    build: Callable[[Any], nn.Module]
    logits: Callable[[nn.Module, torch.Tensor], torch.Tensor]
    batch: Callable[[Any], tuple[torch.Tensor, torch.Tensor]]


MODELS = {
    "tiny": Workload(build, lambda m, tokens: m(tokens), batch),
    "hf": Workload(build_hf, lambda m, tokens: m(input_ids=tokens).logits, hf_batch),
}


def step(model: nn.Module, tokens: torch.Tensor, labels: torch.Tensor, opt: str, lr: float,
         kind: str = "tiny", vocab_parallel: bool = False,
         phase: Callable[[str], None] | None = None) -> float:  # fmt: skip
    """One training step: mean cross-entropy, backward, the plan's optimizer.
    `vocab_parallel`: the logits are a vocab-sharded DTensor (the export's LOSS_PARALLEL),
    the loss and its backward run inside torch's `loss_parallel()`. `phase` hears "forward",
    "loss", "backward" and "optimizer" as each begins (the collective counts)."""
    from contextlib import nullcontext

    from torch.distributed.tensor.parallel import loss_parallel

    mark = phase or (lambda name: None)
    params = list(model.parameters())
    optimizer = (
        torch.optim.AdamW(params, lr=lr) if opt == "adamw" else torch.optim.SGD(params, lr=lr)
    )
    mark("forward")
    logits = MODELS[kind].logits(model, tokens)
    with loss_parallel() if vocab_parallel else nullcontext():
        mark("loss")
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))
        mark("backward")
        loss.backward()
    mark("optimizer")
    optimizer.step()
    value = loss.full_tensor() if hasattr(loss, "full_tensor") else loss
    return float(value.detach())


def reference(cfg: Any, opt: str, lr: float, kind: str = "tiny") -> tuple[float, dict[str, Any]]:
    """The single-process step: its loss and every updated parameter."""
    work = MODELS[kind]
    model = work.build(cfg)
    loss = step(model, *work.batch(cfg), opt, lr, kind)
    return loss, {n: p.detach().numpy().copy() for n, p in model.named_parameters()}


def _placement_text(p: Any) -> str:
    from torch.distributed.tensor import Replicate

    if isinstance(p, Replicate):
        return "R"
    dim = getattr(p, "dim", None)  # Shard, and FSDP's _StridedShard under tensor parallelism
    return f"S({dim})" if isinstance(dim, int) else str(p)


def rank_job(proc: int, common: dict[str, Any], mine: Any) -> dict[str, Any]:
    """Apply the generated module to the model on this rank; its placements and its step.

    `common`: source (the generated module), model (a `MODELS` name; "tiny" when absent),
    cfg (its config), optimizer, lr, batch_axes (the mesh axes that split the batch, in mesh
    order)."""
    from torch.distributed.tensor import DTensor

    kind = common.get("model", "tiny")
    work, cfg = MODELS[kind], common["cfg"]
    module = types.ModuleType("shardlab_export_under_test")
    exec(compile(common["source"], "<export>", "exec"), module.__dict__)
    mesh = module.build_mesh("cpu")
    # the numerics are compared with one float32 process: no bf16 mixed precision here
    model = module.parallelize(work.build(cfg), mesh, "cpu", mixed_precision=False)
    placements: dict[str, dict[str, str]] = {}
    for name, p in model.named_parameters():
        name = name.replace(WRAPPED, "")
        if isinstance(p, DTensor):
            names = p.device_mesh.mesh_dim_names or ()
            placements[name] = {
                a: _placement_text(x) for a, x in zip(names, p.placements, strict=True)
            }
        else:
            placements[name] = {}
    tokens, labels = work.batch(cfg)
    index, count, rows_total = 0, 1, tokens.shape[0]
    for axis in common["batch_axes"]:
        size = mesh[axis].size()
        index, count = index * size + mesh[axis].get_local_rank(), count * size
    rows = slice(index * rows_total // count, (index + 1) * rows_total // count)
    vocab_parallel = getattr(module, "LOSS_PARALLEL", False)
    loss = step(model, tokens[rows], labels[rows], common["optimizer"], common["lr"], kind,
                vocab_parallel)  # fmt: skip
    full = {}
    for name, p in model.named_parameters():
        value = p.full_tensor() if isinstance(p, DTensor) else p
        full[name.replace(WRAPPED, "")] = value.detach().numpy().copy()
    return {"placements": placements, "loss": loss, "params": full if proc == 0 else None}


def _expected(plan: Any) -> dict[str, dict[str, str]]:
    """Every parameter's placement per mesh axis in torch's layout, as the plan says."""
    from shardlab.export.parameters import parameter_layouts
    from shardlab.placement import Shard

    return {
        p.name: {
            axis: (f"S({x.dim})" if isinstance(x, Shard) else "R")
            for axis, x in p.torch_placements().items()
        }
        for p in parameter_layouts(plan)
    }


def round_trip(plan: Any, kind: str, cfg: Any, optimizer: str, lr: float) -> None:
    """Apply `plan`'s generated module to model `kind` on one gloo rank per device; assert
    every parameter's DTensor placements are the plan's and one step matches the reference."""
    import numpy as np
    import pytest

    from shardlab.export.dtensor import derive_export, render_dtensor
    from shardlab.runtime.torch_launch import spawn

    export = derive_export(plan)
    batch_axes = [a for a in export.mesh_axes if a in export.data_axes or a == export.fsdp_axis]
    common = {"source": render_dtensor(plan), "model": kind, "cfg": cfg,
              "optimizer": optimizer, "lr": lr, "batch_axes": batch_axes}  # fmt: skip
    ranks = spawn(rank_job, common, [None] * plan.strategy.mesh.size, timeout_s=120)

    want = _expected(plan)
    for rank, result in enumerate(ranks):
        got = result["placements"]
        assert set(got) == set(want), f"rank {rank}: parameters differ"
        for name, axes in want.items():
            have = {axis: got[name].get(axis, "R") for axis in axes}  # not on its mesh: R
            assert have == axes, f"rank {rank}, {name}: DTensor {got[name]}, plan {axes}"
            assert set(got[name]) <= set(axes), f"{name} on axes the plan lacks: {got[name]}"
    assert any(any(p != "R" for p in axes.values()) for axes in want.values())

    loss, params = reference(cfg, optimizer, lr, kind)
    mean_loss = sum(r["loss"] for r in ranks) / len(ranks)  # equal batch shards: the mean
    assert mean_loss == pytest.approx(loss, rel=1e-5)
    stepped = ranks[0]["params"]
    assert set(stepped) == set(params)
    # SGD: the update is lr x the gradient (tight); AdamW's first step is lr x about sign(g),
    # so an element whose gradient is near zero may move by a fraction of lr
    atol = 1e-5 if optimizer == "sgd" else 1e-4
    for name, value in params.items():
        np.testing.assert_allclose(stepped[name], value, rtol=1e-4, atol=atol, err_msg=name)
    initial = {n: p.detach().numpy() for n, p in MODELS[kind].build(cfg).named_parameters()}
    moved = {n: float(np.abs(params[n] - initial[n]).max()) for n in params}
    still = {n: m for n, m in moved.items() if m <= 10 * atol}
    assert not still, f"the step moved these parameters within 10 x the tolerance: {still}"


#: torch's collective ops (`torch.ops` namespace::name) -> the plan's kind
COLLECTIVE_OPS = {
    "_c10d_functional::all_gather_into_tensor": "all_gather",
    "_c10d_functional::reduce_scatter_tensor": "reduce_scatter",
    "_c10d_functional::all_reduce": "all_reduce",
    "_c10d_functional::all_to_all_single": "all_to_all",
    "c10d::_allgather_base_": "all_gather",
    "c10d::allgather_": "all_gather",
    "c10d::_reduce_scatter_base_": "reduce_scatter",
    "c10d::reduce_scatter_": "reduce_scatter",
    "c10d::allreduce_": "all_reduce",
    "c10d::alltoall_base_": "all_to_all",
}


def _counting_mode(axes_of: dict[str, str], calls: list[dict[str, Any]], phase: list[str]) -> Any:
    """A dispatch mode that records every collective torch issues: DTensor's (functional
    collectives, `_c10d_functional`) and FSDP2's and DDP's (c10d, `c10d::*`). It lets
    DTensor dispatch first (NotImplemented for DTensor arguments), so the collectives
    DTensor issues inside an op (a redistribution for the optimizer's add) reach it too."""
    from torch.distributed.distributed_c10d import _resolve_process_group
    from torch.distributed.tensor import DTensor
    from torch.utils._python_dispatch import TorchDispatchMode

    def tensors(x: Any) -> list[torch.Tensor]:
        if isinstance(x, torch.Tensor):
            return [x]
        if isinstance(x, (list, tuple)):
            return [t for y in x for t in tensors(y)]
        return []

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types_: Any, args: Any = (),
                               kwargs: Any = None) -> Any:  # fmt: skip
            if any(issubclass(t, DTensor) for t in types_):
                return NotImplemented
            name = f"{func.namespace}::{func._schema.name.split('::')[-1]}"
            kind = COLLECTIVE_OPS.get(name)
            if kind is not None:
                group = next((a for a in reversed(args) if isinstance(a, str)), None)
                if group is None:  # c10d: the process group object
                    boxed = next(a for a in args if isinstance(a, torch.ScriptObject))
                    group = torch.distributed.ProcessGroup.unbox(boxed).group_name
                size = _resolve_process_group(group).size()
                moved = sum(t.numel() * t.element_size() for t in tensors(args[:1]))
                if name.startswith("c10d::") and kind != "all_reduce":
                    # c10d's (output, input): the plan's block is the input for a
                    # reduce-scatter, the gathered output for an all-gather
                    inp = tensors(args[1:2])
                    moved = sum(t.numel() * t.element_size() for t in inp) * (
                        size if kind == "all_gather" else 1
                    )
                elif kind == "all_gather":
                    moved *= size
                calls.append({"kind": kind, "axis": axes_of.get(group, "?"), "size": size,
                              "bytes": moved, "phase": phase[0]})  # fmt: skip
            return func(*args, **(kwargs or {}))

    return Count()


def count_job(proc: int, common: dict[str, Any], mine: Any) -> list[dict[str, Any]]:
    """Apply the generated module and record every collective of one training step (SGD):
    kind, mesh axis, group size, the tensor bytes of the plan's block (an all-gather's
    output, a reduce-scatter's or all-reduce's input) and the phase. `common`: source, cfg,
    batch_axes, bf16 (run a model held in bfloat16, as the plan's; else float32 masters
    with the module's mixed precision)."""
    module = types.ModuleType("shardlab_export_under_test")
    exec(compile(common["source"], "<export>", "exec"), module.__dict__)
    mesh = module.build_mesh("cpu")
    cfg = common["cfg"]
    model = build(cfg)
    if common["bf16"]:
        model = model.to(torch.bfloat16)
    model = module.parallelize(model, mesh, "cpu")
    axes_of = {}
    for axis in mesh.mesh_dim_names or ():
        axes_of[mesh[axis].get_group().group_name] = axis
    if len(common["batch_axes"]) > 1:
        flat = mesh[tuple(common["batch_axes"])]
        for axis in common["batch_axes"]:
            axes_of.setdefault(flat[axis].get_group().group_name, axis)
    tokens, labels = batch(cfg)
    index, count = 0, 1
    for axis in common["batch_axes"]:
        size = mesh[axis].size()
        index, count = index * size + mesh[axis].get_local_rank(), count * size
    rows = slice(index * tokens.shape[0] // count, (index + 1) * tokens.shape[0] // count)
    calls: list[dict[str, Any]] = []
    phase = ["forward"]

    def mark(name: str) -> None:
        phase[0] = name

    with _counting_mode(axes_of, calls, phase):
        step(model, tokens[rows], labels[rows], "sgd", 0.1, "tiny",
             getattr(module, "LOSS_PARALLEL", False), mark)  # fmt: skip
    return calls
