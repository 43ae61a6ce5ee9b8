"""The demo net of seed 003: two matmuls and an MSE loss, the smallest DP/MP testbed.

`loss = mse(x @ w0 @ w1, label)` with x[batch, hidden], w0[hidden, hidden],
w1[hidden, classes]. Value names (`x`, `label`, `w0`, `w1`) are stable so that strategies
can annotate them directly, e.g. `w0=S(1)`, `w1=S(0)` for the model-parallel variant.
"""

from __future__ import annotations

import dataclasses

from shardlab.ir import Graph, OpRole
from shardlab.models.builder import GraphBuilder
from shardlab.models.config import MlpDemoConfig


def build_mlp_demo(cfg: MlpDemoConfig, name: str = "mlp_demo") -> Graph:
    """Forward graph of the demo net, ending in the scalar loss."""
    cfg.check()
    b = GraphBuilder(name, meta={"preset": name, "config": dataclasses.asdict(cfg)})
    x = b.input("x", (cfg.batch, cfg.hidden), cfg.dtype)
    label = b.input("label", (cfg.batch, cfg.classes), cfg.dtype)
    w0 = b.param("w0", (cfg.hidden, cfg.hidden), cfg.dtype)
    w1 = b.param("w1", (cfg.hidden, cfg.classes), cfg.dtype)
    y = b.op("matmul", [x, w0], "y")
    z = b.op("matmul", [y, w1], "z")
    loss = b.op("mse_loss", [z, label], "loss", role=OpRole.LOSS)
    return b.build([loss])
