"""Importers: models from outside Shardlab as forward graphs (`shardlab.ir.Graph`).

- `torch_export.graph_from_module(module, example_inputs, name=...)`: a PyTorch module (on
  the meta device: no weights, no memory) captured with `torch.export` and its ATen ops
  mapped to catalog ops (`aten_ops`); parameters keep their PyTorch names and layouts.
- `hf_config.graph_from_hf_config(config, batch=..., seq=...)`: a Hugging Face `config.json`
  built with `transformers` on the meta device and imported as above, with a next-token
  cross-entropy loss.

torch and transformers are imported only inside these modules' functions, so
`import shardlab` (and this package) never imports them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from shardlab.ir import Graph

__all__ = ["graph_from_hf_config", "graph_from_module"]


def graph_from_module(module: Any, example_inputs: Any, *, name: str = "imported") -> Graph:
    """`torch_export.graph_from_module` (imports torch when called)."""
    from shardlab.importers.torch_export import graph_from_module as impl

    return impl(module, example_inputs, name=name)


def graph_from_hf_config(
    config: Any, *, batch: int = 1, seq: int | None = None, name: str | None = None
) -> Graph:
    """`hf_config.graph_from_hf_config` (imports torch and transformers when called)."""
    from shardlab.importers.hf_config import graph_from_hf_config as impl

    return impl(config, batch=batch, seq=seq, name=name)
