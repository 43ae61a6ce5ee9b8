"""The named model presets and `build_model(name, overrides)`.

Published sizes: GPT-2 (Radford et al. 2019, the HF `gpt2*` configs), Llama 2 (Touvron et
al. 2023) and Llama 3 (Meta 2024). Parameter counts equal the published ones exactly.
`gpt` is the GPT of the Megatron-LM papers (Narayanan et al. 2021, Korthikanti et al. 2022)
at the GPT-3 XL size (Brown et al. 2020: 24 layers, hidden 2048, 16 heads): vocab 51200,
seq 2048, dropout 0.1, tied embeddings; its parameter count is Narayanan et al.'s eq. 2,
12lh^2 (1 + 13/(12h) + (V + s)/(12lh)), plus the final LayerNorm's 2h that eq. 2 leaves out.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from shardlab.errors import PresetError
from shardlab.ir import Graph
from shardlab.models.config import MlpDemoConfig, ModelConfig, TransformerConfig, apply_overrides
from shardlab.models.mlp_demo import build_mlp_demo
from shardlab.models.transformer import build_transformer


@dataclass(frozen=True, slots=True)
class Preset:
    """A named model: its default config and a one-line description."""

    name: str
    description: str
    config: ModelConfig

    def build(self, overrides: Mapping[str, Any] | None = None) -> Graph:
        cfg = apply_overrides(self.config, overrides or {}, self.name)
        return _BUILDERS[type(cfg)](cfg, self.name)


_BUILDERS: dict[type, Callable[[Any, str], Graph]] = {
    TransformerConfig: build_transformer,
    MlpDemoConfig: build_mlp_demo,
}


def _gpt2(layers: int, hidden: int, heads: int) -> TransformerConfig:
    return TransformerConfig(
        family="gpt2", layers=layers, hidden=hidden, heads=heads, kv_heads=heads,
        ffn=4 * hidden, vocab=50257, seq=1024, batch=8, max_positions=1024, tie_embeddings=True,
    )  # fmt: skip


def _gpt(layers: int, hidden: int, heads: int) -> TransformerConfig:
    return TransformerConfig(
        family="gpt", layers=layers, hidden=hidden, heads=heads, kv_heads=heads,
        ffn=4 * hidden, vocab=51200, seq=2048, batch=8, dropout=0.1, attention="flash",
        tie_embeddings=True,
    )  # fmt: skip


def _llama(
    layers: int, hidden: int, heads: int, kv_heads: int, ffn: int, vocab: int, seq: int,
    theta: float,
) -> TransformerConfig:  # fmt: skip
    return TransformerConfig(
        family="llama", layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads, ffn=ffn,
        vocab=vocab, seq=seq, batch=8, norm_eps=1e-5, rope_theta=theta,
    )  # fmt: skip


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in [
        Preset("mlp_demo", "two matmuls + MSE loss (seed 003 demo net)", MlpDemoConfig()),
        Preset("gpt2", "GPT-2 small, 124M", _gpt2(12, 768, 12)),
        Preset("gpt2-medium", "GPT-2 medium, 355M", _gpt2(24, 1024, 16)),
        Preset("gpt2-large", "GPT-2 large, 774M", _gpt2(36, 1280, 20)),
        Preset("gpt2-xl", "GPT-2 XL, 1.5B", _gpt2(48, 1600, 25)),
        Preset("gpt", "Megatron-LM GPT (GPT-3 XL size, 1.3B), dropout 0.1", _gpt(24, 2048, 16)),
        Preset("llama2-7b", "Llama 2 7B", _llama(32, 4096, 32, 32, 11008, 32000, 4096, 1e4)),
        Preset("llama2-13b", "Llama 2 13B", _llama(40, 5120, 40, 40, 13824, 32000, 4096, 1e4)),
        Preset("llama2-70b", "Llama 2 70B, GQA", _llama(80, 8192, 64, 8, 28672, 32000, 4096, 1e4)),
        Preset("llama3-8b", "Llama 3 8B, GQA", _llama(32, 4096, 32, 8, 14336, 128256, 8192, 5e5)),
        Preset("llama3-70b", "Llama 3 70B, GQA", _llama(80, 8192, 64, 8, 28672, 128256, 8192, 5e5)),
    ]
}


def get_preset(name: str) -> Preset:
    try:
        return PRESETS[name]
    except KeyError:
        raise PresetError(
            f"unknown model preset {name!r}; known presets: {', '.join(PRESETS)}", preset=name
        ) from None


def build_model(name: str, overrides: Mapping[str, Any] | None = None) -> Graph:
    """The forward graph of preset `name` with `overrides` (field -> value) applied."""
    return get_preset(name).build(overrides)
