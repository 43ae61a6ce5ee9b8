"""Fixtures several engine test modules share."""

from __future__ import annotations

import pytest

from shardlab.ir import Graph
from shardlab.models import build_model

#: GPT-3 175B layer sizes (Korthikanti et al. 2022), one sequence.
H, A, S, B = 12288, 96, 2048, 1
#: One 16-bit [s, b, h] tensor is 2 SBH bytes.
SBH = S * B * H


@pytest.fixture(scope="session")
def gpt3_layers() -> Graph:
    """Two GPT-3-sized gpt blocks, bf16, eager attention, dropout 0.1 (vocab 512)."""
    return build_model("gpt", {"layers": 2, "hidden": H, "heads": A, "vocab": 512, "seq": S,
                               "batch": B, "attention": "eager", "dtype": "bfloat16"})  # fmt: skip
