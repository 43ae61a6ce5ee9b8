"""A small Llama-like torch model with the preset's FQNs, and the rank job that applies an
exported DTensor module to it (tests of `shardlab.export.dtensor`).

What it is for: the round-trip test spawns gloo ranks (`runtime.torch_launch.spawn`) that
each build this model with the same seed, exec the generated module, call its
`parallelize`, report every parameter's DTensor placements and take one training step,
whose updated parameters the test compares with a single-process step.

The model mirrors `shardlab.models.transformer` (llama family): `embed`, `layers.{i}` with
`attn_norm`, `attn.{q,k,v,o}_proj`, `mlp_norm`, `mlp.{gate,up,down}_proj`, then
`final_norm` and `lm_head`; nn.Linear weights are [out, in] (torch's layout). Attention
infers its local head count from the projection's width (`view(b, s, -1, head_dim)`), as
tensor parallelism needs.
"""

from __future__ import annotations

import types
from dataclasses import dataclass
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
    cos = torch.cat([angles.cos(), angles.cos()], -1)[None, :, None, :]
    sin = torch.cat([angles.sin(), angles.sin()], -1)[None, :, None, :]
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


def step(model: nn.Module, tokens: torch.Tensor, labels: torch.Tensor, opt: str, lr: float
         ) -> float:  # fmt: skip
    """One training step: mean cross-entropy, backward, the plan's optimizer."""
    params = list(model.parameters())
    optimizer = (
        torch.optim.AdamW(params, lr=lr) if opt == "adamw" else torch.optim.SGD(params, lr=lr)
    )
    logits = model(tokens)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))
    loss.backward()
    optimizer.step()
    return float(loss.detach())


def reference(cfg: TinyConfig, opt: str, lr: float) -> tuple[float, dict[str, Any]]:
    """The single-process step: its loss and every updated parameter."""
    model = build(cfg)
    loss = step(model, *batch(cfg), opt, lr)
    return loss, {n: p.detach().numpy().copy() for n, p in model.named_parameters()}


def _placement_text(p: Any) -> str:
    from torch.distributed.tensor import Replicate

    if isinstance(p, Replicate):
        return "R"
    dim = getattr(p, "dim", None)  # Shard, and FSDP's _StridedShard under tensor parallelism
    return f"S({dim})" if isinstance(dim, int) else str(p)


def rank_job(proc: int, common: dict[str, Any], mine: Any) -> dict[str, Any]:
    """Apply the generated module to the model on this rank; its placements and its step.

    `common`: source (the generated module), cfg, optimizer, lr, batch_axes (the mesh axes
    that split the batch, in mesh order)."""
    from torch.distributed.tensor import DTensor

    cfg: TinyConfig = common["cfg"]
    module = types.ModuleType("shardlab_export_under_test")
    exec(compile(common["source"], "<export>", "exec"), module.__dict__)
    mesh = module.build_mesh("cpu")
    model = module.parallelize(build(cfg), mesh)
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
    tokens, labels = batch(cfg)
    index, count = 0, 1
    for axis in common["batch_axes"]:
        size = mesh[axis].size()
        index, count = index * size + mesh[axis].get_local_rank(), count * size
    rows = slice(index * cfg.batch // count, (index + 1) * cfg.batch // count)
    loss = step(model, tokens[rows], labels[rows], common["optimizer"], common["lr"])
    full = {}
    for name, p in model.named_parameters():
        value = p.full_tensor() if isinstance(p, DTensor) else p
        full[name.replace(WRAPPED, "")] = value.detach().numpy().copy()
    return {"placements": placements, "loss": loss, "params": full if proc == 0 else None}
