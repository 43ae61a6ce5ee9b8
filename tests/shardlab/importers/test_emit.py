"""Rotary tables as full-size models make them (long, bf16) are recognised as `rope_cache`
with the config's theta, not left as opaque constants."""

from __future__ import annotations

import numpy as np
import pytest

from shardlab.importers.emit import _rope_table

torch = pytest.importorskip("torch")


def hf_rope_table(seq: int, dim: int, theta: float, dtype: torch.dtype) -> np.ndarray:
    """cos and sin [1, 1, seq, dim] as Hugging Face's Llama makes them (float32 angles,
    then cast to the activations' dtype)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    angles = torch.arange(seq, dtype=torch.float32)[:, None] * inv_freq[None, :]
    emb = torch.cat([angles, angles], dim=-1)
    return emb.cos().to(dtype)[None, None], emb.sin().to(dtype)[None, None]


@pytest.mark.parametrize(
    ("seq", "theta", "dtype", "name"),
    [
        (8192, 500000.0, torch.bfloat16, "bfloat16"),  # Llama 3 8B at its full context
        (4096, 10000.0, torch.bfloat16, "bfloat16"),  # Llama 2
        (32768, 1000000.0, torch.float32, "float32"),  # Qwen2 / Mistral-style long context
        (16, 10000.0, torch.float32, "float32"),
    ],
)
def test_long_and_bf16_rotary_tables_give_back_the_configs_theta(
    seq: int, theta: float, dtype: torch.dtype, name: str
) -> None:
    cos, sin = hf_rope_table(seq, 128, theta, dtype)
    assert _rope_table(cos.float().numpy(), name) == ("cos", theta)
    assert _rope_table(sin.float().numpy(), name) == ("sin", theta)


def test_a_table_that_is_not_rotary_is_not_taken_for_one() -> None:
    cos, _ = hf_rope_table(512, 64, 10000.0, torch.float32)
    bent = cos.clone()
    bent[..., 300, 5] += 0.05  # one position off by more than any rounding
    bent[..., 300, 37] += 0.05
    assert _rope_table(bent.numpy(), "float32") is None
